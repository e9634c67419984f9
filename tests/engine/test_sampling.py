"""Keyed sampling: bit-exact hash, determinism, batch independence, and the filters' effect on what can be drawn."""

from __future__ import annotations

import math
from collections import Counter

import pytest
import torch

from engine import sampling
from engine.sampling import (
    DEVICE_ROWS,
    PRUNE,
    PRUNE_BITS,
    SamplingParams,
    _all_finite,
    _candidates,
    _gumbel_max,
    finite,
    first_max,
    gumbel,
    noise,
    prompt_seed,
    row_key,
    rows_logprobs,
    sample,
    splitmix64,
    splitmix64_tensor,
    token_logprobs,
    top_bits,
    uniforms,
)


def test_torch_hash_matches_reference_bits() -> None:
    values = [0, 1, 2, 12345, 2**31 - 1, 2**40 + 7, 154879]
    got = splitmix64_tensor(torch.tensor(values, dtype=torch.int64)).tolist()
    want = [splitmix64(v) for v in values]
    assert [g & (2**64 - 1) for g in got] == want
    # a published splitmix64 value (seed state 0 -> first output) pins the constants
    assert splitmix64(0) == 0xE220A8397B1DCDAF


def test_uniforms_in_the_unit_interval_and_roughly_uniform() -> None:
    u = uniforms(7, 3, torch.arange(20000))
    assert float(u.min()) > 0.0 and float(u.max()) < 1.0
    assert abs(float(u.mean()) - 0.5) < 0.01
    assert not torch.equal(u, uniforms(7, 4, torch.arange(20000)))
    assert not torch.equal(u, uniforms(8, 3, torch.arange(20000)))


def test_noise_of_a_token_does_not_depend_on_which_other_tokens_are_scored() -> None:
    ids = torch.tensor([5, 900, 42])
    alone = gumbel(11, 99, torch.tensor([900]))
    assert float(gumbel(11, 99, ids)[1]) == float(alone[0])
    assert row_key(1, 2) != row_key(2, 1)


def test_greedy_is_argmax_with_lowest_id_on_ties() -> None:
    logits = torch.tensor([0.0, 3.0, 3.0, -1.0])
    assert sample(logits, SamplingParams(temperature=0.0), 0) == 1
    assert sample(logits, SamplingParams(temperature=1.0, top_k=1), 0) == 1


def test_same_key_same_token_different_positions_vary() -> None:
    logits = torch.zeros(1000)
    params = SamplingParams(temperature=1.0, seed=3)
    assert sample(logits, params, 10) == sample(logits.clone(), params, 10)
    assert len({sample(logits, params, p) for p in range(50)}) > 30


def test_draws_follow_the_softmax() -> None:
    logits = torch.log(torch.tensor([0.6, 0.3, 0.1]))
    counts = Counter(sample(logits, SamplingParams(seed=s), 0) for s in range(3000))
    for token, p in enumerate((0.6, 0.3, 0.1)):
        assert math.isclose(counts[token] / 3000, p, abs_tol=0.04)


def test_filters_limit_the_candidates() -> None:
    logits = torch.log(torch.tensor([0.5, 0.25, 0.15, 0.1]))

    def drawn(**kw: float) -> set[int]:
        return {sample(logits, SamplingParams(seed=s, **kw), 0) for s in range(400)}

    assert drawn() == {0, 1, 2, 3}
    assert drawn(top_k=2) == {0, 1}
    assert drawn(top_p=0.6) == {0, 1}  # 0.5 alone is below 0.6, so the second token is needed
    assert drawn(top_p=0.5) == {0}
    assert drawn(min_p=0.35) == {0, 1}  # 0.15 < 0.35 * 0.5
    assert drawn(temperature=0.05) == {0}


def test_prompt_seed_is_stable_and_prompt_specific() -> None:
    assert prompt_seed([1, 2, 3]) == prompt_seed([1, 2, 3])
    assert prompt_seed([1, 2, 3]) != prompt_seed([1, 2, 4])


