"""GET /health: whether the engine serves, how busy it is, the pool, totals, what rank 0 holds in memory by kind. Open without an API key; 503 with the
reason once a rank has died or the engine stopped."""

from __future__ import annotations

import time
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from engine.server.common import server_state

router = APIRouter()


def _ranks(state: Any) -> list[dict[str, Any]]:
    """Each rank and the seconds since rank 0 last heard its heartbeat (rank 0 itself: 0, it is answering)."""
    silence = state.peers.silence() if state.peers is not None else {}
    return [{"rank": 0, "silent_s": 0.0}] + [{"rank": r, "silent_s": round(s, 1)} for r, s in sorted(silence.items())]


def _drafts(counts: dict[str, Any]) -> dict[str, Any]:
    """The drafter and its counts, with the two ratios people ask for: accepted / drafted tokens, and tokens
    committed per lane window (1.0 without drafts)."""
    by_drafter = {
        name: {**c, "acceptance": _ratio(c["accepted"], c["drafted"])} for name, c in counts["by_drafter"].items()
    }
    return {
        **counts,
        "acceptance": _ratio(counts["accepted"], counts["drafted"]),
        "tokens_per_step": _ratio(counts["committed"], counts["windows"]),
        "by_drafter": by_drafter,
    }


def _ratio(part: int, whole: int) -> float | None:
    return round(part / whole, 3) if whole else None


def _vision(vision: Any, memory: dict[str, Any]) -> dict[str, Any]:
    """Whether images and videos are taken, how (data URLs; https URLs too), the limits, and the tower's bytes on
    rank 0."""
    if vision is None:
        return {"enabled": False}
    return {
        "enabled": True,
        "urls": vision.urls,
        "max_images": vision.max_images,
        "max_bytes": vision.max_bytes,
        "max_pixels": vision.max_pixels,
        "max_image_tokens": vision.spec.max_tokens,
        "max_videos": vision.max_videos,
        "max_frames": vision.max_frames,
        "max_video_tokens": vision.video_spec.max_tokens,
        "tower_bytes": (memory.get("weights_bytes") or {}).get("vision", 0),
    }


def _reuse(counts: dict[str, Any]) -> dict[str, Any]:
    """The kept prompt states (how many, the pool rows and snapshot bytes they hold) and the share of looked-up
    prompt tokens that were resumed rather than prefilled."""
    if not counts["enabled"]:
        return counts
    return {**counts, "hit_rate": _ratio(counts["hits_tokens"], counts["queries_tokens"])}


@router.get("/health")
@router.get("/v1/health", include_in_schema=False)
async def health(request: Request) -> JSONResponse:
    state = server_state(request)
    stats = state.scheduler.stats()
    reason = state.trouble()
    body: dict[str, Any] = {
        "ok": reason is None,
        "model": state.name,
        "busy": stats["requests_running"] + stats["requests_waiting"] > 0,
        "requests_running": stats["requests_running"],
        "requests_waiting": stats["requests_waiting"],
        "streams": stats["streams"],
        "pool_tokens": stats["pool_tokens"],
        "pool_free_tokens": stats["pool_free_tokens"],  # kept prompt states' rows included: they give way
        "totals": stats["totals"],
        "drafts": _drafts(stats["drafts"]),
        "prompt_reuse": _reuse(stats["prompt_reuse"]),
        "context_length": state.context,
        "weights": state.weights,
        "vision": _vision(state.vision, state.memory),
        "memory": state.memory,
        "ranks": _ranks(state),
        "uptime_s": round(time.time() - state.started, 1),
    }
    if reason is not None:
        body["error"] = reason
    return JSONResponse(body, status_code=200 if reason is None else 503)
