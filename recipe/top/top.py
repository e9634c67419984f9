"""`sparks top`'s core: sample rank 0's /health and /metrics, keep about a minute of samples, and turn them into a
`TopSnapshot` (rates from counter deltas between samples, time-to-first-token quantiles from histogram buckets).
Nothing here prints.

Where the numbers come from: streams, requests, the pool, uptime, rank heartbeats and the token totals from /health
(refreshed once per engine step, so decode tok/s moves while replies stream; prompt tokens count when a request is
admitted, so prefill tok/s is prompt tokens admitted per second); time to first token from /metrics' histogram."""

from __future__ import annotations

import collections
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx

from recipe.errors import RecipeError
from recipe.top.prometheus import Histogram, histogram, parse_samples, quantile

HISTORY_S = 60.0  # the "last minute" of rates and time to first token
TTFT_MIN_WINDOW = 10  # first tokens in the last minute before its quantiles replace the since-start ones
SILENT_S = 3.0  # engine/serve.py SILENT_S: a rank silent this long turns /health 503
TTFT_NAMES = ("sparks:time_to_first_token_seconds", "vllm:time_to_first_token_seconds")


class NotAnswering(RecipeError):
    """`sparks top --once` found no server answering at the URL."""

    exit_code = 3


def server_root(url: str, host: str, port: int) -> str:
    """The server's root (where /health and /metrics are): `url` with or without /v1, else HOST:PORT here."""
    if not url:
        reach = "127.0.0.1" if host in ("", "0.0.0.0", "::") else host
        url = f"http://{reach}:{port}"
    return url.rstrip("/").removesuffix("/v1")


@dataclass(frozen=True)
class Sample:
    """One poll: /health's JSON (None when the server did not answer: `problem` says why) and the TTFT histogram
    (None when /metrics could not be read: `metrics_problem` says why). `at` is time.monotonic()."""

    at: float
    health: dict[str, Any] | None
    ttft: Histogram | None = None
    problem: str | None = None
    metrics_problem: str | None = None

    def total(self, name: str) -> float | None:
        value = ((self.health or {}).get("totals") or {}).get(name)
        return float(value) if isinstance(value, (int, float)) else None


class TopClient:
    """GET /health (open) and /metrics (Bearer when a key is given) of one server; never raises for the network."""

    def __init__(self, root: str, api_key: str = "", timeout_s: float = 2.0) -> None:
        self.root, self.timeout_s = root, timeout_s
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.http = httpx.Client(headers=headers, timeout=httpx.Timeout(timeout_s))

    def close(self) -> None:
        self.http.close()

    def sample(self) -> Sample:
        at = time.monotonic()
        try:
            reply = self.http.get(self.root + "/health")
        except httpx.HTTPError as exc:
            return Sample(at, None, problem=self._why(exc))
        body = _json_dict(reply)
        if body is None:
            return Sample(at, None, problem=f"/health answers HTTP {reply.status_code} without this engine's JSON")
        ttft, metrics_problem = self._ttft()
        return Sample(at, body, ttft, metrics_problem=metrics_problem)

    def _ttft(self) -> tuple[Histogram | None, str | None]:
        try:
            reply = self.http.get(self.root + "/metrics")
        except httpx.HTTPError as exc:
            return None, f"/metrics: {self._why(exc)}"
        if reply.status_code == 401:
            return None, "/metrics needs the API key: pass --api-key or set API_KEY (or SPARKS_API_KEY)"
        if reply.status_code != 200:
            return None, f"/metrics answers HTTP {reply.status_code}"
        samples = parse_samples(reply.text)
        found = next((h for h in (histogram(samples, name) for name in TTFT_NAMES) if h is not None), None)
        return found, None if found else "/metrics has no time-to-first-token histogram"

    def _why(self, exc: httpx.HTTPError) -> str:
        if isinstance(exc, httpx.ConnectError):
            return "connection refused" if "refused" in str(exc).lower() else f"cannot connect ({exc})"
        if isinstance(exc, httpx.TimeoutException):
            return f"no answer within {self.timeout_s:g} s"
        return f"{type(exc).__name__}: {exc}"


@dataclass(frozen=True)
class Rate:
    """Tokens per second over the last second and over the kept history (`minute_span_s` long, up to a minute)."""

    last_second: float | None
    last_minute: float | None
    minute_span_s: float