def _full_sort_sample(logits: torch.Tensor, params: SamplingParams, position: int) -> int:
    """The filters written the plain way (rank the whole vocabulary), to check the fast path against."""
    from engine.sampling import gumbel

    scaled = logits.to(torch.float64) / params.temperature
    order = torch.sort(-scaled, stable=True).indices
    values = scaled[order]
    keep = min(values.shape[0], params.top_k) if params.top_k > 0 else values.shape[0]
    probs = torch.softmax(values[:keep], dim=0)
    if params.min_p > 0.0:
        keep = min(keep, int((probs >= params.min_p * probs[0]).sum()))
    if params.top_p < 1.0:
        before = torch.cumsum(probs[:keep], dim=0) - probs[:keep]
        keep = min(keep, max(1, int((before < params.top_p).sum())))
    ids = order[:keep]
    return int(ids[int(torch.argmax(values[:keep] + gumbel(params.seed, position, ids)))])


@pytest.mark.parametrize(
    "top_k,top_p,min_p",
    [(0, 1.0, 0.0), (20, 1.0, 0.0), (0, 0.95, 0.0), (0, 1.0, 0.05), (40, 0.9, 0.02), (0, 0.9999, 0.0), (0, 1.0, 1e-7)],
)
def test_fast_filters_equal_the_full_sort(top_k: int, top_p: float, min_p: float) -> None:
    """Only as many top tokens as the filters need are ranked; the draw must equal ranking everything."""
    gen = torch.Generator().manual_seed(5)
    for trial in range(6):
        logits = torch.randn(5000, generator=gen) * (1 + trial)  # from flat to peaked distributions
        params = SamplingParams(temperature=0.8, top_p=top_p, top_k=top_k, min_p=min_p, seed=trial)
        for position in (0, 7, 1000):
            assert sample(logits, params, position) == _full_sort_sample(logits, params, position)


def test_top_bits_are_the_hash_top_bits() -> None:
    """`top_bits` works the hash in place; its values are `splitmix64_tensor`'s top 53 bits of id ^ row key."""
    ids = torch.tensor([0, 1, 2, 77, 154879, 2**40 + 3])
    key = row_key(9, 1234) - (1 << 64 if row_key(9, 1234) >= 1 << 63 else 0)
    want = [(v & (2**64 - 1)) >> 11 for v in splitmix64_tensor(ids ^ key).tolist()]
    assert top_bits(9, 1234, ids).tolist() == want


def _every_token_noised(scaled: torch.Tensor, seed: int, position: int) -> int:
    """The whole-vocabulary draw the plain way: noise for every token, then argmax."""
    return int(torch.argmax(scaled + gumbel(seed, position, torch.arange(scaled.numel()))))


@pytest.mark.parametrize("prune", [0.25, 2.0, PRUNE])
def test_the_pruned_whole_vocabulary_draw_is_the_plain_one(prune: float) -> None:
    """`_gumbel_max` makes noise only for `_candidates`: the same token as noising every one, on flat and peaked
    rows, rows of ties (integer logits), rows with impossible (-inf) tokens and rows of huge magnitude (a tiny
    temperature's); a small `prune` keeps many tokens by their hash alone, the served one mostly by their scores."""
    gen = torch.Generator().manual_seed(11)
    for trial in range(60):
        vocab = (2, 64, 1000, 20000)[trial % 4]
        scaled = torch.randn(vocab, generator=gen, dtype=torch.float64) * (0.1, 1.0, 4.0, 30.0, 1e17, 1e300)[trial % 6]
        if trial % 5 == 0:
            scaled = scaled.round()
        if trial % 7 == 0:
            scaled[1::3] = -math.inf
        for position in (0, 5 + trial):
            assert _gumbel_max(scaled, trial, position, prune) == _every_token_noised(scaled, trial, position)


