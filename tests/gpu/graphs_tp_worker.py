"""One rank of the TP graph-decode test (tests/gpu/test_graphs_tp.py starts one process per GPU, NCCL).

Runs test_graphs.SCHEDULE (batch 1..4, mixed prompt lengths, a stream leaving and another joining) through the
lanes' decode step twice — replayed from CUDA graphs, then eagerly — and saves per stream the greedy tokens and
logits, whether graphs stayed on, the (batch, width, span) keys captured and the decoder warnings. Then once more with the
last rank's captures failing (a host read while capturing), on that rank only: every rank must fall back together
(one process launch for both cases: starting NCCL ranks is the slow part)."""

from __future__ import annotations

import logging
import os
import sys

import torch
from test_graphs import run_schedule

from engine.models.glm5_next.model import Glm5NextForCausalLM
from engine.parallel import ParallelGroup, exit_process


class Warnings(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def main(checkpoint: str, world: int, rank: int, port: int, out: str) -> None:
    device = f"cuda:{rank}"
    torch.cuda.set_device(device)
    group = ParallelGroup.init(world, rank, "127.0.0.1", port, device=device, timeout_s=90)
    model = Glm5NextForCausalLM.load(checkpoint, group, dtype=torch.float32)  # fp32: tight comparisons
    warnings = Warnings()
    logging.getLogger("engine.lanes").addHandler(warnings)
    with torch.no_grad():
        graphed, decoder = run_schedule(model, graphs=True)
        eager, _ = run_schedule(model, graphs=False)
    result = {
        "graphs": graphed,
        "eager": eager,
        "uses_graphs": decoder.uses_graphs,
        "captured": sorted(decoder.graphs or {}),
        "warnings": list(warnings.lines),
    }
    warnings.lines.clear()
    if rank == world - 1:
        plain_step = type(model).decode_step

        def syncing_step(self, lanes, inputs, span, width=1):
            if torch.cuda.is_current_stream_capturing():
                inputs.sum().item()  # a host read: not allowed while capturing
            return plain_step(self, lanes, inputs, span, width)

        type(model).decode_step = syncing_step
    with torch.no_grad():
        failed, decoder = run_schedule(model, graphs=True)
    result["one_rank_fails"] = {
        "graphs": failed,
        "uses_graphs": decoder.uses_graphs,
        "warnings": warnings.lines,
        "random_ok": bool(torch.randn(4, device=device).isfinite().all()),
    }
    torch.save(result, out)
    torch.cuda.synchronize()
    exit_process(0)  # no backend teardown: it can abort (gloo) or hang (NCCL after graphs); see exit_process


if __name__ == "__main__":
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5])
