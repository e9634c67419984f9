"""The smoke test: one short chat request through rank 0 (and so through every rank's share of the model).

Loading can succeed while the model is still broken (wrong shards, a bad reduction): such a model tends to answer
nothing, or one character over and over. Either fails the test.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import httpx

from recipe.errors import LaunchError

PROMPT = "Reply with OK."


@dataclass(frozen=True)
class SmokeResult:
    text: str
    completion_tokens: int
    seconds: float


def is_collapsed(text: str) -> bool:
    """Empty, or one character repeated (at least four times, so a plain "K" or "OK" passes)."""
    stripped = "".join(text.split())
    return not stripped or (len(stripped) >= 4 and len(set(stripped)) == 1)


def smoke_test(
    api_url: str, model: str, api_key: str = "", timeout_s: float = 180.0, max_tokens: int = 16
) -> SmokeResult:
    """POST /v1/chat/completions with a fixed prompt; raises LaunchError on no reply or a collapsed one."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    body = {
        "model": model,
        "messages": [{"role": "user", "content": PROMPT}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "chat_template_kwargs": {"enable_thinking": False},
    }
    started = time.monotonic()
    try:
        reply = httpx.post(f"{api_url}/chat/completions", json=body, headers=headers, timeout=timeout_s)
    except httpx.HTTPError as exc:
        raise LaunchError(
            f"the smoke test request to {api_url} failed: {exc}",
            "the ranks are still running; read their last log lines above",
        ) from None
    seconds = time.monotonic() - started
    if reply.status_code != 200:
        raise LaunchError(
            f"the smoke test got HTTP {reply.status_code}: {reply.text[:200]}",
            "the ranks are still running; read their last log lines above",
        )
    text, tokens = _content(reply)
    if is_collapsed(text):
        raise LaunchError(
            f"the smoke test reply is {'empty' if not text.strip() else 'collapsed'}: {text[:40]!r}",
            "the weights loaded but the model does not answer; read every rank's last log lines above",
        )
    return SmokeResult(text=text, completion_tokens=tokens, seconds=seconds)


def _content(reply: httpx.Response) -> tuple[str, int]:
    try:
        data = reply.json()
        text = data["choices"][0]["message"].get("content") or ""
        tokens = int((data.get("usage") or {}).get("completion_tokens") or 0)
    except (ValueError, KeyError, IndexError, TypeError, AttributeError):
        raise LaunchError(
            f"the smoke test reply is not a chat completion: {reply.text[:200]}",
            "the ranks are still running; read their last log lines above",
        ) from None
    return text, tokens