@dataclass(frozen=True)
class Ttft:
    """Time-to-first-token quantiles (seconds) over `observations` first tokens in `window`."""

    p50_s: float | None
    p95_s: float | None
    observations: int
    window: str  # "last minute" (or "last N s" in the first minute), or "since start"


@dataclass(frozen=True)
class RankBeat:
    rank: int
    silent_s: float

    @property
    def live(self) -> bool:
        return self.silent_s < SILENT_S


@dataclass(frozen=True)
class TopSnapshot:
    """What the dashboard shows at one moment. Every field but `url`, `answering` and `problem` is None when the
    server did not answer; `ranks` is None when /health does not report them."""

    url: str
    answering: bool
    problem: str | None = None
    ok: bool | None = None
    error: str | None = None
    model: str | None = None
    uptime_s: float | None = None
    streams: dict[str, int] | None = None  # decoding, prefilling, max (as /health), busy, free
    requests_running: int | None = None
    requests_waiting: int | None = None
    decode: Rate | None = None
    prefill: Rate | None = None
    ttft: Ttft | None = None
    pool_tokens: int | None = None
    pool_free_tokens: int | None = None
    ranks: tuple[RankBeat, ...] | None = None
    totals: dict[str, int] | None = None
    prompt_reuse: dict[str, Any] | None = None  # /health's prompt_reuse: kept states, hits
    metrics_problem: str | None = None

    @property
    def pool_used_tokens(self) -> int | None:
        if self.pool_tokens is None or self.pool_free_tokens is None:
            return None
        return self.pool_tokens - self.pool_free_tokens

    def to_dict(self) -> dict[str, Any]:
        def rate(r: Rate | None) -> dict[str, Any] | None:
            return (
                None
                if r is None
                else {
                    "last_second": _round(r.last_second),
                    "last_minute": _round(r.last_minute),
                    "minute_span_s": round(r.minute_span_s, 2),
                }
            )

        return {
            "schema": "sparks-top/1",
            "url": self.url,
            "answering": self.answering,
            "problem": self.problem,
            "ok": self.ok,
            "error": self.error,
            "model": self.model,
            "uptime_s": self.uptime_s,
            "streams": self.streams,
            "requests": {"running": self.requests_running, "waiting": self.requests_waiting},
            "decode_tok_s": rate(self.decode),
            "prefill_tok_s": rate(self.prefill),
            "ttft_s": None
            if self.ttft is None
            else {
                "p50": _round(self.ttft.p50_s, 4),
                "p95": _round(self.ttft.p95_s, 4),
                "observations": self.ttft.observations,
                "window": self.ttft.window,
            },
            "pool_tokens": {"used": self.pool_used_tokens, "free": self.pool_free_tokens, "total": self.pool_tokens},
            "ranks": None
            if self.ranks is None
            else [{"rank": r.rank, "silent_s": r.silent_s, "live": r.live} for r in self.ranks],
            "totals": self.totals,
            "prompt_reuse": self.prompt_reuse,
            "metrics_problem": self.metrics_problem,
        }


class History:
    """The answered samples of about the last minute; cleared when the server's counters go back (a restart)."""

    def __init__(self, keep_s: float = HISTORY_S, max_samples: int = 1200) -> None:
        self.keep_s = keep_s
        self.samples: collections.deque[Sample] = collections.deque(maxlen=max_samples)

    def add(self, sample: Sample) -> None:
        if sample.health is None:
            return
        if self.samples and _restarted(self.samples[-1], sample):
            self.samples.clear()
        self.samples.append(sample)
        while len(self.samples) > 2 and sample.at - self.samples[1].at >= self.keep_s:
            self.samples.popleft()  # keep one sample at least keep_s old: the minute's base

    def rate(self, total: str) -> Rate | None:
        newest = self.samples[-1] if self.samples else None
        if newest is None or newest.total(total) is None:
            return None
        second, minute = self._base(1.0), self._base(self.keep_s)
        return Rate(
            _per_second(newest, second, total),
            _per_second(newest, minute, total),
            newest.at - minute.at if minute else 0.0,
        )

    def ttft(self) -> Ttft | None:
        newest = self.samples[-1] if self.samples else None
        if newest is None or newest.ttft is None:
            return None
        base = self._base(self.keep_s, lambda s: s.ttft is not None)
        if base is not None and base.ttft is not None and len(base.ttft.buckets) == len(newest.ttft.buckets):
            recent = newest.ttft.minus(base.ttft)
            if recent.count >= TTFT_MIN_WINDOW:
                span = newest.at - base.at
                return _ttft(recent, "last minute" if span >= 0.9 * self.keep_s else f"last {span:.0f} s")
        return _ttft(newest.ttft, "since start")

    def _base(self, age_s: float, usable: Callable[[Sample], bool] = lambda s: True) -> Sample | None:
        """The older sample whose age (from the newest) is closest to `age_s`; None with one sample."""
        newest = self.samples[-1]
        older = [s for s in list(self.samples)[:-1] if usable(s)]
        return min(older, key=lambda s: abs(newest.at - s.at - age_s), default=None)


