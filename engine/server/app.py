"""The FastAPI application on rank 0: routes, the body-size limit, the optional API key, OpenAI error bodies."""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import FastAPI

from engine.server import chat_completions, completions, health, messages, metrics, models, responses, tokenize
from engine.server.errors import error_body, install_error_handlers
from engine.server.openapi import install_openapi
from engine.server.state import ServerState

OPEN_PATHS = {"/health", "/v1/health"}

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]


def create_app(state: ServerState) -> FastAPI:
    app = FastAPI(title="glm-sparks engine", version="0.1.0")
    app.state.server = state
    for module in (chat_completions, completions, messages, responses, models, tokenize, health, metrics):
        app.include_router(module.router)
    install_error_handlers(app)
    install_openapi(app)
    app.add_middleware(GuardMiddleware, state=state)
    return app


async def _reply(
    send: Send,
    status: int,
    message: str,
    headers: list[tuple[bytes, bytes]] | None = None,
    code: str | None = None,
    path: str = "",
) -> None:
    payload = json.dumps(error_body(status, message, code, path=path)).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(payload)).encode()),
                *(headers or []),
            ],
        }
    )
    await send({"type": "http.response.body", "body": payload})


class GuardMiddleware:
    """Pure ASGI (streams pass through untouched): API key check, then a body-size limit enforced on the
    declared length and on the bytes actually received."""

    def __init__(self, app: Any, state: ServerState) -> None:
        self.app, self.state = app, state
        self.key_digest = hashlib.sha256(state.api_key.encode()).digest() if state.api_key else None

    def _authorised(self, scope: Scope) -> bool:
        if self.key_digest is None or scope.get("path") in OPEN_PATHS:
            return True
        headers = dict(scope.get("headers") or [])
        given = headers.get(b"x-api-key", b"")
        auth = headers.get(b"authorization", b"")
        if auth[:7].lower() == b"bearer ":
            given = auth[7:].strip()
        return hmac.compare_digest(hashlib.sha256(given).digest(), self.key_digest)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if not self._authorised(scope):
            await _reply(
                send,
                401,
                "a valid API key is required (Authorization: Bearer KEY or x-api-key: KEY)",
                [(b"www-authenticate", b"Bearer")],
                code="invalid_api_key",
                path=scope.get("path", ""),
            )
            return
        limit = self.state.body_limit
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            await _reply(
                send, 413, f"the request body exceeds the {limit}-byte limit", code="body_too_large", path=scope["path"]
            )
            return
        buffer, more = bytearray(), True
        while more:  # read the whole body up front so an oversized chunked body is refused before any handler
            message = await receive()
            if message["type"] != "http.request":
                return
            buffer += message.get("body", b"")  # a bytearray grows in place: no copy per chunk
            more = message.get("more_body", False)
            if len(buffer) > limit:
                await _reply(
                    send,
                    413,
                    f"the request body exceeds the {limit}-byte limit",
                    code="body_too_large",
                    path=scope["path"],
                )
                return
        body, replayed = bytes(buffer), False

        async def replay() -> dict[str, Any]:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)
