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

from engine import ops
from engine.cache import KVPool, LaneState, Sequence
from engine.runner.protocol import LaneModel

log = logging.getLogger("engine.lanes")

MIN_SPAN = 64


class CapturedStep:
    """The decode step for one (batch, width, span), captured; `replay(inputs)` -> the graph's logits buffer."""

    def __init__(self, model: LaneModel, lanes: LaneState, batch: int, span: int, mempool, width: int = 1) -> None:
        dev = lanes.pool.rows.device
        rows = batch * width
        scratch = [[lanes.scratch_lane] * rows, [0] * rows, [0] * rows, [lanes.pool.scratch_slot] * rows]
        self.inputs = torch.tensor(scratch, dtype=torch.long, device=dev)
        side = torch.cuda.Stream(dev)
        side.wait_stream(torch.cuda.current_stream(dev))
        with torch.cuda.stream(side):  # warm-up: Triton compiles, cuBLAS picks its kernels, nothing syncs later
            for _ in range(2):
                model.decode_step(lanes, self.inputs, span, width)
        torch.cuda.current_stream(dev).wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph, pool=mempool, capture_error_mode="thread_local"):
            self.logits = model.decode_step(lanes, self.inputs, span, width)
        lanes.reset(lanes.scratch_lane)

    def replay(self, inputs: torch.Tensor) -> torch.Tensor:
        self.inputs.copy_(inputs, non_blocking=True)
        self.graph.replay()
        return self.logits


class LaneDecoder:
    """Sequences bound to lanes, and their decode step (graphs on a GPU, eager elsewhere)."""

    def __init__(
        self,
        model: LaneModel,
        pool: KVPool,
        num_lanes: int,
        graphs: bool = True,
        min_span: int = MIN_SPAN,
        window: int = 1,
    ) -> None:
        """`graphs`: capture and replay where the device allows it (CUDA); with several ranks, only when every rank
        says so (EngineConfig.cuda_graphs is part of the ranks' fingerprint, so they do). `window`: the most rows a
        lane may have in a verify step (1 + the most drafts; 1 = no drafts)."""
        self.model, self.pool = model, pool
        self.state = LaneState(pool, num_lanes, model.kda_state_shapes(), window=window)
        if window > 1:  # a verified draft must equal the serial token: a row's bits may not depend on its batch
            ops.require_row_invariance()
        self.device = pool.rows.device
        graphs = graphs and self.device.type == "cuda"
        self.group = model.group
        if self.group.is_distributed:  # every rank constructs its decoder at the same point of the same plan
            graphs = self.group.all_agree(graphs)
        self.graphs: dict[tuple[int, int, int], CapturedStep] | None = {} if graphs else None
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
        rows = [[_lane(s) for s in seqs], list(ids), [s.length for s in seqs], [s.next_slot() for s in seqs]]
        logits = self._step(rows, len(seqs), 1, max(s.length for s in seqs) + 1)
        for seq in seqs:
            seq.length += 1
        return logits

    @torch.no_grad()
    def verify(self, seqs: list[Sequence], windows: list[list[int]]) -> torch.Tensor:
        """A verify step: each lane-bound sequence gets its window of tokens (its pending token, then its drafts) at
        the positions that follow it; fp32 logits [B, W, vocab] for every row (W: the widest window; a shorter
        window's rows past its end are padding on the scratch lane). No sequence advances until `commit`."""
        if any(seq.lane is None for seq in seqs):
            raise ValueError("LaneDecoder.verify takes sequences from LaneDecoder.new_sequence")
        width = max(len(w) for w in windows)
        if not 1 <= width <= self.state.window or min(len(w) for w in windows) < 1:
            raise ValueError(f"verify windows hold 1..{self.state.window} tokens (got {[len(w) for w in windows]})")
        rows: list[list[int]] = [[], [], [], []]
        pad = (self.state.scratch_lane, 0, 0, self.pool.scratch_slot)
        for seq, window in zip(seqs, windows):
            for t in range(width):
                pos = seq.length + t
                row = (_lane(seq), window[t], pos, seq.slot_at(pos)) if t < len(window) else pad
                for column, value in zip(rows, row):
                    column.append(value)
        logits = self._step(rows, len(seqs), width, max(s.length for s in seqs) + width)
        return logits.view(len(seqs), width, -1)

    def commit(self, seq: Sequence, rows: int) -> None:
        """After `verify`: the sequence keeps its first `rows` rows (its pending token and the accepted drafts)."""
        if seq.lane is None or not 1 <= rows <= self.state.window:
            raise ValueError(f"commit of {rows} rows on lane {seq.lane}")
        self.state.commit(seq.lane, rows)
        seq.length += rows

    def _step(self, rows: list[list[int]], batch: int, width: int, tokens: int) -> torch.Tensor:
        """Run the static step on `rows` ([lane, token, position, slot] columns), from a graph when there is one."""
        inputs = torch.tensor(rows, dtype=torch.long)
        span = self.span_for(tokens)
        graph = self._graph(batch, span, width) if self.graphs is not None else None
        if graph is not None:
            return graph.replay(inputs.pin_memory()).clone()
        return self.model.decode_step(self.state, inputs.to(self.device), span, width)

    def _graph(self, batch: int, span: int, width: int = 1) -> CapturedStep | None:
        key, graphs = (batch, width, span), self.graphs
        if graphs is None:
            return None
        if key not in graphs:
            captured, reason = None, ""
            try:
                captured = CapturedStep(self.model, self.state, batch, span, self._mempool, width)
            except Exception as exc:  # any capture failure: serve on, eagerly
                reason = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
                _restore_generator(self.device)
                self.state.reset(self.state.scratch_lane)
            everyone = self.group.all_agree(captured is not None)  # outside any capture; a no-op on one rank
            if not everyone or captured is None:
                if not reason:
                    reason = "another rank's capture failed"
                log.warning(
                    "CUDA graph capture failed (batch %d, width %d, span %d: %s); decoding without graphs",
                    batch,
                    width,
                    span,
                    reason,
                )
                self.graphs = None
                return None
            graphs[key] = captured
        return graphs[key]


def _lane(seq: Sequence) -> int:
    if seq.lane is None:
        raise ValueError("the lane decoder takes sequences from LaneDecoder.new_sequence")
    return seq.lane


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
