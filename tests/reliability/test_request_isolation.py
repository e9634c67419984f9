"""A request that fails on rank 0 fails alone: it gets an error, its lane goes back, every other request finishes
with the tokens it would have had alone, and the scheduler keeps serving (issue 13, 1).

The failing request carries a temperature that is not a number (`None`), which the API never lets through: it is
the simplest real way to make `sample` raise for one request now that no numeric value can."""

from __future__ import annotations

import time
from typing import Any

import pytest
import torch
from test_scheduler import PROMPTS, Collector, make, request, run_all, serial_tokens

import engine.scheduler as scheduler_module
from engine.checkpoint.demo import TRAINED
from engine.models.glm5_next.model import Glm5NextForCausalLM
from engine.parallel import ParallelGroup
from engine.runner.executor import StepExecutor
from engine.sampling import SamplingParams
from engine.scheduler import Failed, Finished, PromptLogprobs, Request, Scheduler


def test_a_request_whose_sampling_raises_fails_alone() -> None:
    alone = serial_tokens()
    sched = make(parallel=3)
    sched.start()
    try:
        good = [request(f"r{i}", prompt, seed=i) for i, prompt in enumerate(PROMPTS)]
        bad, bad_sink = request("bad", [3, 4, 5])
        bad.params = SamplingParams(temperature=None, max_tokens=12)  # type: ignore[arg-type]
        run_all(sched, [good[0], (bad, bad_sink), *good[1:]])
        assert isinstance(bad_sink.end, Failed)
        assert "could not be sampled" in bad_sink.end.message and "Error" not in bad_sink.end.message
        assert [sink.tokens for _, sink in good] == alone
        assert all(isinstance(sink.end, Finished) for _, sink in good)
        assert sched.broken is None
        later = request("later", PROMPTS[0], seed=0)
        run_all(sched, [later])
        assert later[1].tokens == alone[0]
        # stats are the last step's snapshot and rows go back to the pool in the plan after a request ends: wait
        # (bounded) for the loop to get there
        deadline = time.monotonic() + 5.0
        while time.monotonic() < deadline:
            stats = sched.stats()
            if stats["requests_running"] == 0 and stats["pool_free_tokens"] == stats["pool_tokens"]:
                break
            time.sleep(0.02)
        assert stats["requests_running"] == 0 and stats["pool_free_tokens"] == stats["pool_tokens"]
    finally:
        sched.stop()


class _Sink(Collector):
    """A request's events, its prompt's logprobs kept apart from its end."""

    prompt: PromptLogprobs | None = None

    def __call__(self, event: object) -> None:
        if isinstance(event, PromptLogprobs):
            self.prompt = event
        else:
            super().__call__(event)


def test_a_prompt_whose_logprobs_cannot_be_made_fails_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    """On a GPU a prompt's logprobs (completions' echo) are made on the device, in blocks of float64 rows: memory of
    their own. Running out there fails that request alone — simulated: `rows_logprobs` raises torch's
    OutOfMemoryError, as an allocation on a full GPU does (no GPU here). The trained demo through the real scheduler;
    the other request gets the tokens it gets alone, and the server goes on."""
    model = Glm5NextForCausalLM.load(TRAINED)
    executor = StepExecutor(model, model.make_pool(2048, "fp32"), lanes=2, graphs=False)
    sched = Scheduler(executor, ParallelGroup.single(), parallel=2, max_queued=8, prefill_chunk=16, heartbeat_s=0.05)
    sched.start()
    prompt = list(range(5, 40))

    def send(name: str, **extra: Any) -> _Sink:
        sink = _Sink()
        sched.submit(Request(name, prompt, SamplingParams(temperature=0.0, max_tokens=6), sink, frozenset(), **extra))
        return sink

    def out_of_memory(*args: Any, **kwargs: Any) -> None:
        raise torch.OutOfMemoryError("CUDA out of memory (simulated)")

    try:
        alone = send("alone")
        assert alone.done.wait(120) and isinstance(alone.end, Finished)
        monkeypatch.setattr(scheduler_module, "rows_logprobs", out_of_memory)
        echo = send("echo", logprobs=1, prompt_logprobs=True)
        plain = send("plain")
        assert echo.done.wait(120) and plain.done.wait(120)
        assert isinstance(echo.end, Failed) and "log-probabilities could not be made" in echo.end.message
        assert isinstance(plain.end, Finished) and plain.tokens == alone.tokens
        assert sched.broken is None
        monkeypatch.undo()
        again = send("again", logprobs=1, prompt_logprobs=True)
        assert again.done.wait(120) and isinstance(again.end, Finished), again.end
        assert again.tokens == alone.tokens
        assert again.prompt is not None and len(again.prompt.entries) == len(prompt) - 1
    finally:
        sched.stop()