def test_the_candidates_are_few_and_hold_every_maximum() -> None:
    """On a language model's row (a bulk, a few raised tokens) the candidates are a small share of the vocabulary;
    a token exactly at the threshold and tokens tied at the top are among them."""
    gen = torch.Generator().manual_seed(2)
    scaled = torch.randn(154_880, generator=gen, dtype=torch.float64) * 2.5 - 2.0
    scaled[torch.randperm(154_880, generator=gen)[:40]] += torch.linspace(25.0, 8.0, 40, dtype=torch.float64)
    top53 = top_bits(1, 2, torch.arange(154_880))
    ids = _candidates(scaled, top53)
    assert 0 < ids.numel() < 154_880 // 50 and bool((ids[1:] > ids[:-1]).all())
    full = scaled + noise(top53)
    assert set(torch.nonzero(full == full.max()).reshape(-1).tolist()) <= set(ids.tolist())
    best = int(torch.argmax(scaled))
    level = float(scaled[best] + noise(top53[best : best + 1])[0])
    edge = int(ids[0]) + 1 if int(ids[0]) + 1 not in ids.tolist() else int(ids[-1]) - 1
    scaled[edge] = level - PRUNE + 1e-3  # within reach: kept by its score
    assert edge in _candidates(scaled, top53).tolist()


def _hashes(monkeypatch: pytest.MonkeyPatch, values: list[int]) -> None:
    """Every row's token hashes replaced by `values` (token id -> its 53 bits): to place the rare ones."""
    table = torch.tensor(values, dtype=torch.int64)
    monkeypatch.setattr(sampling, "top_bits", lambda seed, position, token_ids: table[token_ids.to(torch.int64)])


@pytest.mark.parametrize("params", [SamplingParams(temperature=1.0), SamplingParams(temperature=0.8, top_k=4)])
def test_infinite_noise_wins_among_possible_tokens_only(monkeypatch: pytest.MonkeyPatch, params) -> None:
    """The largest 53-bit value makes u = 1 and the noise +inf: on a possible token it wins (the first such), on an
    impossible one (-inf: a format's mask, NaN) it does not — through the whole draw, pruned or filtered."""
    top = (1 << 53) - 1
    _hashes(monkeypatch, [top, 3, 2**52, top, 7, 2**52])
    row = torch.tensor([-math.inf, 0.5, 0.2, 0.1, math.nan, 3.0])
    assert sample(row, params, 0) == 3
    assert sample(torch.tensor([-math.inf, 0.5, 0.2, -math.inf, 0.0, 3.0]), params, 0) == 5
    assert noise(torch.tensor([top]))[0] == math.inf and float(noise(torch.tensor([PRUNE_BITS]))[0]) < PRUNE - 1e-6


def test_infinities_rank_as_the_docstring_says() -> None:
    """`finite` keeps the infinities' meaning (torch's nan_to_num would clamp them to the largest finite value): +inf
    tokens are the only possible ones, drawn among uniformly; a row with nothing possible is uniform."""
    assert finite(torch.tensor([1.0, -math.inf, math.nan])).tolist() == [1.0, -math.inf, -math.inf]
    assert finite(torch.tensor([math.inf, 1.0, math.inf])).tolist() == [0.0, -math.inf, 0.0]
    assert finite(torch.tensor([-math.inf, -math.inf])).tolist() == [0.0, 0.0]
    plus = torch.tensor([math.inf, 1.0, math.inf, 2.0])
    assert {sample(plus, SamplingParams(seed=s), 0) for s in range(40)} == {0, 2}
    assert len({sample(torch.full((5,), -math.inf), SamplingParams(seed=s), 0) for s in range(60)}) == 5


def test_greedy_rows_in_their_own_type() -> None:
    """An all-finite row is ranked as it is (fp32, fp16, bf16: widening is exact); NaN, or an infinite logit, goes
    through `finite` as before."""
    row = torch.tensor([0.5, 3.0, 3.0, -1.0])
    for dtype in (torch.float32, torch.float16, torch.bfloat16, torch.float64):
        assert sample(row.to(dtype), SamplingParams(temperature=0.0), 0) == 1
    assert sample(torch.tensor([1.0, math.nan, 0.5]), SamplingParams(temperature=0.0), 0) == 0
    assert sample(torch.tensor([1.0, math.inf, math.inf]), SamplingParams(temperature=0.0), 0) == 1
    assert sample(torch.tensor([-math.inf, -math.inf]), SamplingParams(temperature=0.0), 0) == 0


