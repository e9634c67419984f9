"""Exact speculative decoding on the CPU: verify windows, row invariance, commits, copy drafts.

The property everything rests on: a row's logits have the same bits whatever the width of the verify window it is
in and whatever other lanes share the step. Then a draft accepted only when it equals the keyed sample of the row
before it gives the serial reply token for token. These tests check that property directly on tiny random
checkpoints (sparse DSA selection included: the index picks 2 of the pools), then the scheduler's drafted replies
against `"draft": false` on the trained demo, where copy drafts are accepted often, read through the server's
`Generation` (text, finish reason, and stop strings, one of which must cut inside a verify window).
"""

from __future__ import annotations

import asyncio
import json
import threading
from dataclasses import dataclass, field
from types import SimpleNamespace

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
from engine.scheduler import Failed, Finished, Request, Scheduler, Token
from engine.server.generation import Delta, End, Generation, IncrementalDecoder
from engine.server.metrics import Metrics

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
    # continued by drafts already chosen (a format's forced text): the suffix runs on through them
    after = CopyDrafter([5, 6, 7, 8, 9, 1, 2, 6, 7])
    assert after.propose(2) == [8, 9] and after.propose(2, after=[8]) == [9, 1]
    assert after.propose(3, after=[8, 9, 1]) == [2, 6, 7] and after.propose(2, after=[3, 3]) == []


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


@dataclass
class Reply:
    """One reply as a client sees it (the server's asyncio side: incremental text, stop strings), and when the
    scheduler made each token it sent (replies compare by what a client sees only)."""

    tokens: list[int]
    text: str
    finish: str
    stop: str | None = None  # the stop string that ended it
    # per token sent, past a stop string too: the scheduler step that made it (a verify window's tokens share one)
    steps: list[int] = field(default_factory=list, compare=False)
    # (drafted, accepted) of its verify windows when its end was sent: the earliest its usage can read them
    drafts: tuple[int, int] | None = field(default=None, compare=False)
    # what its usage reports (`Generation.draft_counts` at its end), and the counts each token came with
    usage: tuple[int, int] = field(default=(0, 0), compare=False)
    carried: list[tuple[int, int]] = field(default_factory=list, compare=False)


class Recorded:
    """The scheduler as `Generation` sees it, recording per request the step of every token it is sent, and when it
    ends (a stop string cancels its request; the lane must be free again before the run stops)."""

    def __init__(self, scheduler: Scheduler) -> None:
        self.scheduler = scheduler
        self.steps: dict[str, list[int]] = {}
        self.ended: list[threading.Event] = []
        self.counts_at_end: dict[str, tuple[int, int]] = {}  # (drafted, accepted) as its end is sent
        self.carried: dict[str, list[tuple[int, int]]] = {}  # per token sent: the counts it came with

    def submit(self, request: Request) -> None:
        steps, ended, sink = self.steps.setdefault(request.id, []), threading.Event(), request.sink
        carried = self.carried.setdefault(request.id, [])

        def record(event: object) -> None:  # on the scheduler's thread, inside the step's `_apply`
            if isinstance(event, Token):
                steps.append(self.scheduler.totals["steps"])
                carried.append(event.drafts)
            elif isinstance(event, (Finished, Failed)):
                self.counts_at_end[request.id] = (request.drafted, request.accepted)  # what its usage can read
                ended.set()
            sink(event)

        self.ended.append(ended)
        request.sink = record
        self.scheduler.submit(request)

    def cancel(self, request_id: str) -> None:
        self.scheduler.cancel(request_id)


