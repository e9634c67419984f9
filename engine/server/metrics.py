"""GET /metrics: Prometheus text, under this engine's names (`sparks:`) and again under vLLM's (`vllm:`), so
dashboards built for either work. Gauges are read from the scheduler at scrape time."""

from __future__ import annotations

import time
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest

_LATENCY = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 40, 80, 160, 320, 640)


class _Twin:
    """One observation recorded under both name families."""

    def __init__(self, *metrics: Any) -> None:
        self.metrics = metrics

    def __getattr__(self, name: str) -> Any:
        def call(*args: Any, **kwargs: Any) -> None:
            for metric in self.metrics:
                getattr(metric, name)(*args, **kwargs)

        return call


class Metrics:
    def __init__(self) -> None:
        self.registry = r = CollectorRegistry()

        def both(kind: type, ours: str, vllm: str, doc: str, **kw: Any) -> _Twin:
            return _Twin(kind(f"sparks:{ours}", doc, registry=r, **kw), kind(f"vllm:{vllm}", doc, registry=r, **kw))

        self.requests = both(
            Counter, "requests", "request_success", "finished requests by finish reason", labelnames=("finish_reason",)
        )
        self.prompt_tokens = both(Counter, "prompt_tokens", "prompt_tokens", "prompt tokens of finished requests")
        self.generation_tokens = both(Counter, "generation_tokens", "generation_tokens", "generated tokens")
        self.ttft = both(
            Histogram,
            "time_to_first_token_seconds",
            "time_to_first_token_seconds",
            "request arrival to its first token",
            buckets=_LATENCY,
        )
        self.e2e = both(
            Histogram,
            "request_latency_seconds",
            "e2e_request_latency_seconds",
            "request arrival to its last token",
            buckets=_LATENCY,
        )
        self.running = both(Gauge, "requests_running", "num_requests_running", "requests holding a lane")
        self.waiting = both(Gauge, "requests_waiting", "num_requests_waiting", "requests waiting for a lane")
        self.pool_usage = both(Gauge, "kv_cache_usage_ratio", "kv_cache_usage_perc", "share of the pool in use")
        self.rejected = both(Counter, "requests_rejected", "requests_rejected", "requests refused with 429")
        self.disconnects = both(
            Counter, "client_disconnections", "client_disconnections", "requests cancelled because the client went away"
        )
        # speculative decoding (vLLM's spec_decode names): lane windows with drafts, drafted and accepted tokens,
        # accepted drafts by their place in the window; ours also count every lane window and its committed tokens
        self.drafts = both(Counter, "spec_decode_num_drafts", "spec_decode_num_drafts", "lane windows with drafts")
        self.draft_tokens = both(
            Counter, "spec_decode_num_draft_tokens", "spec_decode_num_draft_tokens", "drafted tokens verified"
        )
        self.accepted_tokens = both(
            Counter, "spec_decode_num_accepted_tokens", "spec_decode_num_accepted_tokens", "drafted tokens accepted"
        )
        self.accepted_at = both(
            Counter,
            "spec_decode_num_accepted_tokens_per_pos",
            "spec_decode_num_accepted_tokens_per_pos",
            "accepted drafts by position in the window",
            labelnames=("position",),
        )
        self.windows = Counter(
            "sparks:decode_lane_windows", "lane windows decoded (with or without drafts)", registry=r
        )
        self.committed = Counter("sparks:decode_committed_tokens", "tokens committed by decode windows", registry=r)
        # the same by drafter (mtp+copy picks one per lane window)
        self.drafter_tokens = Counter(
            "sparks:draft_tokens", "drafted tokens verified, by drafter", labelnames=("drafter",), registry=r
        )
        self.drafter_accepted = Counter(
            "sparks:draft_accepted_tokens", "drafted tokens accepted, by drafter", labelnames=("drafter",), registry=r
        )
        # prompt reuse (vLLM's prefix-cache names, in tokens): prompt tokens of requests that could resume, and of
        # those the tokens resumed from kept states; what the kept states hold now
        self.reuse_queries = both(
            Counter, "prefix_cache_queries", "prefix_cache_queries", "prompt tokens looked up in the kept states"
        )
        self.reuse_hits = both(
            Counter, "prefix_cache_hits", "prefix_cache_hits", "prompt tokens resumed, not prefilled"
        )
        self.out_of_memory = Counter(
            "sparks:out_of_memory_steps", "steps that ran out of GPU memory (their requests failed)", registry=r
        )
        self.kept_states = Gauge("sparks:prompt_reuse_states", "kept prompt states (KDA snapshots)", registry=r)
        self.kept_tokens = Gauge("sparks:prompt_reuse_tokens", "pool rows held by kept prompt states", registry=r)
        self._seen: dict[str, int] = {}

    def finished(self, generation: Any, reason: str, completion_tokens: int) -> None:
        for metric in self.requests.metrics:
            metric.labels(finish_reason=reason).inc()
        self.prompt_tokens.inc(len(generation.prompt_ids))
        self.generation_tokens.inc(completion_tokens)
        self.e2e.observe(time.monotonic() - generation.started)

    def refresh(self, stats: dict[str, Any]) -> None:
        self.running.set(stats["requests_running"])
        self.waiting.set(stats["requests_waiting"])
        total = max(1, stats["pool_tokens"])
        self.pool_usage.set((stats["pool_tokens"] - stats["pool_free_tokens"]) / total)
        drafts = stats["drafts"]
        for key, metric in (
            ("drafted_windows", self.drafts),
            ("drafted", self.draft_tokens),
            ("accepted", self.accepted_tokens),
            ("windows", self.windows),
            ("committed", self.committed),
        ):
            self._advance(key, drafts[key], metric.inc)
        self._advance("out_of_memory", stats["totals"]["out_of_memory"], self.out_of_memory.inc)
        reuse = stats["prompt_reuse"]
        if reuse["enabled"]:
            self._advance("reuse_queries", reuse["queries_tokens"], self.reuse_queries.inc)
            self._advance("reuse_hits", reuse["hits_tokens"], self.reuse_hits.inc)
            self.kept_states.set(reuse["states"])
            self.kept_tokens.set(reuse["tokens"])
        for name, counts in drafts.get("by_drafter", {}).items():
            self._advance(f"drafted:{name}", counts["drafted"], self.drafter_tokens.labels(drafter=name).inc)
            self._advance(f"accepted:{name}", counts["accepted"], self.drafter_accepted.labels(drafter=name).inc)
        for position, count in enumerate(drafts["accepted_at"]):
            for metric in self.accepted_at.metrics:
                self._advance(f"{metric}:{position}", count, metric.labels(position=str(position)).inc)

    def _advance(self, key: str, total: int, inc: Any) -> None:
        """Counters follow the scheduler's totals: add what they grew by since the last scrape."""
        grown = total - self._seen.get(key, 0)
        if grown > 0:
            inc(grown)
        self._seen[key] = total


router = APIRouter()


@router.get("/metrics")
@router.get("/v1/metrics", include_in_schema=False)
async def metrics(request: Request) -> Response:
    state = request.app.state.server  # engine.server.state.ServerState, which holds this module's Metrics
    collector: Metrics = state.metrics
    collector.refresh(state.scheduler.stats())
    return Response(generate_latest(collector.registry), media_type=CONTENT_TYPE_LATEST)