def test_first_max_is_argmax_on_ties_and_at_the_served_width() -> None:
    """`first_max` (torch.max over the dimension) gives argmax's first index."""
    gen = torch.Generator().manual_seed(3)
    for vocab in (1, 7, 154_880):
        for scale in (0.5, 3.0):
            row = (torch.randn(vocab, generator=gen) * scale).round()  # many ties at the top
            assert first_max(row) == int(torch.argmax(row))
            assert first_max(row.double()) == int(torch.argmax(row.double()))
    row = torch.zeros(154_880)
    row[[150_000, 80_000, 120_000]] = 2.0
    assert first_max(row) == 80_000


def test_the_finite_check_falls_back_where_the_sum_cannot_say() -> None:
    """The one-pass check is a sum: an overflowing sum of finite scores (fp64, fp16) and a sum of +inf and -inf
    (NaN) are checked score by score."""
    assert _all_finite(torch.tensor([1e308, 1e308, -5.0], dtype=torch.float64))
    assert _all_finite(torch.tensor([60000.0, 60000.0], dtype=torch.float16))
    assert not _all_finite(torch.tensor([math.inf, -math.inf, 0.0]))
    assert not _all_finite(torch.tensor([1.0, math.nan]))
    huge = torch.tensor([1e308, 1e308, -5.0], dtype=torch.float64)
    assert finite(huge) is huge
    assert sample(torch.tensor([3e38, 3e38, 1.0]), SamplingParams(temperature=0.0), 0) == 0


def _plain_logprobs(row: torch.Tensor, token: int, top: int) -> tuple[float, tuple[tuple[int, float], ...]]:
    """A row's log-probabilities written the plain way: the row made finite, a log-softmax, the whole vocabulary
    ranked by (log-probability desc, id asc)."""
    logp = torch.log_softmax(finite(row.detach().to(torch.float64).reshape(-1)), dim=0)
    ids = torch.sort(-logp, stable=True).indices[: min(top, logp.numel())] if top > 0 else []
    return float(logp[token]), tuple((int(i), float(logp[i])) for i in ids)


@pytest.mark.parametrize("rows", [None, 3, DEVICE_ROWS])
def test_a_prompts_logprobs_in_blocks_are_each_rows_own(rows: int | None) -> None:
    """`rows_logprobs` (a prompt's rows for completions' echo; blocks of DEVICE_ROWS on a GPU, a row at a time on
    the host; `token_logprobs` is its one-row form) gives each row's values written the plain way, exactly: ties at
    the top ranked by id, rows with NaN, an infinity or an overflowing sum taken as `finite` takes them, a `top`
    beyond the vocabulary."""
    gen = torch.Generator().manual_seed(4)
    for vocab, count in ((50, 70), (3000, 9)):
        x = torch.randn(count, vocab, generator=gen) * 3
        x[::5] = x[::5].round()
        x[3, 7], x[4, 2], x[6] = math.nan, math.inf, -math.inf
        x[8, :3] = 3e38
        tokens = torch.randint(0, vocab, (count,), generator=gen).tolist()
        for top in (0, 1, 5, vocab + 3):
            want = [_plain_logprobs(x[i], tokens[i], top) for i in range(count)]
            assert rows_logprobs(x, tokens, top, rows) == want
            assert [token_logprobs(x[i], tokens[i], top) for i in range(count)] == want
    assert rows_logprobs(torch.zeros(2, 4), [1], 2) == [_plain_logprobs(torch.zeros(4), 1, 2)]  # rows past the tokens
    assert rows_logprobs(torch.zeros(2, 4), [], 2, rows) == []
    odd = torch.randn(4, 300, generator=gen, dtype=torch.float64)
    odd[0, :2] = 1e308  # a float64 sum that overflows: every score finite all the same
    odd[1] = math.nan
    for row in (odd, odd.to(torch.bfloat16)):
        tokens = [0, 1, 2, 3]
        assert rows_logprobs(row, tokens, 4, rows) == [_plain_logprobs(row[i], tokens[i], 4) for i in range(4)]


