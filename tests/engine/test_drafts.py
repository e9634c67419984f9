"""Exact speculative decoding on the CPU: verify windows, row invariance, commits, copy drafts.

The property everything rests on: a row's logits have the same bits whatever the width of the verify window it is
in and whatever other lanes share the step. Then a draft accepted only when it equals the keyed sample of the row
before it gives the serial reply token for token. These tests check that property directly on tiny random
checkpoints (sparse DSA selection included: the index picks 2 of the pools), then the scheduler's drafted replies
against `"draft": false` on the trained demo, where copy drafts are accepted often.
"""

from __future__ import annotations

import json

import pytest
import torch
from reference import make_reference
from test_parity import prompt

from engine.drafts import CopyDrafter
from engine.models.glm5_next.model import Glm5NextForCausalLM
from engine.parallel import ParallelGroup
from engine.runner.executor import StepExecutor
from engine.runner.lanes import LaneDecoder
from engine.sampling import SamplingParams
from engine.scheduler import Finished, Request, Scheduler

WINDOW = 5
PROMPTS = [(1, 23), (2, 9), (3, 41)]  # (seed, length) of the streams on lanes 0, 1, 2


@pytest.fixture(scope="module", params=["kda3_dsa1", "dsa_heavy"])
def model(request, tmp_path_factory):
    path = tmp_path_factory.mktemp(request.param)
    make_reference(path, request.param, seed=3)
    return Glm5NextForCausalLM.load(path)


def prefilled(model, min_span: int = 0, graphs: bool = False):
    """A fresh decoder (verify windows of WINDOW rows) with PROMPTS prefilled on lanes 0..2 (`graphs`: CUDA graphs,
    tests/gpu)."""
    decoder = LaneDecoder(model, model.make_pool(512, "fp32"), num_lanes=4, graphs=graphs, window=WINDOW)
    if not graphs:
        decoder.min_span, decoder.pad_spans = min_span, min_span > 0
    seqs = []
    for lane, (seed, length) in enumerate(PROMPTS):
        seq = decoder.new_sequence(lane)
        model.prefill(seq, prompt(seed=seed, length=length))
        seqs.append(seq)
    return decoder, seqs


def tokens_for(lane: int, n: int) -> list[int]:
    return prompt(seed=100 + lane, length=n)


def serial_rows(model, lanes: list[int], n: int, graphs: bool = False) -> dict[int, list[torch.Tensor]]:
    """Per lane, the logits of feeding tokens_for(lane) one decode step at a time, the lanes decoded together."""
    decoder, seqs = prefilled(model, graphs=graphs)
    out: dict[int, list[torch.Tensor]] = {lane: [] for lane in lanes}
    for t in range(n):
        logits = decoder.decode([seqs[lane] for lane in lanes], [tokens_for(lane, n)[t] for lane in lanes])
        for row, lane in enumerate(lanes):
            out[lane].append(logits[row])
    return out


@torch.no_grad()
def test_a_rows_logits_do_not_depend_on_window_width_or_neighbours(model, graphs: bool = False):
    alone = serial_rows(model, [0], WINDOW, graphs)[0]
    together = serial_rows(model, [2, 0, 1], WINDOW, graphs)[0]
    for t in range(WINDOW):
        assert torch.equal(alone[t], together[t]), f"decode row {t}: alone vs beside two lanes"
    for width in range(1, WINDOW + 1):
        for neighbours in ([], [1], [2, 1]):
            decoder, seqs = prefilled(model, graphs=graphs)
            lanes = [*neighbours, 0]
            windows = [tokens_for(lane, WINDOW)[: (width if lane == 0 else WINDOW - lane)] for lane in lanes]
            logits = decoder.verify([seqs[lane] for lane in lanes], windows)
            for t in range(width):
                assert torch.equal(logits[len(neighbours), t], alone[t]), (
                    f"row {t} of a window of {width} beside lanes {neighbours}"
                )


@torch.no_grad()
def test_padded_spans_give_the_same_bits(model):
    """Graph-sized spans (a power of two ≥ 64) read more padding than exact spans; the bits must not move."""
    exact = serial_rows(model, [0, 1], 3)
    decoder, seqs = prefilled(model, min_span=64)
    logits = decoder.verify([seqs[0], seqs[1]], [tokens_for(0, 3), tokens_for(1, 3)])
    for t in range(3):
        assert torch.equal(logits[0, t], exact[0][t]) and torch.equal(logits[1, t], exact[1][t])