def serve(
    demo,
    prompts: list[list[int]],
    draft: bool,
    parallel: int,
    stagger: bool,
    graphs: bool = False,
    drafter: str = "copy",
    stops: dict[int, list[str]] | None = None,
    pause: float = 0.0,
) -> tuple[list[Reply], dict]:
    """Requests through a real Scheduler + StepExecutor and the server's `Generation` (detokenising, stop strings,
    cancelling): the server's path minus HTTP. Request i is prompts[i] with params_for(i); `stops` maps the requests
    to serve to their stop strings (default: every prompt, none); `pause`: seconds a client waits after the first
    text it reads (a reader fallen behind: the scheduler runs ahead of what it has seen). Per request its reply,
    and the draft counts."""
    model, tokenizer, eos = demo
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
    recorded = Recorded(sched)
    state = SimpleNamespace(scheduler=recorded, tokenizer=tokenizer, metrics=Metrics(), eos_ids=eos)
    cases = sorted(stops.items()) if stops is not None else [(i, []) for i in range(len(prompts))]
    sched.start()
    try:
        replies = asyncio.run(replies_of(state, prompts, cases, draft, stagger, pause))
    finally:
        sched.stop()
    assert executor.pool.free_tokens == executor.pool.num_tokens
    return replies, sched.stats()["drafts"]


async def replies_of(
    state, prompts, cases: list[tuple[int, list[str]]], draft: bool, stagger: bool, pause: float = 0.0
) -> list[Reply]:
    async def reply(generation: Generation) -> Reply:
        text, end = "", None
        async for event in generation.events():
            if isinstance(event, Delta):
                if not text:
                    await asyncio.sleep(pause)
                text += event.text
            elif isinstance(event, End):
                end = event
        assert end is not None
        steps = state.scheduler.steps[generation.request_id]
        drafts = state.scheduler.counts_at_end.get(generation.request_id)  # None: a stop string ended it first
        carried = state.scheduler.carried[generation.request_id]
        return Reply(
            list(generation.token_ids), text, end.finish_reason, end.stop_string, steps, drafts,
            generation.draft_counts, carried,
        )  # fmt: skip

    tasks = []
    for n, (i, stop) in enumerate(cases):
        generation = Generation(state, prompts[i], params_for(i), stop=stop, draft=draft)
        generation.start()
        tasks.append(asyncio.create_task(reply(generation)))
        if stagger and n % 3 == 2:
            await asyncio.wait_for(asyncio.shield(tasks[-1]), 120)
    replies = await asyncio.wait_for(asyncio.gather(*tasks), 300)
    ended = state.scheduler.ended  # the requests stop strings cancelled too, each lane released
    assert await asyncio.to_thread(lambda: all(event.wait(60) for event in ended))
    return list(replies)


@dataclass
class StopCase:
    stops: list[str]
    expected: Reply  # the reply without stop strings, cut where the stop string completes
    inside_window: bool  # the token completing it was committed by a verify window with more tokens after it


def stop_at(tokenizer, reply: Reply, k: int) -> tuple[str, Reply] | None:
    """A stop string that reply token k completes: the shortest tail (4 characters or more, where there are) of the
    text after token k that occurs nowhere earlier; and the reply it gives. None where token k adds no text."""
    decoder, texts = IncrementalDecoder(tokenizer), [""]
    for token in reply.tokens[: k + 1]:  # the text after each token, detokenised as the server does
        texts.append(texts[-1] + decoder.push(token))
    text = texts[-1]
    if len(text) == len(texts[-2]):
        return None
    n = next(n for n in range(min(4, len(text)), len(text) + 1) if text.find(text[-n:]) == len(text) - n)
    return text[-n:], Reply(reply.tokens[: k + 1], text[:-n], "stop", text[-n:])