def test_the_gpus_one_read_logprobs_are_each_rows_own() -> None:
    """The GPU's form of a block's log-probabilities (`_device_logprobs`: every row made finite without a check,
    the values, tie flags, ranked ids and their values read at once; run here on the CPU) gives each row's values
    written the plain way, exactly: ties at the k-th score (ranked again alone), NaN, infinities, overflowing sums,
    a `top` beyond the vocabulary."""
    gen = torch.Generator().manual_seed(5)
    for vocab, count in ((50, 12), (3000, 9)):
        x = torch.randn(count, vocab, generator=gen) * 3
        x[::5] = x[::5].round()  # ties, some at the k-th score
        x[3, 7], x[4, 2], x[6] = math.nan, math.inf, -math.inf
        x[8, :3] = 3e38
        x[1, :10] = 9.0  # ten tied at the top: a cut at 1 or 5 goes through them
        tokens = torch.randint(0, vocab, (count,), generator=gen).tolist()
        for top in (0, 1, 5, vocab + 3):
            want = [_plain_logprobs(x[i], tokens[i], top) for i in range(count)]
            assert sampling._device_logprobs(x.double(), tokens, top) == want, (vocab, top)


def test_a_top_k_cut_through_ties_keeps_the_lowest_ids() -> None:
    """Tokens tied at the k-th score: the ranking is (score desc, id asc), so the cut keeps the lowest of them
    (top-k alone may pick any), in sampling and in the reported top tokens alike."""
    row = torch.tensor([1.0] * 50 + [3.0] * 30 + [0.0] * 20)
    drawn = {sample(row, SamplingParams(temperature=1.0, top_k=4, seed=s), 0) for s in range(200)}
    assert drawn == {50, 51, 52, 53}
    assert [t for t, _ in token_logprobs(row, 0, 3)[1]] == [50, 51, 52]
    assert [[t for t, _ in best] for _, best in rows_logprobs(row.expand(3, -1), [0, 0, 0], 2, rows=3)] == [
        [50, 51]
    ] * 3


ROW_PARAMS = [
    SamplingParams(temperature=0.0),
    SamplingParams(temperature=1.0, top_k=1),
    SamplingParams(temperature=1.0, seed=3),
    SamplingParams(temperature=0.6, seed=4),
    SamplingParams(temperature=1.0, top_p=0.95, seed=5),
    SamplingParams(temperature=0.7, top_p=0.5, seed=11),
    SamplingParams(temperature=0.7, top_k=40, seed=6),
    SamplingParams(temperature=0.6, top_p=0.95, top_k=20, seed=7),
    SamplingParams(temperature=1.0, min_p=0.05, seed=8),
    SamplingParams(temperature=1.3, min_p=0.2, top_p=0.8, top_k=500, seed=9),
    SamplingParams(temperature=1.0, top_p=0.0, seed=10),
    SamplingParams(temperature=1e-6, top_p=0.9, seed=12),
    SamplingParams(temperature=math.inf, top_k=7, seed=13),
    SamplingParams(temperature=2.0, top_k=10**9, min_p=1.0, seed=14),
    SamplingParams(temperature=0.9, top_k=10**19, top_p=0.9, seed=15),  # past int64 (the API bounds it below only)
]


