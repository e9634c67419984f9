"""A step that really runs out of GPU memory: the trained demo on CUDA (bf16, CUDA graphs) through the real
scheduler with prompt reuse, this process's memory capped at what it holds (`set_per_process_memory_fraction`)
while one prompt is prefilled. That request fails with words that say so, the engine goes on, and once the cap is
lifted the same prompts get their cold replies. tests/engine/test_reuse.py checks the same paths on the CPU with a
stand-in for the error. Skipped without a GPU (never part of CI)."""

from __future__ import annotations

import pytest
import torch
from test_mtp_gpu import demo_mtp_cuda  # noqa: F401  (the trained demo on CUDA, bf16, its MTP layer loaded)
from test_reuse import _out_of_memory_steps, _settled, render, scheduler, submit_all
from test_reuse_gpu import demo  # noqa: F401  (test_reuse's demo fixture on CUDA)

from engine.sampling import SamplingParams
from engine.scheduler import Failed, Finished
from engine.train import synthetic

pytestmark = [pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def test_a_prompt_out_of_gpu_memory_fails_alone_and_the_engine_goes_on(demo):  # noqa: F811
    model, tokenizer, eos, _ = demo
    examples = synthetic.examples("eval", 5, 10)
    prompts = [tokenizer.encode(render(e, e.messages)).ids for e in examples[:2]]
    params = SamplingParams(temperature=0.0, max_tokens=8)
    sched = scheduler(demo, 2, pool_tokens=8192, chunk=1024)  # chunks whose activations need fresh memory
    sched.start()
    total = torch.cuda.get_device_properties(0).total_memory
    try:
        expected = [sink.tokens for sink in submit_all(sched, eos, [(p, params) for p in prompts])]
        fresh = [t for e in examples[2:] for t in tokenizer.encode(render(e, e.messages)).ids]  # nothing kept of it
        assert len(fresh) > 1024
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        torch.cuda.set_per_process_memory_fraction(min(1.0, torch.cuda.memory_reserved() / total))  # no new segment
        try:
            (capped,) = submit_all(sched, eos, [(fresh, params)])
        finally:
            torch.cuda.set_per_process_memory_fraction(1.0)
        assert isinstance(capped.end, Failed), capped.end
        assert "ran out of memory in this request's prompt chunk" in capped.end.message
        assert sched.broken is None and _out_of_memory_steps(sched) >= 1
        after = submit_all(sched, eos, [(p, params) for p in prompts])
        assert all(isinstance(sink.end, Finished) for sink in after)
        assert [sink.tokens for sink in after] == expected
        held, kept = _settled(sched)
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0)
        sched.stop()
    assert held == kept