def stop_cases(tokenizer, drafted: list[Reply]) -> dict[int, StopCase]:
    """Stop strings taken from the drafted replies' own text (equal to the serial ones), so each occurs: for up to
    three requests, completed by a token a verify window committed with more after it (the nearest such token to the
    middle); for three others, greedy and sampled, completed mid-reply, one listed after a string that never occurs."""
    cases: dict[int, StopCase] = {}
    for i, reply in enumerate(drafted):
        inside = [k for k in range(len(reply.tokens) - 1) if reply.steps[k] == reply.steps[k + 1]]
        for k in sorted(inside, key=lambda k: abs(k - len(reply.tokens) // 2)):
            if len(cases) < 3 and (found := stop_at(tokenizer, reply, k)) is not None:
                cases[i] = StopCase([found[0]], found[1], inside_window=True)
                break
    others = 0
    for i, reply in enumerate(drafted):
        if others < 3 and i not in cases and len(reply.tokens) >= 4:
            found = stop_at(tokenizer, reply, len(reply.tokens) // 2)
            if found is not None:
                never = "\u2603 no such text"
                stops = [never, found[0]] if others == 2 else [found[0]]
                cases[i] = StopCase(stops, found[1], inside_window=False)
                others += 1
    return cases


def check_stop_strings(demo, prompts, drafted: list[Reply], parallel, stagger, graphs, drafter) -> None:
    """Stop strings cut a drafted reply where they cut the serial one: the same tokens (up to the one completing the
    stop string), the same text (up to the stop string), finish "stop" and the same stop string named; for at least
    one request the stop string completed inside a verify window, whose later accepted tokens had to be dropped."""
    cases = stop_cases(demo[1], drafted)
    assert any(case.inside_window for case in cases.values()), "no verify window committed more than one token"
    stops = {i: case.stops for i, case in cases.items()}
    serial, _ = serve(demo, prompts, False, parallel, stagger, graphs, drafter, stops)
    cut, _ = serve(demo, prompts, True, parallel, stagger, graphs, drafter, stops, pause=1.0)  # a reader behind
    for (i, case), a, b in zip(sorted(cases.items()), serial, cut):
        assert a == case.expected, f"request {i} served serially, stop strings {case.stops}"
        assert b == case.expected, f"request {i} drafted, stop strings {case.stops}"
        # its usage: the counts of every window up to the one completing the stop string, as the same request's
        # token there came with when no stop string cut it (the same windows), whatever ran after
        assert b.usage == drafted[i].carried[len(b.tokens) - 1], f"request {i}: usage {b.usage}"
    # the step that made the token completing a stop string sent more tokens after it
    windows = [b.steps[len(b.tokens) - 1 :] for (_, case), b in zip(sorted(cases.items()), cut) if case.inside_window]
    assert any(len(steps) > 1 and steps[0] == steps[1] for steps in windows), "no stop string inside a verify window"


@torch.no_grad()
@pytest.mark.parametrize("parallel,stagger", [(4, False), (3, True), (1, False)])
def test_drafted_replies_equal_serial_replies(demo, parallel, stagger, graphs: bool = False):
    """Every request's reply (token ids, text, finish reason) is the same drafted and with `"draft": false`; then
    stop strings taken from those replies cut both alike (`check_stop_strings`)."""
    model, tokenizer, eos = demo
    prompts = demo_prompts(tokenizer, 24 if parallel > 1 else 12)
    serial, none = serve(demo, prompts, draft=False, parallel=parallel, stagger=stagger, graphs=graphs)
    drafted, counts = serve(demo, prompts, draft=True, parallel=parallel, stagger=stagger, graphs=graphs)
    assert none["drafted"] == 0
    for i, (a, b) in enumerate(zip(serial, drafted)):
        assert a == b, f"request {i} ({params_for(i)})"
    assert counts["accepted"] > 0 and counts["drafted"] > counts["accepted"], counts  # both outcomes happened
    assert counts["committed"] > counts["windows"]  # some steps committed more than one token
    # each reply's own counts (its usage) are final when its end arrives: its last window's drafts included
    ends = [r.drafts for r in drafted]
    assert sum(d[0] for d in ends if d) == counts["drafted"] and sum(d[1] for d in ends if d) == counts["accepted"]
    assert all(r.usage == r.drafts for r in drafted)  # what each reply's usage reports
    check_stop_strings(demo, prompts, drafted, parallel, stagger, graphs, "copy")


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


def test_a_steps_rows_sampled_together_give_the_same_replies(demo, monkeypatch):
    """The GPU's draw of a decode step through this scheduler, on the CPU: `Scheduler._draw` samples every lane's
    rows at once (the rows-together form, `sampling._device_rows`, stands in for `sample_rows`, which on the host
    takes a row at a time), a window's row at its position as though the drafts before it were taken. The replies
    (greedy, seeded, top_p / top_k / min_p: `params_for`) equal those sampled a row at a time, without drafts and
    with windows of 4 whose rows past a rejected draft are drawn and dropped."""
    from engine import sampling
    from engine import scheduler as scheduler_module

    model, tokenizer, eos = demo
    prompts = demo_prompts(tokenizer, 15)
    serial, _ = serve(demo, prompts, draft=False, parallel=3, stagger=False)
    passes: list[int] = []

    def together(rows, params, positions, graphs):
        passes.append(len(params))
        assert not graphs  # the CPU's lanes replay no graphs
        return sampling._device_rows(rows, params, positions, graphs)

    monkeypatch.setattr(Scheduler, "batch_host_rows", True)
    monkeypatch.setattr(scheduler_module, "sample_rows", together)
    plain, _ = serve(demo, prompts, draft=False, parallel=3, stagger=False)
    assert max(passes) == 3  # the lanes of a step in one pass
    passes.clear()
    drafted, counts = serve(demo, prompts, draft=True, parallel=3, stagger=False)
    assert max(passes) > 3 and counts["drafted"] > counts["accepted"] > 0  # windows, some drafts rejected
    for i, (a, b, c) in enumerate(zip(serial, plain, drafted)):
        assert a == b == c, f"request {i} ({params_for(i)})"


def _logprob_tokens(demo, prompts: list[list[int]], draft: bool) -> dict[str, list[Token]]:
    """Each request's Token events (id, log-probability, top alternatives) through a real Scheduler: request i asks
    for (None, 0, 2, 5)[i % 4] alternatives, with params_for(i); with `draft`, copy drafts in windows of 4."""
    model, _, _ = demo
    executor = StepExecutor(model, model.make_pool(4096, "fp32"), lanes=3, graphs=False, window=4)
    sched = Scheduler(
        executor,
        ParallelGroup.single(),
        parallel=3,
        max_queued=len(prompts),
        prefill_chunk=32,
        drafter="copy" if draft else "none",
        draft_tokens=3 if draft else 0,
    )
    got: dict[str, list[Token]] = {f"r{i}": [] for i in range(len(prompts))}
    ends = {name: threading.Event() for name in got}

    def sink(name: str):
        def take(event: object) -> None:
            if isinstance(event, Token):
                got[name].append(event)
            else:
                assert isinstance(event, Finished), event
                ends[name].set()

        return take

    sched.start()
    try:
        for i, (name, prompt) in enumerate(zip(got, prompts)):
            request = Request(name, prompt, params_for(i), sink(name), frozenset(), logprobs=(None, 0, 2, 5)[i % 4])
            sched.submit(request)
        assert all(event.wait(300) for event in ends.values())
    finally:
        sched.stop()
    return got


def test_a_steps_log_probabilities_together_are_each_rows_own(demo, monkeypatch):
    """With a step's rows drawn together (`Scheduler._draw`, in the GPU's form here), the drawn tokens'
    log-probabilities are made together too (`_draw_logprobs`: one `rows_logprobs` pass, each row's list cut to its
    request's count): every token event (id, log-probability, alternatives) equals the one made a row at a time,
    with and without draft windows, and only a prompt's last row makes its own (`token_logprobs`)."""
    from engine import sampling
    from engine import scheduler as scheduler_module

    model, tokenizer, eos = demo
    prompts = demo_prompts(tokenizer, 8)
    alone = _logprob_tokens(demo, prompts, draft=False)
    own: list[int] = []
    real_own = scheduler_module.token_logprobs

    def counted(*args, **kwargs):
        own.append(1)
        return real_own(*args, **kwargs)

    monkeypatch.setattr(Scheduler, "batch_host_rows", True)
    monkeypatch.setattr(scheduler_module, "sample_rows", lambda r, p, q, g: sampling._device_rows(r, p, q, g))
    monkeypatch.setattr(scheduler_module, "token_logprobs", counted)
    together = _logprob_tokens(demo, prompts, draft=False)
    asking = sum(1 for i in range(len(prompts)) if i % 4)
    assert len(own) == asking  # each asking request's first token (its prompt's last row), no decode row
    drafted = _logprob_tokens(demo, prompts, draft=True)
    for name in alone:
        assert alone[name] == together[name], name
        assert [(t.id, t.logprob, t.top) for t in alone[name]] == [(t.id, t.logprob, t.top) for t in drafted[name]]
    assert any(t.logprob is not None and len(t.top) == 5 for t in alone["r3"])
