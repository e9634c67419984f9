"""Prompt reuse (engine/reuse.py): kept prompt states and requests resumed from them.

The bookkeeping is tested on its own (keys, shared pool rows, the index's pins and evictions); exactness goes through
the serving path — a real Scheduler and StepExecutor on the trained demo, lanes, batches, MTP and copy drafts — where every
resumed request must give the token ids of the same request served cold (`reuse=False`), and `cached_tokens` must be
the tokens it really skipped.
"""

from __future__ import annotations

import json
import time

import pytest
import torch
from prometheus_client import generate_latest
from test_drafts import params_for
from test_scheduler import Collector

from engine.cache import KVPool
from engine.checkpoint.demo import TRAINED
from engine.models.glm5_next.model import Glm5NextForCausalLM
from engine.parallel import ParallelGroup
from engine.reuse import ROLE_TOKENS, PrefixIndex, chunk_keys
from engine.runner.executor import StepExecutor
from engine.sampling import SamplingParams
from engine.scheduler import Failed, Finished, Request, Scheduler
from engine.server.metrics import Metrics
from engine.server.template import render_chat
from engine.train import synthetic

CHUNK = 16


# -- bookkeeping ---------------------------------------------------------------------------------------------------


def test_chunk_keys_follow_the_prefill_chunks_and_the_salt() -> None:
    a = list(range(100, 150))  # 50 tokens: chunks end at 16, 32, 48 and 50
    keys = chunk_keys(a, CHUNK)
    assert len(keys) == 4
    assert chunk_keys(a[:48], CHUNK) == keys[:3]  # whole chunks: the same keys
    assert chunk_keys(a[:49], CHUNK)[:3] == keys[:3] and chunk_keys(a[:49], CHUNK)[3] != keys[3]  # a shorter end
    changed = a[:20] + [7] + a[21:]
    assert chunk_keys(changed, CHUNK)[0] == keys[0] and chunk_keys(changed, CHUNK)[1:] != keys[1:]
    salted = chunk_keys(a, CHUNK, salt="tenant-a")
    assert not set(salted) & set(keys) and chunk_keys(a, CHUNK, salt="tenant-a") == salted


def test_shared_pool_rows_are_free_only_when_their_last_holder_lets_go() -> None:
    pool = KVPool(1, 8, 4)
    slots = pool.take(3)
    pool.share(slots[:2])
    pool.release(slots)
    assert pool.free_tokens == 6  # the third row is free, the two shared ones are still held
    pool.release(slots[:2])
    assert pool.free_tokens == 8
    with pytest.raises(ValueError):
        pool.release(slots[:1])  # released more often than held
    with pytest.raises(ValueError):
        pool.share([5])  # only held rows can be shared


