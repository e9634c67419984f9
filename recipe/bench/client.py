"""The bench's HTTP side: one streamed chat completion at a time per thread, over one httpx connection pool, each
stamped as its deltas arrive. Every request is bounded by the request timeout; nothing here prints."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

import httpx

from recipe.errors import RecipeError

MAX_CONNECTIONS = 66


@dataclass(frozen=True)
class RequestTiming:
    """One streamed request: perf_counter stamps (seconds) and the server's usage counts."""

    sent: float
    first_token: float
    last_token: float
    done: float
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int

    @property
    def ttft_s(self) -> float:
        return self.first_token - self.sent

    @property
    def decode_tok_s(self) -> float | None:
        span = self.last_token - self.first_token
        return (self.completion_tokens - 1) / span if self.completion_tokens > 1 and span > 0 else None

    def to_dict(self) -> dict[str, Any]:
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "cached_tokens": self.cached_tokens,
            "ttft_s": round(self.ttft_s, 4),
            "decode_tok_s": _round(self.decode_tok_s),
            "total_s": round(self.done - self.sent, 4),
        }


class BenchClient:
    """httpx over one connection pool; every request bounded by `request_timeout_s`, the whole bench by
    `deadline` (time.monotonic). `root` is the server's root (/health), `url` its API base (/v1)."""

    def __init__(
        self, url: str, model: str, api_key: str, seed: int, request_timeout_s: float, deadline: float
    ) -> None:
        self.url, self.root, self.model, self.seed = url, url.removesuffix("/v1"), model, seed
        self.request_timeout_s, self.deadline = request_timeout_s, deadline
        self.completion_tokens = 0  # what this client's requests got, for the cross-check
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.http = httpx.Client(
            headers=headers,
            timeout=httpx.Timeout(request_timeout_s, connect=10.0),
            limits=httpx.Limits(max_connections=MAX_CONNECTIONS),
        )

    def __enter__(self) -> BenchClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.http.close()

    def out_of_time(self) -> bool:
        return time.monotonic() > self.deadline

    def _get(self, url: str) -> httpx.Response:
        try:
            return self.http.get(url)
        except httpx.HTTPError as exc:
            raise RecipeError(
                f"no answer from {url}: {exc}", "start the server (./start.sh) or point --url at a running one"
            ) from None

    def server_facts(self) -> dict[str, Any]:
        """GET /health as JSON; {} from servers whose /health is not this engine's."""
        reply = self._get(self.root + "/health")
        try:
            body = reply.json()
        except ValueError:
            return {}
        if not isinstance(body, dict):
            return {}
        if reply.status_code != 200 or body.get("ok") is False:
            raise RecipeError(
                f"{self.root}/health answers {reply.status_code}: {body.get('error', body)}",
                "the server is not serving: read its logs (sparks status), restart it",
            )
        return body

    def completion_total(self, at_least: int, within_s: float = 3.0) -> int | None:
        """The server's completion-token total; /health is refreshed once per engine step, so wait (bounded)
        until it has counted at least what this client got."""
        deadline = time.monotonic() + within_s
        while True:
            total = (self.server_facts().get("totals") or {}).get("completion_tokens")
            if total is None or total >= at_least or time.monotonic() > deadline:
                return total
            time.sleep(0.1)

    def check_model(self) -> None:
        reply = self._get(self.url + "/models")
        _raise_for_status(reply, self.url + "/models")
        served = [m.get("id") for m in reply.json().get("data", [])]
        if self.model not in served:
            raise RecipeError(
                f"the server serves {served}, not {self.model!r}",
                f"pass --model {served[0]}" if served else "check --url",
            )

    def stream_chat(self, content: str, max_tokens: int, system: str | None = None) -> RequestTiming:
        messages = [{"role": "system", "content": system}] if system is not None else []
        body = {
            "model": self.model,
            "messages": [*messages, {"role": "user", "content": content}],
            "max_tokens": max_tokens,
            "temperature": 0,
            "seed": self.seed,
            "ignore_eos": True,
            "stream": True,
            "stream_options": {"include_usage": True},
            "chat_template_kwargs": {"enable_thinking": False},
        }
        url = self.url + "/chat/completions"
        sent = time.perf_counter()
        stop_at = sent + self.request_timeout_s
        try:
            with self.http.stream("POST", url, json=body) as reply:
                if reply.status_code != 200:
                    reply.read()
                    _raise_for_status(reply, url)
                first, last, usage = _read_stream(reply, stop_at, url)
        except httpx.HTTPError as exc:
            raise RecipeError(
                f"the request to {url} failed: {type(exc).__name__}: {exc}",
                "is the server still up (sparks status)? raise --timeout if it is slow",
            ) from None
        done = time.perf_counter()
        if first is None or usage is None:
            raise RecipeError(
                f"{url} streamed no {'token' if first is None else 'usage'}",
                "the server must stream deltas and usage (stream_options.include_usage)",
            )
        tokens = int(usage.get("completion_tokens") or 0)
        self.completion_tokens += tokens
        cached = int((usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0)
        return RequestTiming(sent, first, last or first, done, int(usage.get("prompt_tokens") or 0), tokens, cached)


def _read_stream(reply: httpx.Response, stop_at: float, url: str) -> tuple[float | None, float | None, dict | None]:
    """(first token, last token, usage) of an SSE chat stream: times of deltas with reasoning, content or tool-call
    text, or of the closing chunk."""
    first = last = usage = None
    for line in reply.iter_lines():
        if time.perf_counter() > stop_at:
            raise RecipeError(f"a request to {url} ran past --timeout", "raise --timeout or lower --tokens")
        if not line.startswith("data:"):
            continue  # keep-alive comments, blank separators
        payload = line[5:].strip()
        if payload == "[DONE]":
            break
        chunk = json.loads(payload)
        if "error" in chunk:
            raise RecipeError(f"{url} failed mid-stream: {chunk['error']}", "read the server's log")
        now = time.perf_counter()
        for choice in chunk.get("choices") or []:
            delta = choice.get("delta") or {}
            # The closing chunk counts too: a token with no text of its own (held back, or a special token)
            # still ends the reply there.
            if choice.get("finish_reason") or any(
                delta.get(k) for k in ("content", "reasoning_content", "reasoning", "tool_calls")
            ):
                first = first if first is not None else now
                last = now
        usage = chunk.get("usage") or usage
    return first, last, usage


def _raise_for_status(reply: httpx.Response, url: str) -> None:
    if reply.status_code == 200:
        return
    fixes = {
        401: "pass --api-key (or set API_KEY)",
        404: "check --url (it should end in /v1)",
        429: "the server's queue is full: lower --concurrency to the server's PARALLEL",
        400: "lower --tokens or --prompt-sizes to fit the server's window",
    }
    raise RecipeError(
        f"{url} answered HTTP {reply.status_code}: {reply.text[:300]}",
        fixes.get(reply.status_code, "read the server's log"),
    )


def _round(value: float | None, digits: int = 2) -> float | None:
    return None if value is None else round(value, digits)
