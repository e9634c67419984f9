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

import functools
import logging
from collections.abc import Callable

import numpy as np
import torch

from engine import ops
from engine.cache import KVPool, LaneState, Sequence
from engine.runner.protocol import LaneModel

log = logging.getLogger("engine.lanes")

MIN_SPAN = 64


class CapturedStep:
    """One static step captured: `run(inputs)` over a fixed inputs buffer (its first capture warms up on the scratch
    lane, which is reset after); `replay(inputs)` -> the graph's output buffer."""

    def __init__(self, run: Callable[[torch.Tensor], torch.Tensor], scratch: torch.Tensor, lanes: LaneState, mempool):
        dev = lanes.pool.rows.device
        self.inputs = scratch
        side = torch.cuda.Stream(dev)
        side.wait_stream(torch.cuda.current_stream(dev))
        with torch.cuda.stream(side):  # warm-up: Triton compiles, cuBLAS picks its kernels, nothing syncs later
            for _ in range(2):
                run(self.inputs)
        torch.cuda.current_stream(dev).wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph, pool=mempool, capture_error_mode="thread_local"):
            self.output = run(self.inputs)
        lanes.reset(lanes.scratch_lane)

    def replay(self, inputs: torch.Tensor) -> torch.Tensor:
        self.inputs.copy_(inputs, non_blocking=True)
        self.graph.replay()
        return self.output


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
        # with an MTP layer that drafts, lanes keep their last hidden rows for it (models without one say 0)
        self.mtp = window > 1 and getattr(model, "mtp_hidden_size", 0) > 0
        hidden = model.mtp_hidden_size if self.mtp else 0
        self.state = LaneState(pool, num_lanes, model.kda_state_shapes(), window=window, hidden=hidden)
        self.proposed: torch.Tensor | None = None  # the last verify step's MTP drafts [B, 1 + chain] (device)
        # with the MTP layer: the tokens each lane's draft 1 may be (a structured output's mask, `verify`'s masks;
        # all bits set: any), read by the MTP step (a graph reads it in place)
        words = -(-model.vocab_size // 32) if self.mtp else 0
        self.draft_mask = torch.full((num_lanes + 1, words), -1, dtype=torch.int32, device=pool.rows.device)
        self._masked: set[int] = set()  # lanes whose mask row is not all bits set
        self._advanced: set[int] = set()  # lanes of the last verify step, when it was one row wide
        if window > 1:  # a verified draft must equal the serial token: a row's bits may not depend on its batch
            ops.require_row_invariance()
        self.device = pool.rows.device
        graphs = graphs and self.device.type == "cuda"
        self.group = model.group
        if self.group.is_distributed:  # every rank constructs its decoder at the same point of the same plan
            graphs = self.group.all_agree(graphs)
        self.graphs: dict[tuple, CapturedStep] | None = {} if graphs else None
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
        logits = self._step(torch.tensor(rows, dtype=torch.long), len(seqs), 1, max(s.length for s in seqs) + 1)
        for seq in seqs:
            seq.length += 1
        return logits

    @torch.no_grad()
    def verify(
        self,
        seqs: list[Sequence],
        windows: list[list[int]],
        absorb: list[list[int]] | None = None,
        masks: dict[int, np.ndarray] | None = None,
    ) -> torch.Tensor:
        """A verify step: each lane-bound sequence gets its window of tokens (its pending token, then its drafts) at
        the positions that follow it; fp32 logits [B, W, vocab] for every row (W: the widest window; a shorter
        window's rows past its end are padding on the scratch lane). No sequence advances until `commit`.

        With the MTP layer, `absorb` gives each lane the tokens it committed since its last step (the pending token
        last; empty: the lane does not use the layer): the layer takes them in first, then drafts, and a window's
        tokens given as -1 are its drafts, filled on the device (`proposed` keeps them for rank 0 to compare).
        `masks`: lane -> the tokens its draft 1 may be, int32 words (bit j of word w is token 32w + j): a structured
        output's mask at the position after the pending token; the other lanes' draft 1 may be any token."""
        if any(seq.lane is None for seq in seqs):
            raise ValueError("LaneDecoder.verify takes sequences from LaneDecoder.new_sequence")
        width = max(len(w) for w in windows)
        if not 1 <= width <= self.state.window or min(len(w) for w in windows) < 1:
            raise ValueError(f"verify windows hold 1..{self.state.window} tokens (got {[len(w) for w in windows]})")
        drafts = self._draft(seqs, windows, absorb, masks) if absorb is not None and any(absorb) else None
        rows: list[list[int]] = [[], [], [], []]
        fill: tuple[list[int], list[int]] = ([], [])  # rows whose token is an MTP draft, and which draft
        pad = (self.state.scratch_lane, 0, 0, self.pool.scratch_slot)
        for b, (seq, window) in enumerate(zip(seqs, windows)):
            for t in range(width):
                pos = seq.length + t
                row = (_lane(seq), max(window[t], 0), pos, seq.slot_at(pos)) if t < len(window) else pad
                if t < len(window) and window[t] < 0:
                    if drafts is None or t == 0:
                        raise ValueError("a window's first token is its pending one; only drafts can come from MTP")
                    fill[0].append(b * width + t)
                    fill[1].append(b * drafts.shape[1] + t - 1)
                for column, value in zip(rows, row):
                    column.append(value)
        inputs = torch.tensor(rows, dtype=torch.long)
        if fill[0]:
            assert drafts is not None
            inputs = inputs.to(self.device)
            where = torch.tensor(fill, dtype=torch.long).to(self.device, non_blocking=True)
            inputs[1, where[0]] = drafts.reshape(-1)[where[1]]
        self.proposed = drafts
        logits = self._step(inputs, len(seqs), width, max(s.length for s in seqs) + width)
        # a step one row wide advances the lanes' own states (no row states are kept): their commit only counts
        self._advanced = {_lane(seq) for seq in seqs} if width == 1 else set()
        return logits.view(len(seqs), width, -1)

    def _draft(
        self,
        seqs: list[Sequence],
        windows: list[list[int]],
        absorb: list[list[int]],
        masks: dict[int, np.ndarray] | None = None,
    ) -> torch.Tensor:
        """The MTP layer's step before a verify: each lane absorbs its committed tokens (right-aligned in a block as
        wide as the most any lane absorbs), then the layer chains as far as the widest run of -1 drafts needs; draft
        1 of a lane in `masks` is one of the tokens its mask allows. Drafts [B, 1 + chain]."""
        if not self.mtp:
            raise RuntimeError("MTP drafts need the model loaded with its MTP layer and verify windows")
        width = max(len(tokens) for tokens in absorb)
        if any(min(w[1:], default=0) < 0 and max(w[1:]) >= 0 for w in windows):
            raise ValueError("a window's drafts come all from the MTP layer (-1) or none do")
        used = [sum(1 for token in w[1:] if token < 0) for w in windows]  # MTP drafts each window asks for
        chain = max(0, max(used) - 1)
        pad = (self.state.scratch_lane, 0, 0, self.pool.scratch_slot, 0)
        cols: list[list[int]] = [[], [], [], [], []]

        def add(row: tuple[int, ...]) -> None:
            for column, value in zip(cols, row):
                column.append(value)

        for seq, tokens in zip(seqs, absorb):
            if len(tokens) > self.state.window:
                raise ValueError(f"a lane absorbs at most {self.state.window} tokens a step (got {len(tokens)})")
            first = seq.length - len(tokens) + 1  # the last absorbed token is the pending one, at seq.length
            for j in range(width):
                t = j - (width - len(tokens))
                add((_lane(seq), tokens[t], first + t, seq.slot_at(first + t), t) if t >= 0 else pad)
        for j in range(1, chain + 1):
            for seq, wanted in zip(seqs, used):
                add((_lane(seq), 0, seq.length + j, seq.slot_at(seq.length + j), 0) if j < wanted else pad)
        batch, span = len(seqs), self.span_for(max(s.length for s in seqs) + self.state.window)
        self._set_masks(masks or {})
        run = functools.partial(
            self.model.mtp_draft, self.state, span=span, width=width, chain=chain, mask=self.draft_mask
        )
        return self._run(("mtp", batch, width, chain, span), run, torch.tensor(cols, dtype=torch.long), 5)

    def _set_masks(self, masks: dict[int, np.ndarray]) -> None:
        """`draft_mask`'s rows: each lane of `masks` its words (zero past them), every other lane all bits set: one
        copy of the whole buffer from the host, in the stream's order before the MTP step, in each step while a lane
        has a mask or had one in the step before (none otherwise)."""
        if not masks and not self._masked:
            return
        rows = torch.full(self.draft_mask.shape, -1, dtype=torch.int32)
        for lane, words in masks.items():
            rows[lane] = 0
            count = min(len(words), rows.shape[1])
            rows[lane, :count] = torch.from_numpy(np.asarray(words[:count], dtype=np.int32))
        if self.device.type == "cuda":
            rows = rows.pin_memory()
        self.draft_mask.copy_(rows, non_blocking=True)
        self._masked = set(masks)

    def commit(self, seq: Sequence, rows: int) -> None:
        """After `verify`: the sequence keeps its first `rows` rows (its pending token and the accepted drafts)."""
        if seq.lane is None or not 1 <= rows <= self.state.window:
            raise ValueError(f"commit of {rows} rows on lane {seq.lane}")
        if seq.lane in self._advanced:
            if rows != 1:
                raise ValueError(f"commit of {rows} rows after a one-row step on lane {seq.lane}")
            self._advanced.discard(seq.lane)
        else:
            self.state.commit(seq.lane, rows)
        seq.length += rows

    def _step(self, inputs: torch.Tensor, batch: int, width: int, tokens: int) -> torch.Tensor:
        """Run the static step on `inputs` ([lane, token, position, slot] rows), from a graph when there is one."""
        span = self.span_for(tokens)
        run = functools.partial(self.model.decode_step, self.state, span=span, width=width)
        return self._run((batch, width, span), run, inputs, 4)

    def _run(
        self, key: tuple, run: Callable[[torch.Tensor], torch.Tensor], inputs: torch.Tensor, fields: int
    ) -> torch.Tensor:
        """`run(inputs)` eagerly, or replayed from the graph captured for `key` (inputs of `fields` rows)."""
        graph = self._graph(key, run, inputs.shape[1], fields) if self.graphs is not None else None
        if graph is not None:
            source = inputs if inputs.is_cuda else inputs.pin_memory()
            return graph.replay(source).clone()
        return run(inputs.to(self.device))

    def _graph(
        self, key: tuple, run: Callable[[torch.Tensor], torch.Tensor], columns: int, fields: int
    ) -> CapturedStep | None:
        graphs = self.graphs
        if graphs is None:
            return None
        if key not in graphs:
            captured, reason = None, ""
            scratch = [self.state.scratch_lane, 0, 0, self.pool.scratch_slot, 0][:fields]
            inputs = torch.tensor([[v] * columns for v in scratch], dtype=torch.long, device=self.device)
            try:
                captured = CapturedStep(run, inputs, self.state, self._mempool)
            except Exception as exc:  # any capture failure: serve on, eagerly
                reason = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
                restore_generator(self.device)
                self.state.reset(self.state.scratch_lane)
            everyone = self.group.all_agree(captured is not None)  # outside any capture; a no-op on one rank
            if not everyone or captured is None:
                if not reason:
                    reason = "another rank's capture failed"
                log.warning("CUDA graph capture failed (%s: %s); decoding without graphs", _describe(key), reason)
                self.graphs = None
                return None
            graphs[key] = captured
        return graphs[key]


def _describe(key: tuple) -> str:
    if key[0] == "mtp":
        return "MTP drafts, batch {}, width {}, chain {}, span {}".format(*key[1:])
    return "batch {}, width {}, span {}".format(*key)


def _lane(seq: Sequence) -> int:
    if seq.lane is None:
        raise ValueError("the lane decoder takes sequences from LaneDecoder.new_sequence")
    return seq.lane


def restore_generator(device: torch.device) -> None:
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