class Top:
    """A client and its history: `poll` takes one sample and says what the dashboard shows now."""

    def __init__(self, client: TopClient, history: History | None = None) -> None:
        self.client, self.history = client, history or History()

    def poll(self) -> TopSnapshot:
        sample = self.client.sample()
        self.history.add(sample)
        return snapshot(self.client.root, sample, self.history)

    def once(self, gap_s: float) -> TopSnapshot:
        """Two samples `gap_s` apart, so the rates exist; raises NotAnswering when the server does not answer."""
        first = self.poll()
        if first.answering:
            time.sleep(gap_s)
        shot = self.poll()
        if not shot.answering:
            raise NotAnswering(
                f"{shot.url} is not answering ({shot.problem})",
                "start the server (./start.sh), or point --url at a running one",
            )
        return shot


def snapshot(url: str, sample: Sample, history: History) -> TopSnapshot:
    """The dashboard's numbers from the latest sample (`history` already holds it when it was answered)."""
    health = sample.health
    if health is None:
        return TopSnapshot(url, answering=False, problem=sample.problem)
    streams = health.get("streams") or {}
    busy = int(streams.get("decoding", 0)) + int(streams.get("prefilling", 0))
    return TopSnapshot(
        url,
        answering=True,
        ok=health.get("ok"),
        error=health.get("error"),
        model=health.get("model"),
        uptime_s=health.get("uptime_s"),
        streams={**streams, "busy": busy, "free": max(0, int(streams.get("max", busy)) - busy)} if streams else None,
        requests_running=health.get("requests_running"),
        requests_waiting=health.get("requests_waiting"),
        decode=history.rate("completion_tokens"),
        prefill=history.rate("prompt_tokens"),
        ttft=history.ttft(),
        pool_tokens=health.get("pool_tokens"),
        pool_free_tokens=health.get("pool_free_tokens"),
        ranks=_ranks(health.get("ranks")),
        totals=health.get("totals"),
        prompt_reuse=health.get("prompt_reuse"),
        metrics_problem=sample.metrics_problem,
    )


def _ranks(reported: Any) -> tuple[RankBeat, ...] | None:
    if not isinstance(reported, list):
        return None
    beats = [
        RankBeat(int(r["rank"]), float(r.get("silent_s") or 0.0))
        for r in reported
        if isinstance(r, dict) and isinstance(r.get("rank"), int)
    ]
    return tuple(sorted(beats, key=lambda b: b.rank))


def _ttft(observed: Histogram, window: str) -> Ttft:
    return Ttft(quantile(0.5, observed.buckets), quantile(0.95, observed.buckets), int(observed.count), window)


def _per_second(newest: Sample, base: Sample | None, total: str) -> float | None:
    if base is None or newest.at <= base.at:
        return None
    now, then = newest.total(total), base.total(total)
    return None if now is None or then is None else max(0.0, now - then) / (newest.at - base.at)


def _restarted(last: Sample, new: Sample) -> bool:
    went_back = any((new.total(k) or 0) < (last.total(k) or 0) for k in ("completion_tokens", "prompt_tokens"))
    uptime_now, uptime_then = (new.health or {}).get("uptime_s"), (last.health or {}).get("uptime_s")
    return went_back or (
        isinstance(uptime_now, (int, float)) and isinstance(uptime_then, (int, float)) and uptime_now < uptime_then
    )


def _json_dict(reply: httpx.Response) -> dict[str, Any] | None:
    try:
        body = reply.json()
    except ValueError:
        return None
    return body if isinstance(body, dict) else None


def _round(value: float | None, digits: int = 1) -> float | None:
    return None if value is None else round(value, digits)
