"""Property-based fuzzing of every POST route in /openapi.json against a live 2-rank server: bodies drawn from the
published request schemas (a small JSON-schema -> hypothesis strategy translator below) and from arbitrary JSON. No answer may be a 5xx, and the server
must be idle and healthy afterwards. Bounded: a fixed number of examples per route and a wall-clock cap."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_api_live import KEY, LiveServer, demo_server, wait_idle

pytestmark = pytest.mark.slow
EXAMPLES_PER_ROUTE = 40
ROUTE_BUDGET_S = 45.0

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=8,
)


FLAGS = [
    "--vision",  # image parts fuzzed too (random URLs and bytes: every one a 400, never a 5xx)
    "1",
    "--parallel",
    "2",
    "--max-queued",
    "4",
    "--context",
    "256",
    "--max-tokens",
    "4",
    "--name",
    "demo",
    "--keepalive-s",
    "1",
]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    yield from demo_server(tmp_path_factory, FLAGS, KEY, seed=1)


def from_schema(schema: dict[str, Any], root: dict[str, Any], depth: int = 0) -> st.SearchStrategy:
    """Values mostly valid for `schema` (refs, anyOf, enum/const, object/array/string/number/integer/boolean/null),
    with extra properties sprinkled in; deep nesting falls back to small arbitrary JSON."""
    if "$ref" in schema:
        node: Any = root
        for part in schema["$ref"].lstrip("#/").split("/"):
            node = node[part]
        return from_schema(node, root, depth + 1)
    if depth > 6:
        return json_values
    if "const" in schema:
        return st.just(schema["const"])
    if "enum" in schema:
        return st.sampled_from(schema["enum"])
    for key in ("anyOf", "oneOf"):
        if key in schema:
            return st.one_of([from_schema(sub, root, depth + 1) for sub in schema[key]])
    kind = schema.get("type")
    if kind == "object" or "properties" in schema:
        props = schema.get("properties", {})
        required = set(schema.get("required", []))
        fixed = {k: from_schema(v, root, depth + 1) for k, v in props.items() if k in required}
        optional = {k: from_schema(v, root, depth + 1) for k, v in props.items() if k not in required}
        extra = st.dictionaries(st.text(max_size=6), json_values, max_size=1)
        return st.tuples(st.fixed_dictionaries(fixed, optional=optional), extra).map(lambda t: {**t[1], **t[0]})
    if kind == "array":
        items = from_schema(schema.get("items", {}), root, depth + 1)
        low = schema.get("minItems", 0)
        return st.lists(items, min_size=low, max_size=max(low, min(schema.get("maxItems", 3), 3)))
    if kind == "string":
        if "pattern" in schema:
            return st.from_regex(schema["pattern"], fullmatch=True).filter(lambda s: len(s) <= 64)
        return st.text(min_size=schema.get("minLength", 0), max_size=max(schema.get("minLength", 0), 24))
    if kind == "integer":
        return st.integers(schema.get("minimum"), schema.get("maximum"))
    if kind == "number":
        return st.floats(schema.get("minimum"), schema.get("maximum"), allow_nan=False, allow_infinity=False)
    if kind == "boolean":
        return st.booleans()
    if kind == "null":
        return st.none()
    return json_values


def _post_routes(spec: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    routes = []
    for path, ops in spec["paths"].items():
        body = ops.get("post", {}).get("requestBody", {}).get("content", {}).get("application/json")
        if body:
            routes.append((path, body["schema"]))
    return routes


def _bounded(body: Any) -> Any:
    """Keep generated replies short so the run stays bounded in time (the window check still gets exercised)."""
    if isinstance(body, dict):
        for key in ("max_tokens", "max_completion_tokens"):
            if isinstance(body.get(key), int) and not isinstance(body.get(key), bool) and body[key] > 4:
                body[key] = 4 if body[key] < 10_000 else body[key]
    return body


def test_openapi_routes_never_answer_5xx(server: LiveServer) -> None:
    with httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {KEY}"}, timeout=60) as http:
        spec = http.get("/openapi.json").json()
        routes = _post_routes(spec)
        assert {"/v1/chat/completions", "/v1/completions", "/tokenize", "/detokenize"} <= {p for p, _ in routes}
        failures: list[str] = []
        statuses: dict[int, int] = {}
        for path, schema in routes:
            deadline = time.monotonic() + ROUTE_BUDGET_S

            @settings(
                max_examples=EXAMPLES_PER_ROUTE, deadline=None, database=None, suppress_health_check=list(HealthCheck)
            )
            @given(body=st.one_of(from_schema(schema, spec), json_values))
            def probe(body: Any) -> None:
                if time.monotonic() > deadline:
                    return
                response = http.post(path, json=_bounded(body))
                statuses[response.status_code] = statuses.get(response.status_code, 0) + 1
                if response.status_code >= 500:
                    failures.append(f"{path} {response.status_code} {body!r} -> {response.text[:300]}")
                elif response.status_code != 200:
                    assert "error" in response.json(), response.text

            probe()
        print("fuzz statuses:", statuses)
        assert not failures, "\n".join(failures[:5])
        assert statuses.get(200, 0) > 0 and statuses.get(400, 0) > 0, statuses
        health = wait_idle(http, 3.0)
        assert health["ok"] and health["requests_running"] == health["requests_waiting"] == 0
