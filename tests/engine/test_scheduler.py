"""Scheduler unit tests with exact expectations.

`TinyModel` below is a labelled stand-in, not the real model: a deterministic object honouring the model contract
(make_pool / new_sequence / prefill / decode / release) whose logits depend only on a sequence's own tokens. It lets
these tests pin the scheduler's bookkeeping exactly; the real model is exercised by tests/engine/test_api_live.py.
"""

from __future__ import annotations

import hashlib
import threading

import pytest
import torch

from engine.parallel import ParallelGroup
from engine.runner.executor import StepExecutor
from engine.sampling import SamplingParams
from engine.scheduler import Failed, Finished, QueueFull, Request, Scheduler, Token

VOCAB = 64


class TinyPool:
    def __init__(self, num_tokens: int) -> None:
        self.num_tokens = num_tokens
        self.free_tokens = num_tokens


class TinySequence:
    def __init__(self, pool: TinyPool) -> None:
        self.pool, self.tokens, self.released = pool, [], False

    @property
    def length(self) -> int:
        return len(self.tokens)

    def take(self, ids: list[int]) -> None:
        if self.pool.free_tokens < len(ids):
            raise RuntimeError("PoolExhausted")
        self.pool.free_tokens -= len(ids)
        self.tokens += ids

    def release(self) -> None:
        self.pool.free_tokens += len(self.tokens)
        self.tokens, self.released = [], True


