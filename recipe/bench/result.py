"""What `sparks bench` measured: runs of requests sent at once, rows of medians, and the result with the facts of
the host and the server. `to_dict` is the JSON format (schema sparks-bench/1)."""

from __future__ import annotations

import json
import statistics
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from recipe.bench.client import RequestTiming
from recipe.bench.options import BenchOptions

SCHEMA = "sparks-bench/1"


@dataclass(frozen=True)
class DecodeRun:
    """Requests sent at once, each with its own prompt."""

    requests: tuple[RequestTiming, ...]

    @property
    def aggregate_tok_s(self) -> float | None:
        span = max(r.last_token for r in self.requests) - min(r.first_token for r in self.requests)
        tokens = sum(r.completion_tokens - 1 for r in self.requests)
        return tokens / span if span > 0 and tokens > 0 else None

    @property
    def end_to_end_tok_s(self) -> float:
        """Completion tokens over the whole run, prompts included: what a user waiting for all replies sees."""
        span = max(r.done for r in self.requests) - min(r.sent for r in self.requests)
        return sum(r.completion_tokens for r in self.requests) / span

    def to_dict(self) -> dict[str, Any]:
        return {
            "aggregate_tok_s": _round(self.aggregate_tok_s),
            "end_to_end_tok_s": _round(self.end_to_end_tok_s),
            "requests": [r.to_dict() for r in self.requests],
        }


@dataclass(frozen=True)
class DecodeRow:
    kind: str  # prose | structured
    concurrency: int
    runs: tuple[DecodeRun, ...]

    @property
    def aggregate_tok_s(self) -> float | None:
        return _median([run.aggregate_tok_s for run in self.runs])

    @property
    def per_request_tok_s(self) -> float | None:
        return _median([r.decode_tok_s for run in self.runs for r in run.requests])

    @property
    def ttft_s(self) -> float | None:
        return _median([r.ttft_s for run in self.runs for r in run.requests])

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "concurrency": self.concurrency,
            "aggregate_tok_s": _round(self.aggregate_tok_s),
            "per_request_tok_s": _round(self.per_request_tok_s),
            "ttft_s": _round(self.ttft_s, 4),
            "runs": [run.to_dict() for run in self.runs],
        }


@dataclass(frozen=True)
class PrefillRow:
    target_tokens: int
    runs: tuple[RequestTiming, ...]

    @property
    def prompt_tokens(self) -> int:
        return int(statistics.median(r.prompt_tokens for r in self.runs))

    @property
    def prefill_tok_s(self) -> float | None:
        return _median([r.prompt_tokens / r.ttft_s for r in self.runs if r.ttft_s > 0])

    @property
    def ttft_s(self) -> float | None:
        return _median([r.ttft_s for r in self.runs])

    def to_dict(self) -> dict[str, Any]:
        return {
            "target_tokens": self.target_tokens,
            "prompt_tokens": self.prompt_tokens,
            "prefill_tok_s": _round(self.prefill_tok_s),
            "ttft_s": _round(self.ttft_s, 4),
            "runs": [r.to_dict() for r in self.runs],
        }


@dataclass(frozen=True)
class ReuseRow:
    """Prompt reuse at one size: `kind` "resent" (the same prompt twice) or "system" (a new conversation under the
    system prompt of an earlier one); each run a (cold, warm) pair of one-token replies."""

    kind: str
    target_tokens: int
    runs: tuple[tuple[RequestTiming, RequestTiming], ...]

    @property
    def prompt_tokens(self) -> int:
        return int(statistics.median(warm.prompt_tokens for _, warm in self.runs))

    @property
    def cached_tokens(self) -> int:
        return int(statistics.median(warm.cached_tokens for _, warm in self.runs))

    @property
    def cold_ttft_s(self) -> float | None:
        return _median([cold.ttft_s for cold, _ in self.runs])

    @property
    def warm_ttft_s(self) -> float | None:
        return _median([warm.ttft_s for _, warm in self.runs])

    @property
    def ratio(self) -> float | None:
        """The warm first token's time as a share of the cold one's (median over the runs)."""
        return _median([warm.ttft_s / cold.ttft_s for cold, warm in self.runs if cold.ttft_s > 0])

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "target_tokens": self.target_tokens,
            "prompt_tokens": self.prompt_tokens,
            "cached_tokens": self.cached_tokens,
            "cold_ttft_s": _round(self.cold_ttft_s, 4),
            "warm_ttft_s": _round(self.warm_ttft_s, 4),
            "ratio": _round(self.ratio, 4),
            "runs": [{"cold": cold.to_dict(), "warm": warm.to_dict()} for cold, warm in self.runs],
        }


@dataclass
class BenchResult:
    options: BenchOptions
    date: str
    host: str
    client: dict[str, str]
    server: dict[str, Any]  # /health when the bench started (empty if the server has none)
    decode: list[DecodeRow] = field(default_factory=list)
    prefill: list[PrefillRow] = field(default_factory=list)
    reuse: list[ReuseRow] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    server_completion_tokens: int | None = None  # the server's own count over the bench (from /health totals)
    client_completion_tokens: int = 0  # what the bench's own requests got, warm-up included
    seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        config = {k: v for k, v in asdict(self.options).items() if k not in ("api_key", "url", "model")}
        return {
            "schema": SCHEMA,
            "date": self.date,
            "host": self.host,
            "url": self.options.url,
            "model": self.options.model,
            "client": self.client,
            "server": self.server,
            "config": {**config, "temperature": 0, "ignore_eos": True, "thinking": False, "stream": True},
            "decode": [row.to_dict() for row in self.decode],
            "prefill": [row.to_dict() for row in self.prefill],
            "reuse": [row.to_dict() for row in self.reuse],
            "skipped": self.skipped,
            "warnings": self.warnings,
            "server_completion_tokens": self.server_completion_tokens,
            "client_completion_tokens": self.client_completion_tokens,
            "seconds": round(self.seconds, 2),
        }


def write_json(result: BenchResult, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result.to_dict(), indent=2) + "\n")
    return path


def _median(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def _round(value: float | None, digits: int = 2) -> float | None:
    return None if value is None else round(value, digits)
