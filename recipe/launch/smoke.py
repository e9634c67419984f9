"""The smoke test: one short chat request through rank 0 (and so through every rank's share of the model); with
images on (/health's `vision`), one more with a small image, through the vision tower.

Loading can succeed while the model is still broken (wrong shards, a bad reduction): such a model tends to answer
nothing, or one character over and over. Either fails the test. The image request must be answered (a 200 with a
reply); what a model says about a test pattern is not checked.
"""

from __future__ import annotations

import base64
import struct
import time
import zlib
from dataclasses import dataclass
from typing import Any

import httpx

from recipe.errors import LaunchError

PROMPT = "Reply with OK."
RUNNING = "the ranks are still running; read their last log lines above"


@dataclass(frozen=True)
class SmokeResult:
    text: str
    completion_tokens: int
    seconds: float
    image_seconds: float | None = None  # the image request's time (None: images are off)


def sample_png(width: int = 48, height: int = 32) -> bytes:
    """A small RGB gradient as PNG bytes, written with the standard library (the recipe has no image library)."""
    rows = b"".join(
        b"\0" + bytes(v for x in range(width) for v in (x * 255 // width, y * 255 // height, 128))
        for y in range(height)
    )

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b"")


def smoke_image(api_url: str, model: str, api_key: str = "", timeout_s: float = 180.0) -> float:
    """POST one chat request holding a small image (a data: URL); its seconds, or LaunchError when not answered."""
    url = "data:image/png;base64," + base64.b64encode(sample_png()).decode()
    content = [{"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": "What is in the image?"}]
    fix = "text requests are answered but images are not: read rank 0's log (its vision tower), or write VISION=0"
    reply, seconds = _ask(api_url, model, content, 8, api_key, timeout_s, "the smoke test's image request", fix)
    _content(reply)
    return seconds


def _ask(
    api_url: str, model: str, content: Any, max_tokens: int, api_key: str, timeout_s: float, what: str, fix: str
) -> tuple[httpx.Response, float]:
    """One greedy chat request without thinking: the 200 reply and its seconds; LaunchError naming `what` on no
    answer, or on another status (with `fix`)."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    body = {
        "model": model,
        "messages": [{"role": "user", "content": content}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "chat_template_kwargs": {"enable_thinking": False},
    }
    started = time.monotonic()
    try:
        reply = httpx.post(f"{api_url}/chat/completions", json=body, headers=headers, timeout=timeout_s)
    except httpx.HTTPError as exc:
        raise LaunchError(f"{what} to {api_url} failed: {exc}", RUNNING) from None
    seconds = time.monotonic() - started
    if reply.status_code != 200:
        raise LaunchError(f"{what} got HTTP {reply.status_code}: {reply.text[:200]}", fix)
    return reply, seconds


def is_collapsed(text: str) -> bool:
    """Empty, or one character repeated (at least four times, so a plain "K" or "OK" passes)."""
    stripped = "".join(text.split())
    return not stripped or (len(stripped) >= 4 and len(set(stripped)) == 1)


def smoke_test(
    api_url: str, model: str, api_key: str = "", timeout_s: float = 180.0, max_tokens: int = 16
) -> SmokeResult:
    """POST /v1/chat/completions with a fixed prompt; raises LaunchError on no reply or a collapsed one."""
    reply, seconds = _ask(api_url, model, PROMPT, max_tokens, api_key, timeout_s, "the smoke test request", RUNNING)
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