class TinyModel:
    """Stand-in model (see module docstring). Records every call so tests can check the step order."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, int]] = []

    def make_pool(self, num_tokens: int) -> TinyPool:
        return TinyPool(num_tokens)

    def new_sequence(self, pool: TinyPool) -> TinySequence:
        return TinySequence(pool)

    @staticmethod
    def _logits(tokens: list[int]) -> torch.Tensor:
        digest = hashlib.sha256(repr(tokens).encode()).digest() * 2
        return torch.tensor([b / 16.0 for b in digest[:VOCAB]], dtype=torch.float32)

    def prefill(self, seq: TinySequence, ids: list[int]) -> torch.Tensor:
        self.calls.append(("prefill", len(ids)))
        seq.take(ids)
        return self._logits(seq.tokens)

    def decode(self, seqs: list[TinySequence], tokens: list[int]) -> torch.Tensor:
        self.calls.append(("decode", len(seqs)))
        for seq, tok in zip(seqs, tokens):
            seq.take([tok])
        return torch.stack([self._logits(seq.tokens) for seq in seqs])


class Collector:
    def __init__(self) -> None:
        self.tokens: list[int] = []
        self.end: Finished | Failed | None = None
        self.done = threading.Event()

    def __call__(self, event: object) -> None:
        if isinstance(event, Token):
            self.tokens.append(event.id)
        else:
            self.end = event  # type: ignore[assignment]
            self.done.set()


def make(parallel: int = 3, pool_tokens: int = 4096, max_queued: int = 8, chunk: int = 4) -> Scheduler:
    model = TinyModel()
    executor = StepExecutor(model, model.make_pool(pool_tokens))
    return Scheduler(
        executor,
        ParallelGroup.single(),
        parallel=parallel,
        max_queued=max_queued,
        prefill_chunk=chunk,
        heartbeat_s=0.05,
    )


def request(
    rid: str, prompt: list[int], max_tokens: int = 12, seed: int = 1, **kw: object
) -> tuple[Request, Collector]:
    sink = Collector()
    params = SamplingParams(temperature=0.8, top_p=0.9, seed=seed, max_tokens=max_tokens)
    return Request(rid, prompt, params, sink, **kw), sink


def run_all(sched: Scheduler, reqs: list[tuple[Request, Collector]], timeout: float = 20.0) -> None:
    for req, _ in reqs:
        sched.submit(req)
    for _, sink in reqs:
        assert sink.done.wait(timeout)


PROMPTS = [[1, 2, 3], list(range(5, 19)), [7] * 9, [40, 41], list(range(30, 60))]


def serial_tokens() -> list[list[int]]:
    out = []
    for i, prompt in enumerate(PROMPTS):
        sched = make(parallel=1)
        sched.start()
        req = request(f"r{i}", prompt, seed=i)
        run_all(sched, [req])
        sched.stop()
        out.append(req[1].tokens)
    return out


def test_concurrent_equals_serial_and_lanes_share_decode_rounds() -> None:
    alone = serial_tokens()
    sched = make(parallel=3)
    sched.start()
    reqs = [request(f"r{i}", p, seed=i) for i, p in enumerate(PROMPTS)]
    run_all(sched, reqs)
    sched.stop()
    assert [sink.tokens for _, sink in reqs] == alone
    assert all(isinstance(s.end, Finished) and s.end.reason == "length" for _, s in reqs)
    assert max(n for kind, n in sched.executor.model.calls if kind == "decode") == 3
    assert sched.executor.pool.free_tokens == sched.executor.pool.num_tokens


def test_prompt_chunks_alternate_with_decode_rounds() -> None:
    sched = make(parallel=2, chunk=4)
    first = request("a", [1, 2], max_tokens=2000)
    long = request("b", list(range(1, 25)), max_tokens=2)
    sched.submit(first[0])
    sched.start()
    while not first[1].tokens:
        threading.Event().wait(0.01)
    sched.submit(long[0])
    assert long[1].done.wait(10)
    sched.cancel("a")
    assert first[1].done.wait(10)
    sched.stop()
    calls = sched.executor.model.calls
    chunk_at = [i for i, (kind, n) in enumerate(calls) if kind == "prefill" and n == 4]
    assert len(chunk_at) == 6
    # between two chunks of the long prompt the running reply got a decode round
    assert all(calls[i + 1][0] == "decode" for i in chunk_at[:-1])


def test_end_token_finishes_with_stop() -> None:
    sched = make()
    req, sink = request("a", [1, 2, 3], max_tokens=12, seed=0)
    alone = serial_tokens()[0]
    req.stop_ids = frozenset({alone[4]})
    sched.start()
    run_all(sched, [(req, sink)])
    sched.stop()
    cut = alone.index(alone[4])
    assert sink.tokens == alone[:cut] and sink.end == Finished("stop", cut + 1)


def test_queue_cap_refuses_beyond_lanes_plus_queue() -> None:
    sched = make(parallel=2, max_queued=1)
    for i in range(3):
        sched.submit(request(f"r{i}", [1, 2])[0])
    with pytest.raises(QueueFull) as refused:
        sched.submit(request("r3", [1, 2])[0])
    assert refused.value.retry_after_s > 0


def test_cancel_frees_lane_and_rows_within_a_round() -> None:
    sched = make(parallel=1)
    req, sink = request("a", [1, 2, 3], max_tokens=2000)
    sched.start()
    sched.submit(req)
    while len(sink.tokens) < 3:
        threading.Event().wait(0.005)
    sched.cancel("a")
    assert sink.done.wait(2) and sink.end.reason == "cancelled"
    for _ in range(100):
        stats = sched.stats()
        if stats["requests_running"] == 0 and stats["pool_free_tokens"] == stats["pool_tokens"]:
            break
        threading.Event().wait(0.01)
    sched.stop()
    assert stats["requests_running"] == 0 and stats["pool_free_tokens"] == stats["pool_tokens"]


def test_background_requests_go_after_others() -> None:
    sched = make(parallel=1)
    order: list[str] = []
    reqs = [
        request("bg", [1], max_tokens=2, background=True),
        request("fg1", [2], max_tokens=2),
        request("fg2", [3], max_tokens=2),
    ]
    for req, sink in reqs:
        inner = sink.__call__
        sink_name = req.id
        req.sink = lambda ev, inner=inner, name=sink_name: (
            order.append(name) if not isinstance(ev, Token) else None,
            inner(ev),
        )
        sched.submit(req)
    sched.start()
    for _, sink in reqs:
        assert sink.done.wait(5)
    sched.stop()
    assert order == ["fg1", "fg2", "bg"]


def test_request_waits_until_the_pool_can_hold_it() -> None:
    sched = make(parallel=2, pool_tokens=40)
    big = request("big", list(range(10)), max_tokens=20)  # budget 30
    second = request("second", [1, 2], max_tokens=20)  # budget 22: must wait for big
    sched.start()
    run_all(sched, [big, second])
    sched.stop()
    assert max(n for kind, n in sched.executor.model.calls if kind == "decode") == 1
    never = request("huge", [1] * 50, max_tokens=1)
    sched = make(parallel=2, pool_tokens=40)
    sched.start()
    run_all(sched, [never])
    sched.stop()
    assert isinstance(never[1].end, Failed)


def test_a_failed_step_answers_requests_still_in_the_inbox() -> None:
    """Regression: a step failure used to leave submissions the loop had not read yet unanswered forever."""
    from engine.scheduler import Unavailable

    sched = make(parallel=2)
    entered, release = threading.Event(), threading.Event()
    model = sched.executor.model

    def failing_decode(seqs, tokens):  # blocks inside a step, then fails it
        entered.set()
        release.wait(10)
        raise RuntimeError("step failed")

    model.decode = failing_decode
    sched.start()
    first, first_sink = request("a", [1, 2, 3])
    sched.submit(first)
    assert entered.wait(10)
    second, second_sink = request("b", [4, 5])
    sched.submit(second)  # lands in the inbox while the step is running
    release.set()
    assert first_sink.done.wait(10) and second_sink.done.wait(10)
    assert isinstance(first_sink.end, Failed) and isinstance(second_sink.end, Failed)
    assert sched.stats()["requests_waiting"] == 0
    with pytest.raises(Unavailable):
        sched.submit(request("c", [6])[0])


def test_a_step_out_of_gpu_memory_with_several_ranks_is_named_so() -> None:
    """With several ranks a step that ran out of GPU memory stops the engine (the other ranks wait in its
    collectives); /health and every request then say why in these words."""
    from engine.runner.executor import StepOutOfMemory
    from engine.scheduler import describe_failure

    assert describe_failure(StepOutOfMemory([0, 2])) == "a step ran out of GPU memory on rank 0"
    assert describe_failure(RuntimeError("boom")) == "a step failed on rank 0"
