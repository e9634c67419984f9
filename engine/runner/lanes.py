"""The serving decode path: one static, sync-free step over lanes, replayed from CUDA graphs on a GPU.

A lane is a stream's fixed seat (0..PARALLEL-1, chosen by the scheduler). Each lane owns preallocated state
(`engine.cache.LaneState`: KDA state and conv windows, its row of the slot table), so a decode step is a function
of four small device tensors — lane, token, position and new pool slot of each stream — and of `span`, how many
slot-table entries every stream reads (a power of two ≥ the longest stream, so it changes rarely). Nothing in the
step depends on the data through a shape or a host read (`Glm5NextForCausalLM.decode_step`).

On CUDA, `LaneDecoder` captures that step once per (batch, span) in a `torch.cuda.CUDAGraph` (warm-up on a side
stream, on the scratch lane and the pool's scratch row, so no stream's state is touched) and replays it: streams
joining or leaving change only the lane ids fed in, never the graph. A capture that fails falls back to the eager
step with one warning. `--cuda-graphs 0` (CUDA_GRAPHS=0) turns graphs off.

With several ranks (NCCL) the captured step holds the collectives too: each has fixed shapes and reads nothing back
(`ParallelGroup.sum_partials`, `gather_last_dim` with the vocab widths fixed at load). Capturing an NCCL operation is
a collective property of it, so every rank must capture the same graphs in the same order and replay them together:
they do, as every rank executes the same step plans. Whether graphs are used at all, and whether each capture
succeeded, is agreed by a small collective outside any graph (`ParallelGroup.all_agree`): when one rank's capture
fails, every rank drops that graph and all decode eagerly from then on, together (a lone fallback would deadlock).
The warm-up before each capture runs the step's collectives eagerly, so the communicator exists before capture.
"""

from __future__ import annotations

import logging

import torch

from engine.cache import KVPool, LaneState, Sequence
from engine.runner.protocol import LaneModel

log = logging.getLogger("engine.lanes")

MIN_SPAN = 64


class CapturedStep:
    """The decode step for one (batch, span), captured; `replay(inputs)` -> the graph's logits buffer."""

    def __init__(self, model: LaneModel, lanes: LaneState, batch: int, span: int, mempool) -> None:
        dev = lanes.pool.rows.device
        scratch = [[lanes.scratch_lane] * batch, [0] * batch, [0] * batch, [lanes.pool.scratch_slot] * batch]
        self.inputs = torch.tensor(scratch, dtype=torch.long, device=dev)
        side = torch.cuda.Stream(dev)
        side.wait_stream(torch.cuda.current_stream(dev))
        with torch.cuda.stream(side):  # warm-up: Triton compiles, cuBLAS picks its kernels, nothing syncs later
            for _ in range(2):
                model.decode_step(lanes, self.inputs, span)
        torch.cuda.current_stream(dev).wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph, pool=mempool, capture_error_mode="thread_local"):
            self.logits = model.decode_step(lanes, self.inputs, span)
        lanes.reset(lanes.scratch_lane)

    def replay(self, inputs: torch.Tensor) -> torch.Tensor:
        self.inputs.copy_(inputs, non_blocking=True)
        self.graph.replay()
        return self.logits


class LaneDecoder:
    """Sequences bound to lanes, and their decode step (graphs on a GPU, eager elsewhere)."""

    def __init__(
        self, model: LaneModel, pool: KVPool, num_lanes: int, graphs: bool = True, min_span: int = MIN_SPAN
    ) -> None:
        """`graphs`: capture and replay where the device allows it (CUDA); with several ranks, only when every rank
        says so (EngineConfig.cuda_graphs is part of the ranks' fingerprint, so they do)."""
        self.model, self.pool = model, pool
        self.state = LaneState(pool, num_lanes, model.kda_state_shapes())
        self.device = pool.rows.device
        graphs = graphs and self.device.type == "cuda"
        self.group = model.group
        if self.group.is_distributed:  # every rank constructs its decoder at the same point of the same plan
            graphs = self.group.all_agree(graphs)
        self.graphs: dict[tuple[int, int], CapturedStep] | None = {} if graphs else None
        self._mempool = torch.cuda.graph_pool_handle() if graphs else None
        self.min_span = min_span
        self.pad_spans = graphs  # a graph needs a span from a few buckets; eager steps read exactly what they need

    @property
    def uses_graphs(self) -> bool:
        return self.graphs is not None

    def new_sequence(self, lane: int) -> Sequence:
        return self.state.bind(lane)

    def span_for(self, tokens: int) -> int:
        """Slot-table entries a step reads when its longest stream holds `tokens` tokens: a power of two (at least
        `min_span`) when padding for graphs, else `tokens`."""
        if not self.pad_spans:
            return tokens
        return min(max(self.min_span, 1 << (tokens - 1).bit_length()), self.state.slots.shape[1])

    @torch.no_grad()
    def decode(self, seqs: list[Sequence], ids: list[int]) -> torch.Tensor:
        """One token for each lane-bound sequence; fp32 logits [B, vocab] (a fresh tensor)."""
        if any(seq.lane is None for seq in seqs):
            raise ValueError("LaneDecoder.decode takes sequences from LaneDecoder.new_sequence")
        rows = [[s.lane for s in seqs], list(ids), [s.length for s in seqs], [s.next_slot() for s in seqs]]
        inputs = torch.tensor(rows, dtype=torch.long)
        span = self.span_for(max(s.length for s in seqs) + 1)
        graph = self._graph(len(seqs), span) if self.graphs is not None else None
        if graph is not None:
            logits = graph.replay(inputs.pin_memory()).clone()
        else:
            logits = self.model.decode_step(self.state, inputs.to(self.device), span)
        for seq in seqs:
            seq.length += 1
        return logits

    def _graph(self, batch: int, span: int) -> CapturedStep | None:
        key, graphs = (batch, span), self.graphs
        if graphs is None:
            return None
        if key not in graphs:
            captured, reason = None, ""
            try:
                captured = CapturedStep(self.model, self.state, batch, span, self._mempool)
            except Exception as exc:  # any capture failure: serve on, eagerly
                reason = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
                _restore_generator(self.device)
                self.state.reset(self.state.scratch_lane)
            everyone = self.group.all_agree(captured is not None)  # outside any capture; a no-op on one rank
            if not everyone or captured is None:
                if not reason:
                    reason = "another rank's capture failed"
                log.warning(
                    "CUDA graph capture failed (batch %d, span %d: %s); decoding without graphs", batch, span, reason
                )
                self.graphs = None
                return None
            graphs[key] = captured
        return graphs[key]


def _restore_generator(device: torch.device) -> None:
    """A capture that raised skips the CUDA generator's capture epilogue (torch 2.11), leaving it marked as capturing:
    every later random draw on the device then fails ("Offset increment outside graph capture encountered
    unexpectedly"; seen on the H200). One trivial capture that succeeds runs the prologue and epilogue again."""
    try:
        probe = torch.zeros(1, device=device)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            probe.add_(1)
    except Exception as exc:
        log.warning("the CUDA random generator may stay unusable after the failed capture (%s)", exc)
