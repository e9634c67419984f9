"""A request that fails on rank 0 fails alone: it gets an error, its lane goes back, every other request finishes
with the tokens it would have had alone, and the scheduler keeps serving (issue 13, 1).

The failing request carries a temperature that is not a number (`None`), which the API never lets through: it is
the simplest real way to make `sample` raise for one request now that no numeric value can."""

from __future__ import annotations

import time

from test_scheduler import PROMPTS, make, request, run_all, serial_tokens

from engine.sampling import SamplingParams
from engine.scheduler import Failed, Finished


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
