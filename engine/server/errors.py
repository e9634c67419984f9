"""OpenAI's error body and the handlers that map every failure to it with the right status."""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

log = logging.getLogger("engine.server")

_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
    503: "server_error",
}


class APIError(Exception):
    def __init__(
        self,
        status: int,
        message: str,
        *,
        code: str | None = None,
        param: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.code, self.param = status, message, code, param
        self.headers = headers or {}


ANTHROPIC_PATHS = "/v1/messages"  # routes whose errors take Anthropic's shape (server/messages.py)
_ANTHROPIC_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
}


def error_body(status: int, message: str, code: str | None = None, param: str | None = None, path: str = "") -> dict:
    """OpenAI's error body, or Anthropic's (`{"type": "error", "error": {"type", "message"}}`, with the same code
    beside them) on the Messages routes."""
    if path.startswith(ANTHROPIC_PATHS):
        kind = _ANTHROPIC_TYPES.get(status, "api_error")
        return {"type": "error", "error": {"type": kind, "message": message, "code": code}}
    return {"error": {"message": message, "type": _TYPES.get(status, "server_error"), "param": param, "code": code}}


def error_response(
    status: int,
    message: str,
    code: str | None = None,
    param: str | None = None,
    headers: dict[str, str] | None = None,
    path: str = "",
) -> JSONResponse:
    return JSONResponse(error_body(status, message, code, param, path), status_code=status, headers=headers)


def bad_request(message: str, param: str | None = None, code: str | None = None) -> APIError:
    return APIError(400, message, param=param, code=code)


def _describe(exc: RequestValidationError) -> tuple[str, str | None]:
    errors = exc.errors()
    if not errors:
        return "the request body is not valid", None
    first = errors[0]
    if first.get("type") == "json_invalid":
        return "the request body is not JSON", None
    loc = [str(p) for p in first.get("loc", ()) if p != "body"]
    if first.get("type") == "invalid_unicode":
        where = (first.get("ctx") or {}).get("where", "body")
        return str(first.get("msg")), where.split(".")[0]
    if not loc and first.get("type") in ("model_attributes_type", "dict_type", "missing"):
        return "the request body must be a JSON object", None
    # a value matching no alternative of a union gets an error per alternative: the deepest one names the problem
    # (e.g. a content part's unknown type rather than "content is not a string")
    first = max(errors, key=lambda e: len(e.get("loc", ())))
    loc = [str(p) for p in first.get("loc", ()) if p != "body"]
    where = ".".join(loc) or "body"
    more = f" (and {len(errors) - 1} more problems)" if len(errors) > 1 else ""
    return f"{where}: {first.get('msg', 'invalid value')}{more}", (loc[0] if loc else None)


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(APIError)
    async def _api_error(request: Request, exc: APIError) -> JSONResponse:
        return error_response(exc.status, exc.message, exc.code, exc.param, exc.headers, request.url.path)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        message, param = _describe(exc)
        return error_response(400, message, "invalid_value", param, path=request.url.path)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        message = "not found" if exc.status_code == 404 else str(exc.detail)
        return error_response(exc.status_code, message, headers=getattr(exc, "headers", None), path=request.url.path)

    @app.exception_handler(Exception)
    async def _crash(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error")
        return error_response(500, f"internal error: {type(exc).__name__}", path=request.url.path)
