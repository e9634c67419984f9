"""Just enough of the Prometheus text format for `sparks top`: samples by name and labels, one histogram's
cumulative buckets, and quantiles estimated from them the way Prometheus' `histogram_quantile` does.

prometheus_client's parser is an engine dependency only (the recipe's base install does not have it), and the few
lines the engine writes need no more than this."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)(?:\s+\S+)?$")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')

Labels = tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class Histogram:
    """Cumulative bucket counts by upper bound (ascending, the last one +Inf), the observations' count and sum."""

    buckets: tuple[tuple[float, float], ...]
    count: float
    total: float

    def minus(self, earlier: Histogram) -> Histogram:
        """The observations made since `earlier` (same bucket bounds)."""
        then = dict(earlier.buckets)
        return Histogram(
            tuple((le, n - then.get(le, 0.0)) for le, n in self.buckets),
            self.count - earlier.count,
            self.total - earlier.total,
        )


def parse_samples(text: str) -> dict[str, list[tuple[Labels, float]]]:
    """Every sample line as name -> [(labels, value)]; comments, blank and unreadable lines are skipped."""
    samples: dict[str, list[tuple[Labels, float]]] = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        match = _SAMPLE.match(line)
        if match is None:
            continue
        name, labels, value = match.groups()
        try:
            number = float(value)
        except ValueError:
            continue
        samples.setdefault(name, []).append((tuple(_LABEL.findall(labels or "")), number))
    return samples


def histogram(samples: dict[str, list[tuple[Labels, float]]], name: str) -> Histogram | None:
    """The unlabelled histogram `name` (its _bucket, _count and _sum lines), or None when the text lacks it."""
    buckets = []
    for labels, value in samples.get(f"{name}_bucket", []):
        le = dict(labels).get("le")
        if le is not None:
            buckets.append((float(le), value))
    if not buckets:
        return None
    count = _first(samples, f"{name}_count", default=max(n for _, n in buckets))
    return Histogram(tuple(sorted(buckets)), count, _first(samples, f"{name}_sum", default=0.0))


def quantile(q: float, buckets: tuple[tuple[float, float], ...]) -> float | None:
    """The q-quantile (0..1) of cumulative `buckets` [(upper bound, count)], interpolated linearly inside its bucket
    (the first bucket starts at 0); in the +Inf bucket, the largest finite bound. None without observations."""
    total = buckets[-1][1] if buckets else 0.0
    if total <= 0:
        return None
    rank = q * total
    lower, below = 0.0, 0.0
    for upper, count in buckets:
        if count >= rank and count > below:
            if math.isinf(upper):
                return lower
            return lower + (upper - lower) * (rank - below) / (count - below)
        lower, below = upper, count
    return lower


def _first(samples: dict[str, list[tuple[Labels, float]]], name: str, default: float) -> float:
    found = samples.get(name)
    return found[0][1] if found else default