def test_a_step_out_of_gpu_memory_in_the_rows_bookkeeping_leaves_no_row_held(monkeypatch) -> None:
    """A sequence whose new slots cannot reach the device, a kept state whose copy cannot be made and rows taken
    over that cannot be: each gives back what it took, and holds what it held (the GPU's out-of-memory error raised
    by a stand-in, torch.tensor / Tensor.clone, where the CPU raises none)."""
    from engine.cache import Sequence
    from engine.reuse import KeptStates

    def out_of_memory(*args, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory (a stand-in: tests/engine/test_reuse.py)")

    pool = KVPool(1, 64, 8)
    seq = Sequence(pool)
    seq.grow(16)
    seq.length = 16
    seq.kda_state[0] = torch.zeros(2, 4, 4)
    kept = KeptStates(pool)
    with monkeypatch.context() as m:
        m.setattr(torch, "tensor", out_of_memory)
        with pytest.raises(torch.OutOfMemoryError):
            seq.grow(16)
        taken = seq.slot_ids[:4]
        pool.share(taken)  # as KeptStates._shared does for rows a sequence takes over
        with pytest.raises(torch.OutOfMemoryError):
            seq.take_over(taken)
    with monkeypatch.context() as m:
        m.setattr(torch.Tensor, "clone", out_of_memory)
        with pytest.raises(torch.OutOfMemoryError):
            kept.keep(1, seq, 0)
    assert (seq.num_slots, pool.free_tokens, kept.pages, kept.snapshots) == (16, 48, {}, {})
    seq.release()
    assert pool.free_tokens == 64


def test_the_index_evicts_unpinned_leaves_least_recently_used_first_and_never_a_pinned_path() -> None:
    index = PrefixIndex(chunk=CHUNK, snapshot_bytes=10, cap_bytes=1000)
    a1, _ = index.add(b"a1", 16, None)
    a2, _ = index.add(b"a2", 32, a1)
    b2, _ = index.add(b"b2", 48, a1)  # a1's rows are held once for both
    assert a1 and a2 and b2 and a1.children == 2
    assert index.unpinned_tokens() == 16 + 16 + 32
    index.pin(a2)  # a running request resumed through a1 -> a2
    assert a1.pins == a2.pins == 1 and index.unpinned_tokens() == 32
    drops = index.evict(1000)
    assert drops == [(b2.id, True)] and set(index.nodes) == {b"a1", b"a2"}  # a1 stays: a pinned path holds it
    index.pin(a2, -1)
    index.touch(a1)
    assert index.evict(20) == [(a2.id, True), (a1.id, True)]  # leaves first: a1 only once it is one
    assert index.unpinned_tokens() == 0


def test_the_snapshot_cap_drops_the_oldest_snapshots_and_prunes_what_nothing_can_resume_from() -> None:
    index = PrefixIndex(chunk=CHUNK, snapshot_bytes=10, cap_bytes=25)  # room for two snapshots
    a1, _ = index.add(b"a1", 16, None)
    a2, _ = index.add(b"a2", 32, a1)
    index.pin(a2)
    a3, drops = index.add(b"a3", 48, a2)
    assert drops == [(a1.id, False)]  # a1 loses its snapshot, keeps its rows for a2 and a3
    assert a1 is not None and not a1.snapshot and index.snapshots == 2
    assert index.match([b"a1", b"x"]) is None and index.match([b"a1", b"a2", b"a3"]) is a3
    index.pin(a2, -1)
    assert index.prune() == []  # a1 still has descendants
    assert PrefixIndex(chunk=CHUNK, snapshot_bytes=10, cap_bytes=5).add(b"k", 16, None) == (None, [])


def test_the_snapshot_cap_is_set_aside_from_the_pools_memory_and_caps_the_index(monkeypatch) -> None:
    """PROMPT_REUSE_GIB's two consumers: pool sizing leaves that much memory to the snapshots (only with
    PROMPT_REUSE on), and the scheduler's index keeps no more snapshot bytes than that."""
    import engine.serve as serve
    from engine.config import EngineConfig
    from engine.serve import size_pool

    gib = 2**30
    monkeypatch.setattr(serve, "available_bytes", lambda device: 10 * gib)
    base = dict(memory_reserve_gib=0.0, context=1024, parallel=1_000_000)
    off = size_pool(EngineConfig("unused", prompt_reuse=False, **base), 1024, "cpu", ParallelGroup.single())
    on = size_pool(EngineConfig("unused", prompt_reuse_gib=2.5, **base), 1024, "cpu", ParallelGroup.single())
    assert off == (1024, 10 * gib // 1024) and on == (1024, int(7.5 * gib) // 1024)

    model = Glm5NextForCausalLM.load(TRAINED)
    executor = StepExecutor(model, model.make_pool(64, "fp32"), lanes=1, graphs=False)
    cfg = EngineConfig("unused", prompt_reuse_gib=0.001, prefill_chunk=CHUNK)
    index = Scheduler.for_config(executor, ParallelGroup.single(), cfg).index
    assert index is not None and index.cap_bytes == int(0.001 * gib) and index.chunk == CHUNK
    off_cfg = EngineConfig("unused", prompt_reuse=False)
    assert Scheduler.for_config(executor, ParallelGroup.single(), off_cfg).index is None


# -- the serving path on the trained demo --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def demo():
    from tokenizers import Tokenizer

    model = Glm5NextForCausalLM.load(TRAINED, mtp=True)  # kept states carry the MTP layer's rows and hidden row
    tokenizer = Tokenizer.from_file(str(TRAINED / "tokenizer.json"))
    eos = frozenset(json.loads((TRAINED / "config.json").read_text())["text_config"]["eos_token_id"])
    marks = frozenset(i for i in map(tokenizer.token_to_id, ROLE_TOKENS) if i is not None)
    return model, tokenizer, eos, marks


def scheduler(
    demo, parallel: int, pool_tokens: int = 4096, drafts: bool = False, cap: int = 1 << 30, chunk: int = CHUNK
) -> Scheduler:
    """The server's scheduler over the demo, prompt reuse on (CUDA graphs where the model is on a GPU)."""
    model, _, _, marks = demo
    executor = StepExecutor(model, model.make_pool(pool_tokens, "fp32"), lanes=parallel, graphs=True, window=4)
    return Scheduler(
        executor,
        ParallelGroup.single(),
        parallel=parallel,
        max_queued=64,
        prefill_chunk=chunk,
        heartbeat_s=0.05,
        drafter="mtp+copy" if drafts else "none",
        draft_tokens=3 if drafts else 0,
        reuse_bytes=cap,
        reuse_marks=marks,
    )


def submit_all(
    sched: Scheduler, eos, batch: list[tuple[list[int], SamplingParams]], reuse: bool = True
) -> list[Collector]:
    """Submit a batch at once and wait (bounded) until every request has ended, finished or failed; their sinks."""
    sinks = []
    for i, (ids, params) in enumerate(batch):
        sink = Collector()
        sched.submit(Request(f"q{i}", ids, params, sink, eos, reuse=reuse))
        sinks.append(sink)
    assert all(sink.done.wait(300) for sink in sinks)
    return sinks


def run(sched: Scheduler, eos, batch: list[tuple[list[int], SamplingParams]], reuse: bool) -> list[Finished | list]:
    """Submit a batch at once; per request (its token ids, its Finished)."""
    out = []
    for sink in submit_all(sched, eos, batch, reuse):
        assert isinstance(sink.end, Finished), sink.end
        out.append((sink.tokens, sink.end))
    return out


def render(example: synthetic.Example, messages: list[dict]) -> str:
    return render_chat(messages, tools=example.tools, add_generation_prompt=True, enable_thinking=example.thinking)


def kept_prefixes(prompts: list[list[int]], marks: frozenset[int]) -> set[tuple[int, ...]]:
    """The prefixes whose states a scheduler keeps while it prefills `prompts` (chunk boundaries: each prompt's end,
    the last whole chunk's before it, the one before each role token; these prompts are far shorter than
    reuse.EVERY), written from the policy, not read from the index."""
    out = set()
    for p in prompts:
        last = (len(p) - 1) // CHUNK * CHUNK
        out.add(tuple(p))
        for x in range(CHUNK, len(p), CHUNK):
            if x == last or any(t in marks for t in p[x : x + CHUNK]):
                out.add(tuple(p[:x]))
    return out


def resumable(prompt: list[int], kept: set[tuple[int, ...]]) -> int:
    """The longest kept prefix `prompt` may resume from: a whole-chunk boundary, or its whole self (a prompt's end
    state serves only the same prompt: a longer one's chunk there is longer)."""
    if tuple(prompt) in kept:
        return len(prompt)
    return max((x for x in range(CHUNK, len(prompt), CHUNK) if tuple(prompt[:x]) in kept), default=0)


@torch.no_grad()
@pytest.mark.parametrize("parallel,drafts", [(4, False), (3, True)])
def test_resumed_replies_equal_cold_replies(demo, parallel: int, drafts: bool) -> None:
    """Rounds through one scheduler with prompt reuse, each a burst: first turns of the demo's conversations (tool
    calls, tool results, thinking on and off, with and without a system prompt), the same prompts sent again, each
    conversation's next turn (the reply sent back as the template renders it: without its reasoning, then a new
    user message), new conversations under an earlier system prompt. Every reply equals the same request served
    cold (`reuse=False`, the path without kept states), token for token; cached_tokens is what the kept states
    could give: the whole prompt for a resend (no prefill at all), at least what the earlier rounds kept otherwise."""
    model, tokenizer, eos, marks = demo
    examples = synthetic.examples("eval", 11, 10)
    encode = lambda text: tokenizer.encode(text).ids  # noqa: E731
    cold, warm = scheduler(demo, parallel, drafts=drafts), scheduler(demo, parallel, drafts=drafts)
    cold.start()
    warm.start()
    try:
        rounds: list[list[tuple[list[int], SamplingParams]]] = [
            [(encode(render(e, e.messages)), params_for(i)) for i, e in enumerate(examples)]
        ]
        got = [(run(cold, eos, rounds[0], reuse=False), run(warm, eos, rounds[0], reuse=True))]
        rounds.append(rounds[0])  # resent as they were
        got.append((got[0][0], run(warm, eos, rounds[1], reuse=True)))
        turns = []
        for i, (e, (tokens, _)) in enumerate(zip(examples, got[0][0])):
            content = tokenizer.decode(tokens, skip_special_tokens=False).split("</think>")[-1].split("<|")[0]
            messages = [*e.messages, {"role": "assistant", "content": content}, {"role": "user", "content": "again?"}]
            turns.append((encode(render(e, messages)), params_for(i + 3)))
        system = {"role": "system", "content": " ".join(synthetic._SYSTEMS)}  # a long one (~5 chunks)
        shared = [
            (encode(render(examples[0], [system, {"role": "user", "content": f"question {k}: who are you?"}])), p)
            for k, p in enumerate(params_for(i) for i in range(5))
        ]
        for batch in (turns + shared[:1], shared[1:]):
            rounds.append(batch)
            got.append((run(cold, eos, batch, reuse=False), run(warm, eos, batch, reuse=True)))
        stats = warm.stats()["prompt_reuse"]
    finally:
        cold.stop()
        warm.stop()
    cases = [(c, w) for cold_round, warm_round in got for c, w in zip(cold_round, warm_round)]
    assert len(cases) >= 30
    for k, ((cold_ids, cold_end), (warm_ids, _)) in enumerate(cases):
        assert cold_ids == warm_ids, f"case {k}"
        assert cold_end.cached_tokens == 0
    assert all(end.cached_tokens == 0 for _, end in got[0][1])  # nothing was kept before the first round
    for (ids, _), (_, end) in zip(rounds[1], got[1][1]):
        assert end.cached_tokens == len(ids)  # a resend prefills nothing: its end state and logits were kept
    for r in (2, 3):
        before = kept_prefixes([ids for batch in rounds[:r] for ids, _ in batch], marks)
        upto = kept_prefixes([ids for batch in rounds[: r + 1] for ids, _ in batch], marks)
        for (ids, _), (_, end) in zip(rounds[r], got[r][1]):
            assert resumable(ids, before) <= end.cached_tokens <= resumable(ids, upto)
            assert end.cached_tokens % CHUNK == 0 or end.cached_tokens == len(ids)
    # every next turn whose first prompt had a whole chunk before its last token resumed (9 of these 10)
    assert sum(end.cached_tokens > 0 for _, end in got[2][1][: len(turns)]) >= 9
    user = tokenizer.token_to_id("<|user|>")
    system_end = shared[0][0].index(user) // CHUNK * CHUNK  # the boundary before the user's message
    assert system_end >= 3 * CHUNK and all(end.cached_tokens >= system_end for _, end in got[3][1])
    assert stats["hits_tokens"] == sum(end.cached_tokens for _, warm_round in got for _, end in warm_round)
    assert cold.executor.pool.free_tokens == cold.executor.pool.num_tokens
    assert warm.executor.pool.free_tokens == warm.executor.pool.num_tokens  # stop dropped the kept states


@torch.no_grad()
@pytest.mark.parametrize("cap_states", [None, 3])
def test_kept_states_give_way_to_requests_and_stay_exact_under_pressure(demo, cap_states: int | None) -> None:
    """A pool of 1024 rows, prompts sent one at a time and then again: kept states fill what running requests leave
    and are evicted (least recently used first) as soon as a request needs their rows, up to a request whose budget
    is the whole pool, which could not run at all if kept rows held it back. With a snapshot cap of three states,
    no more than three are ever kept. Every reply equals its cold one."""
    model, tokenizer, eos, _ = demo
    prompts = [tokenizer.encode(synthetic.prompt(e)).ids for e in synthetic.examples("eval", 5, 12)]
    params = SamplingParams(temperature=0.0, max_tokens=24)
    cold, warm = scheduler(demo, 2, pool_tokens=1024), scheduler(demo, 2, pool_tokens=1024)
    assert warm.index is not None
    if cap_states is not None:
        warm.index.cap_bytes = cap_states * warm.index.snapshot_bytes
    cold.start()
    warm.start()
    try:
        held, cached = [], []
        for ids in prompts:
            (c,) = run(cold, eos, [(ids, params)], reuse=False)
            (w,) = run(warm, eos, [(ids, params)], reuse=True)
            (again,) = run(warm, eos, [(ids, params)], reuse=True)
            assert c[0] == w[0] == again[0]
            stats = warm.stats()["prompt_reuse"]
            assert stats["states"] <= (cap_states or 10**6)
            held.append(stats["tokens"])
            cached.append(again[1].cached_tokens)
        big = prompts[-1]  # its kept states are the most recently used
        whole = SamplingParams(temperature=0.7, seed=5, max_tokens=1024 - len(big))
        (c,) = run(cold, eos, [(big, whole)], reuse=False)
        (w,) = run(warm, eos, [(big, whole)], reuse=True)
        assert c[0] == w[0] and w[1].cached_tokens > 0  # its own kept prefix stayed, the rest gave way
        after = warm.stats()["prompt_reuse"]
    finally:
        cold.stop()
        warm.stop()
    assert all(n == len(ids) for n, ids in zip(cached, prompts))  # kept between the two sends
    if cap_states is None:
        assert sum(len(ids) for ids in prompts) > 1024 and max(held) > 512  # the pool filled with kept rows
        assert after["tokens"] < max(held)  # and they were evicted when needed
    assert warm.executor.pool.free_tokens == warm.executor.pool.num_tokens


@torch.no_grad()
def test_prompts_sharing_chunks_at_once_hold_the_shared_rows_once(demo) -> None:
    """Three prompts that share five whole chunks, sent at once on three lanes: the first keeps states as it
    prefills; the others, admitted before anything was kept, reach the same chunks later and take the kept rows
    instead of their own (the same bits). Replies equal the cold ones; afterwards every pool row is free or held by
    a kept state, the shared prefix once."""
    model, tokenizer, eos, marks = demo
    shared = tokenizer.encode(
        render_chat([{"role": "system", "content": " ".join(synthetic._SYSTEMS * 2)}], add_generation_prompt=False)
    ).ids
    shared = shared[: 5 * CHUNK]
    assert len(shared) == 5 * CHUNK
    prompts = [shared + tokenizer.encode(f"<|user|>question {k}<|assistant|></think>").ids for k in range(3)]
    params = SamplingParams(temperature=0.0, max_tokens=12)
    cold, warm = scheduler(demo, 3), scheduler(demo, 3)
    cold.start()
    warm.start()
    try:
        expected = run(cold, eos, [(p, params) for p in prompts], reuse=False)
        got = run(warm, eos, [(p, params) for p in prompts], reuse=True)
        deadline = time.monotonic() + 10  # the last lane is released by the step after its reply ends
        while warm.stats()["pool_free_tokens"] < warm.stats()["pool_tokens"] and time.monotonic() < deadline:
            time.sleep(0.02)
        pool, stats = warm.executor.pool, warm.stats()["prompt_reuse"]
        held = pool.num_tokens - pool.free_tokens
    finally:
        cold.stop()
        warm.stop()
    assert [ids for ids, _ in got] == [ids for ids, _ in expected]
    assert all(end.cached_tokens == 0 for _, end in got)  # all admitted at once: nothing to resume yet
    distinct = len(shared) + sum(len(p) - len(shared) for p in prompts)  # the prefix once, then each own tail
    assert (held, stats["tokens"]) == (distinct, distinct), stats


# -- a step that runs out of GPU memory ----------------------------------------------------------------------------
# A stand-in: the CPU raises no torch.OutOfMemoryError, so the model's prefill (or the lane decoder's decode round)
# raises the GPU's error once, where a GPU would run out of memory. Everything else is the serving path.


def _out_of_memory_steps(sched: Scheduler) -> int:
    """/health's count of steps out of GPU memory, once the loop has refreshed its stats after the failed step (a
    request hears of its failure within that step; the stats follow it)."""
    deadline = time.monotonic() + 5
    while not sched.stats()["totals"]["out_of_memory"] and time.monotonic() < deadline:
        time.sleep(0.02)
    return sched.stats()["totals"]["out_of_memory"]


def _settled(sched: Scheduler) -> tuple[int, int]:
    """(pool rows held, rows kept states hold) once the step after the last reply has released its lane."""
    deadline = time.monotonic() + 10
    while sched.stats()["requests_running"] and time.monotonic() < deadline:
        time.sleep(0.02)
    time.sleep(0.2)  # the release plan runs on the loop's next step (a heartbeat at most)
    pool = sched.executor.pool
    return pool.num_tokens - pool.free_tokens, sched.stats()["prompt_reuse"]["tokens"]


def test_a_prompt_chunk_out_of_gpu_memory_fails_its_request_alone(demo, monkeypatch) -> None:
    """One prompt's last chunk runs out of GPU memory (a chunk that keeps its state for prompt reuse): that request
    fails with words that say so, the one beside it finishes with its cold tokens, the scheduler serves on, the state
    the chunk was to keep is forgotten (nothing kept it), and the same prompt sent again gets its cold reply."""
    model, tokenizer, eos, _ = demo
    encode = lambda text: tokenizer.encode(text).ids  # noqa: E731
    examples = synthetic.examples("eval", 3, 10)
    bad, good = (encode(render(e, e.messages)) for e in examples[:2])
    assert len(bad) > 2 * CHUNK
    params = SamplingParams(temperature=0.0, max_tokens=10)
    cold = scheduler(demo, 2)
    cold.start()
    try:
        expected = [sink.tokens for sink in submit_all(cold, eos, [(bad, params), (good, params)])]
    finally:
        cold.stop()
    last = bad[(len(bad) - 1) // CHUNK * CHUNK :]
    served, armed = model.prefill, [True]

    def prefill(seq, ids, *args, **kw):
        if armed[0] and list(ids) == last:
            armed[0] = False
            raise torch.OutOfMemoryError("CUDA out of memory (a stand-in: tests/engine/test_reuse.py)")
        return served(seq, ids, *args, **kw)

    monkeypatch.setattr(model, "prefill", prefill)
    warm = scheduler(demo, 2)
    warm.start()
    try:
        failed, beside = submit_all(warm, eos, [(bad, params), (good, params)])
        assert not armed[0]  # the stand-in raised
        assert isinstance(failed.end, Failed) and "ran out of memory in this request's prompt chunk" in (
            failed.end.message
        )
        assert isinstance(beside.end, Finished) and beside.tokens == expected[1]
        assert warm.broken is None and _out_of_memory_steps(warm) == 1
        metrics = Metrics()
        metrics.refresh(warm.stats())
        assert "sparks:out_of_memory_steps_total 1.0" in generate_latest(metrics.registry).decode()
        (again,) = submit_all(warm, eos, [(bad, params)])
        assert isinstance(again.end, Finished) and again.tokens == expected[0]
        held, kept = _settled(warm)
    finally:
        warm.stop()
    assert held == kept  # every row is free or held by a kept state: none left with the failed lane


def test_a_decode_round_out_of_gpu_memory_fails_its_requests_and_the_server_goes_on(demo, monkeypatch) -> None:
    """A decode round runs out of GPU memory: the requests in it fail with words that say so, none is left holding
    rows, and the next requests get their cold replies."""
    model, tokenizer, eos, _ = demo
    examples = synthetic.examples("eval", 4, 10)
    prompts = [tokenizer.encode(render(e, e.messages)).ids for e in examples[:2]]
    params = SamplingParams(temperature=0.0, max_tokens=10)
    sched = scheduler(demo, 2)
    sched.start()
    try:
        expected = [sink.tokens for sink in submit_all(sched, eos, [(p, params) for p in prompts])]
        decoder = sched.executor.decoder
        served, armed = decoder.decode, [True]

        def decode(seqs, ids):
            if armed[0]:
                armed[0] = False
                raise torch.OutOfMemoryError("CUDA out of memory (a stand-in: tests/engine/test_reuse.py)")
            return served(seqs, ids)

        monkeypatch.setattr(decoder, "decode", decode)
        failed = submit_all(sched, eos, [(p, params) for p in prompts])
        assert not armed[0]
        assert any(isinstance(sink.end, Failed) for sink in failed)
        for sink in failed:
            assert isinstance(sink.end, Finished) or "ran out of memory in this request's decode step" in (
                sink.end.message
            )
        assert sched.broken is None and _out_of_memory_steps(sched) == 1
        after = submit_all(sched, eos, [(p, params) for p in prompts])
        assert [sink.tokens for sink in after] == expected
        held, kept = _settled(sched)
    finally:
        sched.stop()
    assert held == kept


@pytest.mark.parametrize("resumed", ["at its end", "mid-prompt"])
def test_a_resume_out_of_gpu_memory_fails_that_request_alone(demo, monkeypatch, resumed: str) -> None:
    """A request resuming from a kept prompt state runs out of GPU memory there (after its lane took the kept rows
    and state: what a failed copy would leave): it fails with words that say so, the request admitted beside it
    finishes with its cold tokens, the scheduler serves on, no row is left held by the failed lane, and the same
    request sent again resumes and gets its cold reply. Resumed "at its end" (the same prompt again: no chunk of
    its own in the step, which runs the other request's) or "mid-prompt" (a longer prompt: the step's chunk is its
    own, and fails with it)."""
    model, tokenizer, eos, _ = demo
    encode = lambda text: tokenizer.encode(text).ids  # noqa: E731
    examples = synthetic.examples("eval", 5, 10)
    first, other = (encode(render(e, e.messages)) for e in examples[:2])
    again = first if resumed == "at its end" else first + encode(" and one more question, please.")
    params = SamplingParams(temperature=0.0, max_tokens=10)
    cold = scheduler(demo, 2)
    cold.start()
    try:
        expected = [sink.tokens for sink in submit_all(cold, eos, [(again, params), (other, params)], reuse=False)]
    finally:
        cold.stop()
    sched = scheduler(demo, 2)
    sched.start()
    try:
        submit_all(sched, eos, [(first, params)])  # its states kept
        kept = sched.executor.kept
        served, armed = kept.resume, [True]

        def resume(seq, path):
            served(seq, path)  # the rows shared and the state copied, then the GPU's error
            if armed[0]:
                armed[0] = False
                raise torch.OutOfMemoryError("CUDA out of memory (a stand-in: tests/engine/test_reuse.py)")

        monkeypatch.setattr(kept, "resume", resume)
        hits = sched.stats()["prompt_reuse"]["hits_tokens"]
        failed, beside = submit_all(sched, eos, [(again, params), (other, params)])
        assert not armed[0]  # the stand-in raised
        assert isinstance(failed.end, Failed) and "ran out of memory while this request resumed" in failed.end.message
        assert isinstance(beside.end, Finished) and beside.tokens == expected[1]
        assert sched.broken is None and _out_of_memory_steps(sched) == 1
        reused = beside.end.cached_tokens  # what the request beside it resumed from, if anything
        assert sched.stats()["prompt_reuse"]["hits_tokens"] == hits + reused  # the failed resume reused nothing
        (retried,) = submit_all(sched, eos, [(again, params)])
        assert isinstance(retried.end, Finished) and retried.tokens == expected[0]
        assert retried.end.cached_tokens > 0  # resumed this time
        held, kept_rows = _settled(sched)
    finally:
        sched.stop()
    assert held == kept_rows  # every row is free or held by a kept state: none left with the failed lane