@torch.no_grad()
def test_a_rejected_draft_leaves_every_state_bit_as_if_never_proposed(model, graphs: bool = False):
    n = 4
    good = tokens_for(0, n)
    # reference: the first two tokens decoded one at a time, then the rest
    ref_decoder, ref_seqs = prefilled(model, graphs=graphs)
    for token in good[:2]:
        ref_decoder.decode([ref_seqs[0]], [token])
    # drafted: one window with the first two tokens right and two wrong drafts after them; keep 2 rows
    decoder, seqs = prefilled(model, graphs=graphs)
    wrong = [(good[2] + 1) % model.cfg.vocab_size, (good[3] + 5) % model.cfg.vocab_size]
    decoder.verify([seqs[0], seqs[1]], [[*good[:2], *wrong], tokens_for(1, 3)])
    decoder.commit(seqs[0], 2)
    decoder.commit(seqs[1], 1)
    assert seqs[0].length == ref_seqs[0].length
    for layer in decoder.state.kda:
        assert torch.equal(decoder.state.kda[layer][0], ref_decoder.state.kda[layer][0]), f"KDA state {layer}"
        assert torch.equal(decoder.state.conv[layer][0], ref_decoder.state.conv[layer][0]), f"conv window {layer}"
    rows = ref_seqs[0].length
    ours = decoder.pool.read(0, decoder.state.slots[0, :rows])
    theirs = ref_decoder.pool.read(0, ref_decoder.state.slots[0, :rows])
    assert torch.equal(ours, theirs), "the cache rows of the kept positions"
    # and the rest decodes alike, bit for bit
    for token in good[2:]:
        a = decoder.decode([seqs[0]], [token])
        b = ref_decoder.decode([ref_seqs[0]], [token])
        assert torch.equal(a, b)


def test_copy_drafter_proposes_what_followed_the_longest_latest_match():
    drafter = CopyDrafter([5, 6, 7, 8, 9, 1, 2, 6, 7, 3, 4, 5, 6, 7])
    # suffix [5, 6, 7] occurred at the start (followed by 8, 9); [6, 7] alone last occurred before 3
    assert drafter.propose(2) == [8, 9]
    assert drafter.propose(0) == []
    drafter.extend([8])
    assert drafter.propose(3) == [9, 1, 2]
    assert CopyDrafter([1, 2, 3]).propose(3) == []  # nothing repeats
    lone = CopyDrafter([4, 4, 4])
    assert lone.propose(5) == [4]  # [4, 4] was followed by the last 4


# -- the serving path: the scheduler with copy drafts against "draft": false, on the trained demo -----------------


@pytest.fixture(scope="module")
def demo():
    from tokenizers import Tokenizer

    from engine.checkpoint.demo import TRAINED

    model = Glm5NextForCausalLM.load(TRAINED)
    tokenizer = Tokenizer.from_file(str(TRAINED / "tokenizer.json"))
    eos = frozenset(json.loads((TRAINED / "config.json").read_text())["text_config"]["eos_token_id"])
    return model, tokenizer, eos


def demo_prompts(tokenizer, count: int) -> list[list[int]]:
    """Rendered chat prompts of the demo's own kinds (tool calls and thinking among them), and copy-heavy ones:
    a list to repeat, text quoted twice, a reply that restates its question."""
    from engine.train import synthetic

    prompts = [tokenizer.encode(synthetic.prompt(e)).ids for e in synthetic.examples("eval", 7, count - 6)]
    words = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu".split()
    for i in range(6):
        listing = " ".join(words[i:] + words[:i])
        text = f"<|user|>repeat: {listing}. again: {listing}. and once more: {listing}<|assistant|></think>"
        prompts.append(tokenizer.encode(text).ids)
    return prompts


def params_for(i: int) -> SamplingParams:
    """Greedy, sampled with a seed, sampled with the prompt-derived seed, filters, lengths — by request index."""
    kind = i % 5
    max_tokens = (8, 24, 40, 64)[i % 4]
    if kind == 0:
        return SamplingParams(temperature=0.0, max_tokens=max_tokens)
    if kind == 1:
        return SamplingParams(temperature=0.7, top_p=0.9, seed=1000 + i, max_tokens=max_tokens)
    if kind == 2:
        return SamplingParams(temperature=1.0, top_k=20, seed=i, max_tokens=max_tokens)
    if kind == 3:
        return SamplingParams(temperature=0.5, min_p=0.05, seed=0, max_tokens=max_tokens)
    return SamplingParams(temperature=0.0, top_k=1, max_tokens=max_tokens)


