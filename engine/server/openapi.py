"""The published OpenAPI document, made to say what the server really answers.

FastAPI documents a 422 for every body it validates and only `application/json` replies. This server answers
invalid bodies with 400 in OpenAI's error body (Anthropic's on /v1/messages; server/errors.py), streams SSE when `stream` is true, refuses a
missing API key with 401, an oversized body with 413, a full queue with 429 and a stopped engine with 503. The
paths are rewritten here once, so clients and schemathesis' conformance checks see the truth. A server without
--vision 1 publishes no image parts (it refuses them)."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

ERROR_SCHEMA = {
    "type": "object",
    "required": ["error"],
    "properties": {
        "error": {
            "type": "object",
            "required": ["message", "type"],
            "properties": {
                "message": {"type": "string"},
                "type": {"type": "string"},
                "param": {"type": ["string", "null"]},
                "code": {"type": ["string", "null"]},
            },
        }
    },
}
ANTHROPIC_ERROR_SCHEMA = {
    "type": "object",
    "required": ["type", "error"],
    "properties": {
        "type": {"type": "string"},
        "error": {
            "type": "object",
            "required": ["type", "message"],
            "properties": {
                "type": {"type": "string"},
                "message": {"type": "string"},
                "code": {"type": ["string", "null"]},
            },
        },
    },
}
GENERATING = {"/v1/chat/completions", "/v1/completions", "/v1/messages", "/v1/responses"}  # may stream / queue
OPEN = {"/health"}  # no API key asked
WHY = {
    "400": "invalid request (OpenAI error body)",
    "401": "a valid API key is required",
    "404": "not found",
    "413": "the body exceeds the size limit",
    "429": "at capacity: every lane busy and the queue full (Retry-After says when to retry)",
    "503": "the engine is not serving (a rank stopped, or the server is shutting down)",
}


def _error(code: str, path: str) -> dict[str, Any]:
    schema = "AnthropicError" if path.startswith("/v1/messages") else "Error"
    response: dict[str, Any] = {
        "description": WHY[code],
        "content": {"application/json": {"schema": {"$ref": f"#/components/schemas/{schema}"}}},
    }
    if code == "429":
        response["headers"] = {"Retry-After": {"schema": {"type": "string"}, "description": "seconds"}}
    return response


def _statuses(path: str, method: str, op: dict[str, Any]) -> list[str]:
    codes = [] if path in OPEN else ["401"]
    if method == "post":
        codes += ["400", "404", "413"]  # 404: a `model` this server does not serve
    if "parameters" in op:
        codes += ["400", "404"]
    if path in GENERATING:
        codes += ["404", "429", "503"]
    if path == "/health":
        codes.append("503")
    return codes


def _rewrite(path: str, method: str, op: dict[str, Any]) -> None:
    responses = op["responses"]
    responses.pop("422", None)
    for code in _statuses(path, method, op):
        responses[code] = _error(code, path)
    if path in GENERATING:
        responses["200"]["description"] = "the reply; with `stream: true` a text/event-stream of `data:` events"
        responses["200"]["content"]["text/event-stream"] = {"schema": {}}  # each event: a JSON chunk or [DONE]
    if path == "/health":
        responses["503"]["content"]["application/json"]["schema"] = {"type": "object"}
    if path == "/metrics":
        responses["200"]["content"] = {"text/plain": {"schema": {"type": "string"}}}


def _bound_token_ids(components: dict[str, Any], vocab: int) -> None:
    """Token ids in bodies stop at the served vocabulary (a larger one is refused with a 400)."""
    lists = [components["DetokenizeRequest"]["properties"]["tokens"]]
    lists += [
        alt for alt in components["CompletionRequest"]["properties"]["prompt"]["anyOf"] if alt.get("type") == "array"
    ]
    for array in lists:
        array["items"]["maximum"] = vocab - 1


# the image and video request parts, and what only they use: left out of the document of a server without --vision 1
IMAGE_SCHEMAS = (
    "ImagePart",
    "ImageBlock",
    "InputImagePart",
    "ImageURL",
    "Base64Source",
    "URLSource",
    "VideoPart",
    "VideoURL",
)


def _drop_schemas(node: Any, names: tuple[str, ...]) -> None:
    """Every reference to the named components removed from the unions (oneOf / anyOf) and discriminator mappings
    that offer them, anywhere in the document."""
    if isinstance(node, list):
        for value in node:
            _drop_schemas(value, names)
        return
    if not isinstance(node, dict):
        return
    for key in ("oneOf", "anyOf"):
        if key in node:
            node[key] = [alt for alt in node[key] if str(alt.get("$ref", "")).rsplit("/", 1)[-1] not in names]
    mapping = (node.get("discriminator") or {}).get("mapping") or {}
    for tag in [tag for tag, ref in mapping.items() if ref.rsplit("/", 1)[-1] in names]:
        del mapping[tag]
    for value in node.values():
        _drop_schemas(value, names)


def install_openapi(app: FastAPI) -> None:
    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = get_openapi(title=app.title, version=app.version, routes=app.routes)
            for path, operations in schema["paths"].items():
                for method, op in operations.items():
                    _rewrite(path, method, op)
            components = schema.setdefault("components", {}).setdefault("schemas", {})
            _bound_token_ids(components, app.state.server.vocab_size)
            components["Error"] = ERROR_SCHEMA
            components["AnthropicError"] = ANTHROPIC_ERROR_SCHEMA
            for unused in ("HTTPValidationError", "ValidationError"):
                components.pop(unused, None)
            if app.state.server.vision is None:  # images are refused: the document offers none
                _drop_schemas(schema, IMAGE_SCHEMAS)
                for name in IMAGE_SCHEMAS:
                    components.pop(name, None)
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
