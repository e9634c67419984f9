"""Deterministic, batch-independent sampling keyed by (seed, absolute position).

Every candidate token gets Gumbel noise from a counter-based hash of (seed, position, token id), and the sample is
the argmax of `logits / T + noise` over the tokens that survive top-k / top-p / min-p. The noise for a row depends
only on its own key, so the draw never depends on the rest of the batch or (later) on a draft window.
Gumbel-max over the kept set draws exactly from the renormalised truncated distribution.

The logits themselves are only as batch-independent as the kernels: on the CPU, BLAS may block a matmul
differently for 1 row than for 41, moving a row's logits in the last bits (~1e-5), so a near-tie can in principle
flip with the batch's composition. The tests assert identical tokens (concurrent == serial), not identical bits;
batch-invariant kernels (one fixed-shape GEMV per row, as the GPU's routed-expert kernel already is) close the gap.

Rows are sampled where they are: a GPU step's rows on the GPU (engine/runner/executor.py; a decode step's rows
together, `sample_rows`, a pass replayed from a CUDA graph with --cuda-graphs: `DrawGraphs`), the CPU's on the
host; every operation here is a plain torch one on the row's device.
At GLM-5.3-Flash's 154,880 tokens the host's costs are what shaped it (bench/sampling_bench.py, one core): the
all-finite check as a sum (NaN and infinities carry into it) rather than an elementwise test, `first_max` rather
than argmax, greedy rows ranked as they come (fp32), and the whole-vocabulary draw (`_gumbel_max`) with logarithms
only where a token can win — the same tokens as before each change.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import logging
import math
import threading
from dataclasses import dataclass
from typing import Any

import torch

log = logging.getLogger(__name__)

MASK64 = (1 << 64) - 1
GOLDEN = 0x9E3779B97F4A7C15
MIX1 = 0xBF58476D1CE4E5B9
MIX2 = 0x94D049BB133111EB


def _signed(value: int) -> int:
    """An unsigned 64-bit constant as the int64 torch stores (same bits)."""
    value &= MASK64
    return value - (1 << 64) if value >= 1 << 63 else value


def splitmix64(value: int) -> int:
    """Reference splitmix64 finaliser on Python ints (unsigned 64-bit)."""
    z = (value + GOLDEN) & MASK64
    z = ((z ^ (z >> 30)) * MIX1) & MASK64
    z = ((z ^ (z >> 27)) * MIX2) & MASK64
    return z ^ (z >> 31)


def _shr(x: torch.Tensor, bits: int) -> torch.Tensor:
    """Logical right shift of int64 lanes (torch's >> is arithmetic)."""
    return (x >> bits) & ((1 << (64 - bits)) - 1)


def splitmix64_tensor(x: torch.Tensor) -> torch.Tensor:
    """splitmix64 on int64 lanes; int64 multiplication wraps modulo 2**64, so the bits match `splitmix64`."""
    z = x + _signed(GOLDEN)
    z = (z ^ _shr(z, 30)) * _signed(MIX1)
    z = (z ^ _shr(z, 27)) * _signed(MIX2)
    return z ^ _shr(z, 31)


def row_key(seed: int, position: int) -> int:
    """The hash key of one sampled row: chained so (seed, position) pairs never collide by simple arithmetic."""
    return splitmix64(splitmix64(seed & MASK64) ^ (position & MASK64))


def top_bits(seed: int, position: int, token_ids: torch.Tensor) -> torch.Tensor:
    """The top 53 bits of hash(seed, position, token id) per token id, as int64 (`_top53` of the row's key)."""
    return _top53(token_ids, _signed(row_key(seed, position)))


def _top53(token_ids: torch.Tensor, key: int | torch.Tensor) -> torch.Tensor:
    """The top 53 bits of splitmix64(token id ^ key), as int64: `splitmix64_tensor` then `_shr`, worked in place on
    one fresh tensor (a sampled row hashes every token of the vocabulary: ~155k). `key`: a row's (`row_key`,
    signed), or a column of them [R, 1] against ids [1, vocab] for R rows at once."""
    z = token_ids.to(torch.int64) ^ key
    z += _signed(GOLDEN)
    shifted = torch.empty_like(z)
    for bits, mix in ((30, MIX1), (27, MIX2), (31, None)):
        torch.bitwise_right_shift(z, bits, out=shifted)
        shifted &= (1 << (64 - bits)) - 1  # logical, as `_shr`
        z ^= shifted
        if mix is not None:
            z *= _signed(mix)
    torch.bitwise_right_shift(z, 11, out=shifted)
    return shifted.bitwise_and_((1 << 53) - 1)


def _unit(top53: torch.Tensor) -> torch.Tensor:
    """u = (top53 + 0.5) / 2^53, float64, in (0, 1]: the sum rounds to 2^53 for the largest value."""
    return (top53.to(torch.float64) + 0.5) * (1.0 / (1 << 53))


def noise(top53: torch.Tensor) -> torch.Tensor:
    """Gumbel noise -log(-log(u)), float64, from `top_bits`' values (`_unit`; the largest value's noise is +inf)."""
    return -torch.log(-torch.log(_unit(top53)))


def uniforms(seed: int, position: int, token_ids: torch.Tensor) -> torch.Tensor:
    """Uniform float64 per token id from hash(seed, position, token id), in (0, 1] (`_unit`)."""
    return _unit(top_bits(seed, position, token_ids))


def gumbel(seed: int, position: int, token_ids: torch.Tensor) -> torch.Tensor:
    return noise(top_bits(seed, position, token_ids))


# The whole-vocabulary draw (`_gumbel_max`) computes the noise only where it can matter: a token whose scaled logit
# is more than PRUNE below the best score found so far wins only with noise above PRUNE, which only 53-bit values
# above PRUNE_BITS give (~1 token in 3,000). PRUNE_BITS sits 2^24 values (~6e-6 of noise) below where noise passes
# PRUNE, so the last-bit differences of a vector and a scalar log cannot move a token across it.
PRUNE = 8.0


def _noise_bound(prune: float) -> int:
    """The largest 53-bit value whose noise stays below `prune`, less 2^24 values of margin."""
    return int(math.exp(-math.exp(-prune)) * (1 << 53)) - (1 << 24)


PRUNE_BITS = _noise_bound(PRUNE)


def _drawn(scaled: torch.Tensor, gumbels: torch.Tensor) -> torch.Tensor:
    """The scores the draw takes the first maximum of: scaled + noise, where an impossible token (-inf) stays
    impossible even under infinite noise (u = 1: -inf + inf would be NaN, which a maximum takes as the largest)."""
    return _nan_impossible(scaled + gumbels)


@functools.cache
def _token_ids(vocab: int, device: torch.device) -> torch.Tensor:
    return torch.arange(vocab, dtype=torch.int64, device=device)


def _gumbel_max(scaled: torch.Tensor, seed: int, position: int, prune: float = PRUNE) -> int:
    """argmax(scaled + gumbel(seed, position, every token id)), lowest id on ties. On a GPU as written (a few dozen
    launches, one host read); on the host with the logarithms, the costly part, only for `_candidates`."""
    top53 = top_bits(seed, position, _token_ids(scaled.numel(), scaled.device))
    if not scaled.is_cpu:
        return first_max(_drawn(scaled, noise(top53)))
    ids = _candidates(scaled, top53, prune)
    return int(ids[first_max(_drawn(scaled[ids], noise(top53[ids])))])


def _candidates(scaled: torch.Tensor, top53: torch.Tensor, prune: float = PRUNE) -> torch.Tensor:
    """The ids, ascending, that can reach the whole-vocabulary draw's maximum: the tokens within `prune` of a
    reached score and the few whose hash gives noise above `prune`.

    Why no other can: the best-scaled token j reaches `level` = scaled[j] + its noise. A token left out has
    scaled ≤ level − prune − margin and noise ≤ prune (its hash is at most the bound's), so its score is below
    `level`, which some kept token reaches: every token at the maximum is kept, and the kept ids are in ascending
    order, so argmax's first maximum is the same token. (The margin covers float64 rounding of `level` and of the
    bound; a noise of +inf is above any bound, so that token is kept; where j's own noise is +inf the threshold is
    NaN and the hash alone keeps.)"""
    bound = PRUNE_BITS if prune == PRUNE else _noise_bound(prune)
    best = torch.max(scaled, 0).indices.reshape(1)
    level = scaled[best] + noise(top53[best])
    keep = top53 > bound
    keep |= scaled > level - prune - 1e-6 * level.abs().clamp(min=1.0)
    keep[best] = True
    return keep.nonzero().reshape(-1)


def prompt_seed(prompt_ids: list[int]) -> int:
    """The default seed when a request names none: derived from the prompt, so the same prompt replays the same
    reply while different prompts do not share noise."""
    digest = hashlib.sha256(",".join(map(str, prompt_ids)).encode()).digest()
    return int.from_bytes(digest[:8], "little")


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 (or less) = off
    min_p: float = 0.0
    seed: int = 0
    max_tokens: int = 16

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0 or self.top_k == 1


MIN_TEMPERATURE = 1e-5  # below this a request is greedy (as vLLM): logits / T leaves float64's range near T = 1e-300,
# and long before that the draw is the argmax anyway
HOT = 1e30  # stands in for an infinite temperature: every finite logit scales to ~0 (a uniform draw)


def clean(params: SamplingParams) -> SamplingParams:
    """The parameters the sampler can always honour: NaN or tiny temperatures are greedy, an infinite one is
    uniform, probabilities are clamped into [0, 1] (NaN = filter off). The API already refuses most of these; the
    sampler does not rely on it, so no request can make it fail."""
    t = params.temperature
    temperature = 0.0 if math.isnan(t) or t < MIN_TEMPERATURE else min(t, HOT)
    top_p = 1.0 if math.isnan(params.top_p) else min(1.0, max(0.0, params.top_p))
    min_p = 0.0 if math.isnan(params.min_p) else min(1.0, max(0.0, params.min_p))
    if (temperature, top_p, min_p) == (params.temperature, params.top_p, params.min_p):
        return params
    return dataclasses.replace(params, temperature=temperature, top_p=top_p, min_p=min_p)


def _all_finite(scores: torch.Tensor) -> bool:
    """Whether every score is finite: a finite sum says so in one cheap pass (NaN and infinities carry into it);
    only a sum that is not (an overflow of huge finite scores, or a real NaN or infinity) checks each score."""
    return bool(torch.isfinite(scores.sum())) or bool(torch.isfinite(scores).all())


def first_max(scores: torch.Tensor) -> int:
    """The index of the first maximum of a 1-D tensor (argmax's answer; `torch.max` over the dimension gives the
    same first index and takes about a third of argmax's time on the CPU)."""
    return int(torch.max(scores, 0).indices)


def _nan_impossible(scores: torch.Tensor) -> torch.Tensor:
    """NaN as -inf, the infinities kept (torch's nan_to_num would make them ±the largest finite value)."""
    return torch.nan_to_num(scores, nan=-math.inf, posinf=math.inf, neginf=-math.inf)


def finite(scores: torch.Tensor) -> torch.Tensor:
    """Scores with no NaN or infinity, ranking as the originals do: the usual all-finite row comes back as it is;
    NaN counts as impossible (-inf); when some scores are +inf only they stay possible (0 against -inf); a row with
    nothing possible becomes uniform. Filters and the Gumbel draw then always keep at least one token."""
    if _all_finite(scores):
        return scores
    return _finite_rows(scores.reshape(1, -1)).reshape(scores.shape)


def _finite_rows(scores: torch.Tensor) -> torch.Tensor:
    """`finite` of each row of [R, vocab] at once, without the all-finite check (a row with nothing to change comes
    back with the same values)."""
    scores = _nan_impossible(scores)
    top = scores.max(dim=1, keepdim=True).values
    only_infinite = torch.where(scores == math.inf, 0.0, -math.inf).to(scores.dtype)
    scores = torch.where(top == math.inf, only_infinite, scores)
    return torch.where(top == -math.inf, 0.0, scores)


CANDIDATES = 1024  # first look at this many top tokens for top_p / min_p; widened only when they do not suffice


def _ranked(scaled: torch.Tensor, limit: int) -> torch.Tensor:
    """Ids of the `limit` best tokens by (score desc, id asc), without sorting the whole vocabulary: top-k's, in id
    order, then ranked by score with ties kept in that order. Where the next score ties the limit-th, top-k may
    have chosen any of the tied tokens: then every token scoring at least that, so the lowest ids are kept."""
    if limit >= scaled.numel():
        return torch.sort(-scaled, stable=True).indices
    best, ids = torch.topk(scaled, limit + 1)
    if bool(best[limit] == best[limit - 1]):
        ids = torch.nonzero(scaled >= best[limit - 1]).reshape(-1)
    else:
        ids = ids[:limit].sort().values
    return ids[torch.sort(-scaled[ids], stable=True).indices][:limit]


def _kept(values: torch.Tensor, log_norm: torch.Tensor, params: SamplingParams) -> tuple[int, bool]:
    """How many of the ranked candidates survive min_p / top_p, and whether the ranking was long enough to say."""
    probs = torch.exp(values - log_norm)
    keep, complete = values.shape[0], False
    if params.min_p > 0.0:
        passing = int((probs >= params.min_p * probs[0]).sum())
        keep, complete = min(keep, passing), complete or passing < values.shape[0]
    if params.top_p < 1.0:
        before = torch.cumsum(probs[:keep], dim=0) - probs[:keep]
        reached = int((before < params.top_p).sum())
        keep, complete = min(keep, max(1, reached)), complete or reached < keep
    return keep, complete


def sample(logits: torch.Tensor, params: SamplingParams, position: int) -> int:
    """One token from fp32 logits [vocab] for the token at absolute `position` of its sequence.

    Candidates are ranked by (scaled logit desc, id asc); top_k, then min_p and top_p (relative to the softmax over
    the top_k set, or the whole vocabulary) cut the ranking; keyed Gumbel noise picks among what is left. Only as
    many top tokens as the filters need are ranked (the full-vocabulary sort cost ~40 ms at 155k tokens)."""
    row = logits.detach().reshape(-1)
    params = clean(params)
    if params.greedy and _all_finite(row):
        return first_max(row)  # ties -> lowest id; float64 would rank the same (widening is exact)
    logits = finite(row.to(torch.float64))
    if params.greedy:
        return first_max(logits)
    scaled = finite(logits / params.temperature)  # huge logits over a small temperature can overflow
    vocab = scaled.numel()
    if params.top_k <= 0 and params.top_p >= 1.0 and params.min_p <= 0.0:
        return _gumbel_max(scaled, params.seed, position)
    limit = min(vocab, params.top_k) if params.top_k > 0 else min(vocab, CANDIDATES)
    while True:
        ids = _ranked(scaled, limit)
        values = scaled[ids]
        log_norm = torch.logsumexp(values if params.top_k > 0 else scaled, dim=0)
        keep, complete = _kept(values, log_norm, params)
        if complete or params.top_k > 0 or limit == vocab:
            break
        limit = min(vocab, limit * 8)
    ids = ids[:keep]
    return int(ids[first_max(_drawn(values[:keep], gumbel(params.seed, position, ids)))])


SAMPLE_ROWS = 32  # decode rows `sample_rows` takes in one pass on a GPU


def sample_rows(
    rows: torch.Tensor, params: list[SamplingParams], positions: list[int], graphs: bool = False
) -> list[int]:
    """`sample` of each row of `rows` [R, vocab] with its own parameters and position: the same tokens. On the host
    a row at a time (`sample`'s pruned draw is the cheap form there); on a GPU the rows together, SAMPLE_ROWS a
    pass (`_device_rows`; ~10 float64 copies of a pass's rows at once, ~400 MB at 154,880 tokens): a decode step's
    rows (every lane's pending token and drafts) in one read, where a row at a time took ~25 launches and a read
    each, and top_p / min_p a ranking each. `graphs`: a pass replayed from CUDA graphs (`DrawGraphs`, GRAPH_ROWS
    rows a replay: a few launches where the pass is ~40), as --cuda-graphs says for the decode steps; without, a
    single unfiltered row goes to `sample` (fewer launches)."""
    alone = not graphs and len(params) == 1 and not _filters(clean(params[0]))  # eager, `sample` takes fewer launches
    if rows.is_cpu or alone:
        return [sample(row, p, position) for row, p, position in zip(rows, params, positions)]
    out: list[int] = []
    for first in range(0, len(params), SAMPLE_ROWS):
        last = first + SAMPLE_ROWS
        out += _device_rows(rows[first:last], params[first:last], positions[first:last], graphs)
    return out


def _device_rows(
    rows: torch.Tensor, params: list[SamplingParams], positions: list[int], graphs: bool = False
) -> list[int]:
    """`sample` for each row, the rows together (`_picks`), with the rows' parameters as one int64 table (`_knobs`,
    copied to the device without waiting for it); an all-greedy pass is one maximum. `graphs`: on a GPU, replayed
    from the pass's CUDA graph (`DRAW_GRAPHS`, GRAPH_ROWS rows a replay), eager where none can be captured (then
    only the filtered rows are ranked)."""
    params = [clean(p) for p in params]
    rows = rows.detach()
    if all(p.greedy for p in params):  # `finite` changes no row's first maximum
        return torch.max(_nan_impossible(rows), dim=1).indices.tolist()
    knobs = _knobs(params, positions, rows.shape[1])
    filtered = knobs[:, 3].nonzero().reshape(-1)
    kinds = (any(p.greedy for p in params), len(filtered) > 0)
    if graphs and rows.is_cuda:
        out: list[int] = []
        for first in range(0, len(params), GRAPH_ROWS):
            last = first + GRAPH_ROWS
            got = DRAW_GRAPHS.picks(rows[first:last], knobs[first:last], *kinds)
            if got is None:
                break
            out += got
        else:
            return out
    subset = to_device(filtered, rows.device) if 0 < len(filtered) < len(params) else None
    return _picks(rows, to_device(knobs, rows.device), *kinds, subset=subset).tolist()


def pinned_for(values: torch.Tensor, device: torch.device) -> torch.Tensor:
    """`values` as the source of a copy to `device` that nothing waits for: pinned when the copy goes from the host
    to a GPU (torch keeps the pinned block until the copy is done), else as they are."""
    return values.pin_memory() if device.type == "cuda" and not values.is_cuda else values


def to_device(values: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A host tensor on `device`, copied without waiting for the device (`pinned_for`)."""
    return pinned_for(values, device).to(device, non_blocking=True)


def _knobs(params: list[SamplingParams], positions: list[int], vocab: int) -> torch.Tensor:
    """Each row's hash key, top_k (the vocabulary for none), whether greedy, whether filtered, and the bits of its
    float64 temperature (1 for a greedy row), min_p and top_p: [R, 7] int64 on the host."""
    keyed = [
        [
            _signed(row_key(p.seed, q)),
            min(p.top_k, vocab) if p.top_k > 0 else vocab,
            p.greedy,
            not p.greedy and _filters(p),
        ]
        for p, q in zip(params, positions)
    ]
    knobs = [[1.0 if p.greedy else p.temperature, p.min_p, p.top_p] for p in params]
    return torch.cat(
        [torch.tensor(keyed, dtype=torch.int64), torch.tensor(knobs, dtype=torch.float64).view(torch.int64)], dim=1
    )


def _picks(
    rows: torch.Tensor, knobs: torch.Tensor, greedy: bool, filtered: bool, subset: torch.Tensor | None = None
) -> torch.Tensor:
    """The drawn id of each row: `sample`'s token, from the rows and their `_knobs` on the rows' device. Every
    operation is `sample`'s on the row's own values (the elementwise ones give the same bits); the filters' ranking
    is one stable sort of the whole row (score desc, id asc, as `_ranked`), and their cuts are counts over it (each
    cut is a prefix of the ranking). Only the sums (log-normaliser, top_p's running sum) may differ from a single
    row's in the last bit, as the host's from the GPU's: a cut could move only where a running sum meets top_p
    within that bit. Every row is scaled and noised (a greedy row at temperature 1, its draw then unused); with
    `filtered`, every row is ranked and cut (an unfiltered row's cut keeps its whole ranking, its pick then unused):
    the same launches whatever the rows' mix, so a captured pass serves any mix of its kind; eager, `subset` names
    the filtered rows, ranked alone. `greedy`: some rows are greedy (their first maximum, NaN impossible)."""
    vocab = rows.shape[1]
    floats = knobs[:, 4:].view(torch.float64)
    best = torch.max(_nan_impossible(rows), dim=1).indices if greedy else None
    if rows.dtype == torch.float64:
        keys = None
        scaled = _finite_rows(rows) / floats[:, :1]
        scaled = _finite_rows(scaled)  # from fp32 or narrower logits (|x| < 3.5e38) over T >= 1e-5 none overflows
    else:  # widening after `_finite_rows` gives its float64 values; dividing by T > 0 keeps their order (`_keys`)
        keys = _finite_rows(rows.float())
        scaled = keys.to(torch.float64) / floats[:, :1]
    gumbels = noise(_top53(_token_ids(vocab, rows.device)[None, :], knobs[:, :1]))
    picks = torch.max(_drawn(scaled, gumbels), dim=1).indices
    if filtered and subset is not None:
        f = subset
        cut = _filtered_picks(
            scaled[f], gumbels[f], knobs[f, 1], floats[f, 1], floats[f, 2], None if keys is None else keys[f]
        )
        picks[f] = cut
    elif filtered:
        cut = _filtered_picks(scaled, gumbels, knobs[:, 1], floats[:, 1], floats[:, 2], keys)
        picks = torch.where(knobs[:, 3] == 1, cut, picks)
    if best is not None:
        picks = torch.where(knobs[:, 2] == 1, best, picks)
    return picks


GRAPH_ROWS = 16  # rows a graphed pass replays at most (its working memory: ~10 float64 copies of them, ~200 MB)


class DrawGraphs:
    """`_picks` captured as CUDA graphs, one a (device, dtype, vocabulary, rows bucket, kinds): a pass is then a
    copy of its rows into the graph's input, one of its knobs (from pinned memory, not waited for), a replay and
    the read, where eager it is ~40 launches behind a synchronous step (the host's launch time was most of a top_p
    row's ~2 ms on an H100). Rows are padded up to a power of two (at most 5 graphs a kind for GRAPH_ROWS); a
    bucket's graphs share their input (a padding row's values and knobs are whatever a pass left there: every
    operation is a row's own, so they touch no other row), and every graph one memory pool a device (they replay
    one at a time, under a lock, and each is read before the lock is let go). A capture that fails leaves that key
    eager."""

    def __init__(self) -> None:
        self._graphs: dict[tuple, tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        self._inputs: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}
        self._pools: dict[torch.device, Any] = {}
        self._failed: set[tuple] = set()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._graphs)

    def picks(self, rows: torch.Tensor, knobs: torch.Tensor, greedy: bool, filtered: bool) -> list[int] | None:
        """`_picks` of these rows (at most GRAPH_ROWS) and their host knobs, from the graph; None where it cannot be
        captured."""
        count, vocab = rows.shape
        size = 1 << (count - 1).bit_length()
        bucket = (rows.device, rows.dtype, vocab, size)
        key = (*bucket, greedy, filtered)
        with self._lock:
            if key in self._failed:
                return None
            if key not in self._graphs:
                try:
                    self._graphs[key] = self._capture(bucket, greedy, filtered)
                except Exception:
                    self._failed.add(key)
                    log.warning("a sampling pass could not be captured (%s); it runs op by op", key[1:], exc_info=True)
                    from engine.runner.lanes import restore_generator

                    restore_generator(rows.device)
                    return None
            graph, out = self._graphs[key]
            given, table = self._inputs[bucket]
            given[:count].copy_(rows)
            table[:count].copy_(pinned_for(knobs, table.device), non_blocking=True)
            graph.replay()
            return out[:count].tolist()

    def _capture(self, bucket: tuple, greedy: bool, filtered: bool) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
        device, dtype, vocab, size = bucket
        with torch.cuda.device(device):
            if bucket not in self._inputs:
                plain = SamplingParams(temperature=1.0)  # a padding row's knobs until a pass writes its own
                table = _knobs([plain] * size, [0] * size, vocab).to(device)
                self._inputs[bucket] = (torch.zeros(size, vocab, dtype=dtype, device=device), table)
            given, table = self._inputs[bucket]
            _token_ids(vocab, device)  # made before the capture: a cached tensor must not live in a graph's pool
            side = torch.cuda.Stream(device)
            side.wait_stream(torch.cuda.current_stream(device))
            with torch.cuda.stream(side):  # a first run outside the capture (the kernels' workspaces)
                _picks(given, table, greedy, filtered)
            torch.cuda.current_stream(device).wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self._pools.get(device), capture_error_mode="thread_local"):
                out = _picks(given, table, greedy, filtered)
            self._pools.setdefault(device, graph.pool())
        return graph, out


DRAW_GRAPHS = DrawGraphs()


def _filters(params: SamplingParams) -> bool:
    return params.top_k > 0 or params.top_p < 1.0 or params.min_p > 0.0


def _filtered_picks(
    scaled: torch.Tensor,
    gumbels: torch.Tensor,
    top_k: torch.Tensor,
    min_p: torch.Tensor,
    top_p: torch.Tensor,
    keys: torch.Tensor | None = None,
) -> torch.Tensor:
    """The drawn id of each row under its top_k (the vocabulary for none) / min_p / top_p, as `sample` cuts and
    draws: ranked (score desc, id asc), cut to the top_k, min_p and top_p prefixes (`_kept`'s counts), the Gumbel
    maximum among what is left (the first in rank order on ties, as `sample`'s). `keys`: fp32 values that rank as
    `scaled` does (the finite fp32 logits it was made from: T > 0 and float64's range and precision keep every
    order and every tie), sorted in its place — half the radix passes of float64's."""
    vocab = scaled.shape[1]
    order = torch.sort(-(scaled if keys is None else keys), dim=1, stable=True).indices
    values = scaled.gather(1, order)
    rank = _token_ids(vocab, scaled.device)[None, :]
    in_k = rank < top_k[:, None]
    log_norm = torch.logsumexp(torch.where(in_k, values, -math.inf), dim=1, keepdim=True)
    probs = torch.exp(values - log_norm)
    keep = torch.minimum(top_k, ((probs >= min_p[:, None] * probs[:, :1]) & in_k).sum(dim=1))
    before = _running_sums(probs) - probs
    reached = ((before < top_p[:, None]) & (rank < keep[:, None])).sum(dim=1).clamp(min=1)
    keep = torch.where(top_p < 1.0, torch.minimum(keep, reached), keep)
    chosen = torch.where(rank < keep[:, None], _drawn(values, gumbels.gather(1, order)), -math.inf)
    return order.gather(1, torch.max(chosen, dim=1, keepdim=True).indices)[:, 0]


SCAN_BLOCK = 1024


def _running_sums(values: torch.Tensor) -> torch.Tensor:
    """cumsum along each row of [R, N] (R > 1: in blocks of SCAN_BLOCK, then the blocks' totals carried: torch's
    scan of a row of many rows walks it in one block of threads, ~0.3 ms at 16 × 154,880 on an H100; the sums are
    the same up to their order, as a GPU's cumsum is to the host's)."""
    rows, n = values.shape
    if rows == 1 or n <= SCAN_BLOCK:
        return torch.cumsum(values, dim=1)
    pad = -n % SCAN_BLOCK
    blocks = torch.nn.functional.pad(values, (0, pad)).view(rows, -1, SCAN_BLOCK).cumsum(dim=2)
    totals = blocks[:, :, -1]
    carried = blocks + (totals.cumsum(dim=1) - totals)[:, :, None]
    return carried.view(rows, -1)[:, :n]


LogprobEntry = tuple[float, tuple[tuple[int, float], ...]]  # a token's log-probability and its top alternatives


DEVICE_ROWS = (
    64  # rows `rows_logprobs` takes in one pass on a GPU (~4 float64 copies at once: ~320 MB at 154,880 tokens)
)


def rows_logprobs(logits: torch.Tensor, tokens: list[int], top: int = 0, rows: int | None = None) -> list[LogprobEntry]:
    """For each i, the log-probability of tokens[i] under row i of `logits` and its `top` most likely tokens with
    theirs, as `token_logprobs` says (that is this for one row): a prompt's rows, for completions' echo, and a decode
    step's drawn rows. On a GPU DEVICE_ROWS rows a pass — one log-softmax, gather and top-k over the block, and one
    host read for all its values (`_device_logprobs`) — where a row at a time is a dozen launches and reads; on the
    host a row at a time (blocks gained nothing there: a row's float64 copy stays in cache). A row of a block is
    normalised and ranked alone, so on the host its values do not depend on the block. `rows`: a pass's rows, if not
    the device's."""
    out: list[LogprobEntry] = []
    step = rows or (1 if logits.is_cpu else DEVICE_ROWS)
    for first in range(0, len(tokens), step):
        wanted = tokens[first : first + step]
        block = logits[first : first + len(wanted)].detach().to(torch.float64)
        if not block.is_cpu:
            out += _device_logprobs(block, wanted, top)
            continue
        if not bool(torch.isfinite(block.sum())):  # NaN, an infinity or an overflowing sum: `finite`'s rows
            block = _finite_rows(block)
        logp = torch.log_softmax(block, dim=1)
        chosen = logp.gather(1, torch.tensor(wanted, device=logp.device)[:, None])[:, 0].tolist()
        if top <= 0:
            out += [(value, ()) for value in chosen]
            continue
        ranked, tied = _top_ranked(logp, top)
        for row in torch.nonzero(tied).reshape(-1).tolist():
            ranked[row] = _ranked(logp[row], ranked.shape[1])
        values = logp.gather(1, ranked)
        out += [(v, tuple(zip(i, lp))) for v, i, lp in zip(chosen, ranked.tolist(), values.tolist())]
    return out


def _top_ranked(logp: torch.Tensor, top: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's `top` best ids by (score desc, id asc), as `_ranked`: top-k's, by id, then by score with ties in
    that order; and whether the next score ties the k-th (top-k then chose among the tied, where `_ranked` takes the
    lowest ids: such a row is ranked again by `_ranked`)."""
    k = min(top, logp.shape[1])
    best, ids = torch.topk(logp, min(k + 1, logp.shape[1]), dim=1)
    ids = ids[:, :k].sort(dim=1).values
    ranked = ids.gather(1, torch.sort(-logp.gather(1, ids), dim=1, stable=True).indices)
    tied = best[:, k] == best[:, k - 1] if k < logp.shape[1] else torch.zeros_like(best[:, 0], dtype=torch.bool)
    return ranked, tied


def _device_logprobs(block: torch.Tensor, tokens: list[int], top: int) -> list[LogprobEntry]:
    """`rows_logprobs` of a float64 block on a GPU with one host read: every row made finite (`_finite_rows`: the
    same values for a row that already is, without the check's read), the chosen values, the tie flags, the ranked
    ids (exact in float64: below 2^53) and their values packed into one tensor; a tied row ranked again alone."""
    logp = torch.log_softmax(_finite_rows(block), dim=1)
    index = to_device(torch.tensor(tokens, dtype=torch.int64), logp.device)
    chosen = logp.gather(1, index[:, None])
    if top <= 0:
        return [(value, ()) for value in chosen[:, 0].tolist()]
    ranked, tied = _top_ranked(logp, top)
    k = ranked.shape[1]
    packed = torch.cat([chosen, tied[:, None].double(), ranked.double(), logp.gather(1, ranked)], dim=1).tolist()
    out: list[LogprobEntry] = []
    for row, values in enumerate(packed):
        ids = [int(i) for i in values[2 : 2 + k]]
        scores = values[2 + k :]
        if values[1]:  # rare: the k-th score ties the next
            again = _ranked(logp[row], k)
            ids, scores = again.tolist(), logp[row][again].tolist()
        out.append((values[0], tuple(zip(ids, scores))))
    return out


def token_logprobs(logits: torch.Tensor, token: int, top: int = 0) -> LogprobEntry:
    """The log-probability of `token` under the model's own distribution (log-softmax of the fp32 logits the
    sampler reads, in float64; before temperature and filters, as vLLM reports by default), and the `top` most
    likely tokens with theirs (ties: lower id first): `rows_logprobs` of the one row."""
    return rows_logprobs(logits.reshape(1, -1), [token], top, rows=1)[0]