def _odd_rows(count: int, vocab: int, gen: torch.Generator) -> torch.Tensor:
    """Rows shaped like a language model's (a bulk and a few raised tokens) and rows the sampler must survive:
    ties at the top, a format's mask, NaN, +inf, nothing possible, huge logits, a flat row, bf16-like rounding."""
    rows = torch.randn(count, vocab, generator=gen) * 2.5 - 2.0
    for i in range(count):
        rows[i, torch.randperm(vocab, generator=gen)[:20]] += 20.0 * (i % 4) / 3
    rows[0, [3, vocab - 5]] = 40.0
    rows[1, ::2] = -math.inf
    rows[2, 5::7] = math.nan
    rows[3, 1::9] = math.inf
    rows[4] = -math.inf
    rows[5, : vocab // 3] *= 1e30
    rows[6] = 0.0
    rows[7] = rows[7].round()
    return rows


@pytest.mark.parametrize("vocab", [300, 5000, 154_880])
def test_a_steps_rows_sampled_together_are_each_rows_own(vocab: int) -> None:
    """The GPU's form of a decode step's draw (`_device_rows`: the rows together, one stable sort for the filters,
    their cuts as counts) gives each row the token `sample` gives it alone, for every parameter kind, at each
    position, on ordinary rows and odd ones; run here on the CPU (the GPU test runs it on a GPU)."""
    gen = torch.Generator().manual_seed(vocab)
    rows = _odd_rows(10 if vocab > 10_000 else 24, vocab, gen)
    for position in (0, 77):
        for params in ROW_PARAMS:
            each = [params] * rows.shape[0]
            want = [sample(row, params, position + i) for i, row in enumerate(rows)]
            positions = [position + i for i in range(rows.shape[0])]
            assert sampling._device_rows(rows, each, positions) == want, params
    mixed = [ROW_PARAMS[i % len(ROW_PARAMS)] for i in range(rows.shape[0])]
    positions = list(range(5, 5 + rows.shape[0]))
    want = [sample(row, p, q) for row, p, q in zip(rows, mixed, positions)]
    assert sampling._device_rows(rows, mixed, positions) == want
    assert sampling.sample_rows(rows, mixed, positions) == want  # the host's form: a row at a time
    for i in range(rows.shape[0]):  # one row alone (the scheduler's prompt rows and rows under a format)
        assert sampling._device_rows(rows[i : i + 1], mixed[i : i + 1], positions[i : i + 1]) == want[i : i + 1]
    wide = rows.double()
    wide[5, :5] = torch.tensor(
        [1.7e308, -1.7e308, 1.5e308, 3.0, 1.7e308], dtype=torch.float64
    )  # overflows at its temperature, 0.7
    narrow = rows.to(torch.bfloat16)
    for given in (wide, narrow):
        for shift in range(4):  # row 5's draw among its three overflowed tokens, at several positions
            at = [q + shift for q in positions]
            want = [sample(row, p, q) for row, p, q in zip(given, mixed, at)]
            assert sampling._device_rows(given, mixed, at) == want, (given.dtype, shift)


@pytest.mark.parametrize("vocab", [300, 5000])
def test_a_graphed_pass_ranks_every_row_and_pads_without_effect(vocab: int) -> None:
    """The form a CUDA graph replays (`_picks` with `filtered` and no subset: every row ranked and cut, each row's
    pick chosen by its flags), over a table padded with other rows and other parameters (what a bucket's input
    holds past a pass's rows): each real row gets `sample`'s token alone, for fp32, bf16 and float64 rows."""
    gen = torch.Generator().manual_seed(vocab + 1)
    rows = _odd_rows(12, vocab, gen)
    mixed = [ROW_PARAMS[(3 * i) % len(ROW_PARAMS)] for i in range(rows.shape[0])]
    stale = _odd_rows(8, vocab, gen)[3:7] * 3.0  # a padding row's values and knobs: whatever the last pass left
    stale_params = [SamplingParams(temperature=0.3, top_p=0.5, top_k=7, seed=99)] * 4
    for given in (rows, rows.to(torch.bfloat16), rows.double()):
        positions = [40 + 2 * i for i in range(rows.shape[0])]
        want = [sample(row, sampling.clean(p), q) for row, p, q in zip(given, mixed, positions)]
        table = torch.cat([given, stale.to(given.dtype)])
        knobs = sampling._knobs([sampling.clean(p) for p in mixed + stale_params], positions + [0, 1, 2, 3], vocab)
        picks = sampling._picks(table, knobs, greedy=True, filtered=True)
        assert picks[: rows.shape[0]].tolist() == want, given.dtype
        alone = sampling._picks(given[2:3], knobs[2:3], greedy=True, filtered=True)  # a bucket of one, padded to none
        assert alone.tolist() == want[2:3]


def test_the_blocked_running_sums_are_cumsums() -> None:
    """`_running_sums` (blocks, then their totals carried) gives cumsum's sums: exactly on integers, to rounding on
    reals, for a row shorter than a block, one that ends mid-block and a single row."""
    gen = torch.Generator().manual_seed(3)
    for rows, n in ((3, 5000), (2, 1024), (4, 700), (1, 3000), (5, 2 * sampling.SCAN_BLOCK + 1)):
        ints = torch.randint(0, 1000, (rows, n), generator=gen).double()
        assert torch.equal(sampling._running_sums(ints), torch.cumsum(ints, dim=1))
        reals = torch.rand(rows, n, generator=gen, dtype=torch.float64)
        assert torch.allclose(sampling._running_sums(reals), torch.cumsum(reals, dim=1), rtol=1e-12, atol=0)
