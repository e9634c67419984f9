"""GET /v1/models: the one served model."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request

from engine.server.common import server_state
from engine.server.errors import APIError

router = APIRouter()


def _card(request: Request) -> dict[str, Any]:
    state = server_state(request)
    return {
        "id": state.name,
        "object": "model",
        "created": int(state.started),
        "owned_by": "glm-sparks",
        "max_model_len": state.context,
    }


@router.get("/v1/models")
async def list_models(request: Request) -> dict[str, Any]:
    return {"object": "list", "data": [_card(request)]}


@router.get("/v1/models/{model_id:path}")
async def get_model(model_id: str, request: Request) -> dict[str, Any]:
    card = _card(request)
    if model_id != card["id"]:
        raise APIError(404, f"model {model_id!r} is not served here", code="model_not_found", param="model")
    return card