def serve(
    model, eos, prompts, draft: bool, parallel: int, stagger: bool, graphs: bool = False, drafter: str = "copy"
) -> tuple[list[list[int]], dict]:
    """Every prompt through a real Scheduler + StepExecutor (the server's path minus HTTP); per request its
    tokens, and the scheduler's draft counts."""
    from test_scheduler import Collector

    executor = StepExecutor(model, model.make_pool(4096, "fp32"), lanes=parallel, graphs=graphs, window=4)
    sched = Scheduler(
        executor,
        ParallelGroup.single(),
        parallel=parallel,
        max_queued=len(prompts),
        prefill_chunk=32,
        heartbeat_s=0.05,
        drafter=drafter,
        draft_tokens=3,
    )
    sched.start()
    sinks = []
    try:
        for i, ids in enumerate(prompts):
            sink = Collector()
            sched.submit(Request(f"r{i}", ids, params_for(i), sink, eos, draft=draft))
            sinks.append(sink)
            if stagger and i % 3 == 2:
                assert sink.done.wait(120)
        for sink in sinks:
            assert sink.done.wait(300)
            assert isinstance(sink.end, Finished), sink.end
    finally:
        sched.stop()
    assert executor.pool.free_tokens == executor.pool.num_tokens
    return [sink.tokens for sink in sinks], sched.stats()["drafts"]


@torch.no_grad()
@pytest.mark.parametrize("parallel,stagger", [(4, False), (3, True), (1, False)])
def test_drafted_replies_equal_serial_replies(demo, parallel, stagger, graphs: bool = False):
    model, tokenizer, eos = demo
    prompts = demo_prompts(tokenizer, 24 if parallel > 1 else 12)
    serial, none = serve(model, eos, prompts, draft=False, parallel=parallel, stagger=stagger, graphs=graphs)
    drafted, counts = serve(model, eos, prompts, draft=True, parallel=parallel, stagger=stagger, graphs=graphs)
    assert none["drafted"] == 0
    for i, (a, b) in enumerate(zip(serial, drafted)):
        assert a == b, f"request {i} ({params_for(i)})"
    assert counts["accepted"] > 0 and counts["drafted"] > counts["accepted"], counts  # both outcomes happened
    assert counts["committed"] > counts["windows"]  # some steps committed more than one token


def test_pool_sizing_leaves_room_for_the_lane_states(model):
    """The lane states (KDA state and conv window per lane, per verify row with drafts, and the slot table) come out
    of the same memory as the pool: size_pool is told what they take, so the pool is smaller by exactly that."""
    from engine.cache import lane_state_bytes
    from engine.config import EngineConfig
    from engine.runner.lanes import LaneDecoder
    from engine.serve import size_pool

    shapes = model.kda_state_shapes()
    fixed, per_token = lane_state_bytes(shapes, 3, 4)
    decoder = LaneDecoder(model, model.make_pool(64, "fp32"), 3, graphs=False, window=4)
    held = sum(t.numel() * t.element_size() for d in (decoder.state.kda, decoder.state.conv) for t in d.values())
    held += sum(
        t.numel() * t.element_size() for d in (decoder.state.kda_rows, decoder.state.conv_rows) for t in d.values()
    )
    assert fixed == held and per_token * 64 == decoder.state.slots.numel() * 8
    assert lane_state_bytes(shapes, 3, 1)[0] == fixed // 5  # no verify rows without drafts

    cfg = EngineConfig("unused", memory_reserve_gib=0.0, context=64, parallel=3, prompt_reuse=False)
    import engine.serve as serve

    original = serve.available_bytes
    serve.available_bytes = lambda device: 10 * fixed
    bpt = fixed // 12  # ~120 tokens' worth of memory: below the streams' cap of 3 x 64
    try:
        plain = size_pool(cfg, bpt, "cpu", ParallelGroup.single())
        with_lanes = size_pool(cfg, bpt, "cpu", ParallelGroup.single(), (fixed, per_token))
    finally:
        serve.available_bytes = original
    assert plain == (64, 10 * fixed // bpt)
    assert with_lanes == (64, 9 * fixed * bpt // (bpt + per_token) // bpt)
    assert 64 <= with_lanes[1] < plain[1] < 192  # the memory, not the streams' cap, set both
