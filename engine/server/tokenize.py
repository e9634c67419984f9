"""POST /tokenize and /detokenize (also under /v1/): a prompt or chat messages to token ids, and back."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from starlette.concurrency import run_in_threadpool

from engine.server.chat import render
from engine.server.common import server_state
from engine.server.errors import APIError, bad_request
from engine.server.protocol import DetokenizeRequest, TokenizeRequest

router = APIRouter()


@router.post("/tokenize")
@router.post("/v1/tokenize", include_in_schema=False)
async def tokenize(body: TokenizeRequest, request: Request) -> dict[str, Any]:
    state = server_state(request)
    if body.model is not None and body.model != state.name:
        raise APIError(
            404,
            f"model {body.model!r} is not served here; this server serves {state.name!r}",
            code="model_not_found",
            param="model",
        )
    if (body.prompt is None) == (body.messages is None):
        raise bad_request("/tokenize takes a JSON body with messages or prompt (exactly one)")
    if body.messages is not None:
        text = await run_in_threadpool(
            render,
            state.template,
            body.messages,
            body.tools,
            state.thinking,
            body.reasoning_effort,
            body.chat_template_kwargs,
            add_generation_prompt=body.add_generation_prompt is not False,
        )
        encoding = await run_in_threadpool(state.tokenizer.encode, text, add_special_tokens=False)
    else:
        encoding = await run_in_threadpool(
            state.tokenizer.encode, body.prompt, add_special_tokens=body.add_special_tokens is not False
        )
    out: dict[str, Any] = {"count": len(encoding.ids), "tokens": list(encoding.ids), "max_model_len": state.context}
    if body.return_token_strs:
        out["token_strs"] = list(encoding.tokens)
    return out


@router.post("/detokenize")
@router.post("/v1/detokenize", include_in_schema=False)
async def detokenize(body: DetokenizeRequest, request: Request) -> dict[str, Any]:
    state = server_state(request)
    bad = [t for t in body.tokens if t >= state.vocab_size]
    if bad:
        raise bad_request(f"token id {bad[0]} is outside the vocabulary (0..{state.vocab_size - 1})", "tokens")
    return {"prompt": state.tokenizer.decode(body.tokens, skip_special_tokens=False)}
