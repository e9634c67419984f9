"""Step plans and the code that runs them, on every rank.

Rank 0's scheduler decides each step (which lanes end, which start, one prompt chunk or one decode round) and
broadcasts it as a small `StepPlan`; every rank, rank 0 included, applies it through the same `StepExecutor`, so the
model sees the same calls in the same order everywhere. Ranks > 0 run `follow_plans` until a shutdown plan arrives
or rank 0 disappears (a collective then fails and the rank exits).
"""

from __future__ import annotations

import logging
import sys
from dataclasses import dataclass, field
from typing import Any

import torch

from engine.config import EngineConfig
from engine.reuse import KeptStates
from engine.runner.lanes import LaneDecoder
from engine.runner.protocol import LaneCapable, ServingModel

log = logging.getLogger("engine.runner")


@dataclass
class StepPlan:
    releases: list[int] = field(default_factory=list)  # lanes whose sequence ends (slots back to the pool)
    commits: list[tuple[int, int]] = field(default_factory=list)  # (lane, rows it keeps of its last verify step)
    admits: list[int] = field(default_factory=list)  # lanes that get a fresh sequence
    # (lane, kept-state path, root first): an admitted lane goes on from a kept prompt state (engine/reuse.py)
    resumes: list[tuple[int, list[int]]] = field(default_factory=list)
    drops: list[tuple[int, bool]] = field(default_factory=list)  # kept states dropped: (node, whole or snapshot only)
    prefill: tuple[int, list[int]] | None = None  # (lane, prompt chunk ids)
    prefill_logits: bool = False  # every token's logits of the chunk, not only the last one's (prompt logprobs)
    # rows in place of some of the chunk's token embeddings: (offsets in the chunk, rows [n, hidden] on the CPU), an
    # image's share of the vision tower's output (rank 0 runs the tower; every rank takes the rows from the plan)
    embeds: tuple[list[int], torch.Tensor] | None = None
    keep: tuple[int, int] | None = None  # after the prefill chunk: keep the lane's state as (node, page start)
    adopt: list[int] = field(default_factory=list)  # after the prefill chunk: its rows so far are these kept ones
    # (lanes, each lane's window: its pending token, then its drafts, -1 for a draft the MTP layer makes in the
    # step); all windows of one token and nothing to absorb: a plain decode step
    decode: tuple[list[int], list[list[int]]] | None = None
    # with the MTP layer: per decode lane, the tokens it committed since its last step, which the layer takes in
    # before it drafts (empty: the lane does not use it)
    absorb: list[list[int]] | None = None
    # with the MTP layer: lane -> the tokens its draft 1 may be (a structured output's mask at the position after
    # the pending token, int32 words: bit j of word w is token 32w + j); every rank drafts with it
    draft_masks: dict[int, Any] | None = None
    shutdown: bool = False

    @property
    def is_heartbeat(self) -> bool:
        return not (
            self.releases
            or self.commits
            or self.admits
            or self.resumes
            or self.drops
            or self.prefill
            or self.decode
            or self.shutdown
        )

    @property
    def verifies(self) -> bool:
        """A decode step with drafts (or with MTP rows to absorb): every lane of it keeps row states, and commits in a
        later plan."""
        if self.decode is None:
            return False
        return any(len(window) > 1 for window in self.decode[1]) or any(self.absorb or ())


class StepOutOfMemory(Exception):
    """A step's prefill chunk (with the kept state it adopts or keeps) or decode round ran out of GPU memory
    (torch.OutOfMemoryError, its cause), or the chunk's lane could not resume from its kept state for lack of it
    (`StepExecutor.failed_resumes`). `lanes`: the lanes in it, whose rows and states may be half written. The plan's
    bookkeeping before it (releases, commits, admissions, resumes, drops) was applied; of the chunk's state nothing
    was kept (`KeptStates.keep` copies before it records). Out of memory anywhere else in a step is a failed step as
    any other."""

    def __init__(self, lanes: list[int]) -> None:
        super().__init__(f"the step of lanes {lanes} ran out of GPU memory")
        self.lanes = lanes


class StepExecutor:
    """Holds this rank's sequences by lane and applies plans to the model. A model that can take a static step over
    lane-indexed state (`decode_step`, the `LaneModel` protocol) decodes through a `LaneDecoder` (CUDA graphs on a
    GPU when `graphs`); `lanes` is the number of lanes (PARALLEL)."""

    @classmethod
    def for_config(cls, model: ServingModel, pool: Any, cfg: EngineConfig) -> StepExecutor:
        """The executor a rank serves with: PARALLEL lanes, CUDA graphs as --cuda-graphs says, verify windows of
        1 + --draft-tokens rows when a drafter is on."""
        return cls(model, pool, lanes=cfg.parallel, graphs=cfg.cuda_graphs, window=cfg.verify_window)

    def __init__(self, model: ServingModel, pool: Any, lanes: int = 4, graphs: bool = True, window: int = 1) -> None:
        self.model = model
        self.pool = pool
        self.lanes: dict[int, Any] = {}
        self.kept = KeptStates(pool)
        self.proposed: list[list[int]] | None = None  # the last decode step's MTP drafts by lane row (rank 0 reads)
        # the lanes whose resume from a kept state ran out of GPU memory in the last step (rank 0 reads): each
        # holds what its lane took before the error, released with the lane; the step's other work ran
        self.failed_resumes: list[int] = []
        self.decoder = (
            LaneDecoder(model, pool, lanes, graphs, window=window) if isinstance(model, LaneCapable) else None
        )

    @property
    def window(self) -> int:
        """The most tokens a lane may have in one decode step (1: no drafts can be verified)."""
        return self.decoder.state.window if self.decoder is not None else 1

    @property
    def drafts_with_mtp(self) -> bool:
        """Whether the model's MTP layer can draft here (loaded, with verify windows)."""
        return self.decoder is not None and self.decoder.mtp

    @torch.inference_mode()
    def run(self, plan: StepPlan) -> torch.Tensor | None:
        """Apply one plan; returns, where the step made them, prefill logits [vocab] ([T, vocab] with
        `prefill_logits`), decode logits [B, W, vocab] (W: the widest window), or None. Rank 0 samples the rows on
        that device (engine/sampling.py works on either): on a GPU no row crosses to the host, and a step's rows are
        drawn together in a few dozen small kernels, where one core of a host took 1–6 ms a row at GLM-5.3-Flash's
        154,880 tokens (0.1–30 ms since session 38, top_p on a flat row the most; docs/BENCHMARKS.md); a prompt's
        logprobs are made there too (`sampling.rows_logprobs`). Only a kept prompt state takes its chunk's last
        row to the host (the scheduler copies it; engine/reuse.py)."""
        for lane in plan.releases:
            seq = self.lanes.pop(lane, None)
            if seq is not None:
                seq.release()
        for lane, rows in plan.commits:
            if self.decoder is None:
                raise RuntimeError("a commit needs the lane decoder")
            self.decoder.commit(self.lanes[lane], rows)
        for lane in plan.admits:
            self.lanes[lane] = (
                self.decoder.new_sequence(lane) if self.decoder is not None else self.model.new_sequence(self.pool)
            )
        self.failed_resumes = []
        resume_error: torch.OutOfMemoryError | None = None
        for lane, path in plan.resumes:
            try:
                self.kept.resume(self.lanes[lane], path)
            except torch.OutOfMemoryError as exc:  # that request fails alone (one rank; the scheduler decides)
                log.error("lane %d's resume from a kept state ran out of GPU memory (%s)", lane, str(exc))
                self.failed_resumes.append(lane)
                resume_error = exc
        for node, whole in plan.drops:  # after the releases: a dropped page's rows may be free now
            self.kept.drop(node, whole)
        if plan.prefill is not None:
            lane, ids = plan.prefill
            if lane in self.failed_resumes:  # its state is not there to go on from: the chunk fails with it
                raise StepOutOfMemory([lane]) from resume_error
            seq = self.lanes[lane]
            if plan.prefill_logits and (plan.keep is not None or plan.adopt):
                raise ValueError(
                    "a chunk that keeps every row's logits keeps no prompt state (its logits stay on the GPU)"
                )
            extra: dict[str, Any] = {"embeds": plan.embeds} if plan.embeds is not None else {}
            try:
                logits = (
                    self.model.prefill(seq, list(ids), all_logits=True, **extra)
                    if plan.prefill_logits
                    else self.model.prefill(seq, list(ids), **extra)
                )
                if plan.adopt:
                    self.kept.adopt(seq, plan.adopt)
                if plan.keep is not None:  # nothing of it kept unless it all was
                    self.kept.keep(plan.keep[0], seq, plan.keep[1])
                return _settled(logits)  # every row's with `prefill_logits` ([T, vocab]: 1.3 GB of fp32 at 2,048)
            except torch.OutOfMemoryError as exc:
                raise StepOutOfMemory([lane]) from exc
        if plan.decode is not None:
            try:
                return self._decode(plan)
            except torch.OutOfMemoryError as exc:
                raise StepOutOfMemory(list(plan.decode[0])) from exc
        return None

    def _decode(self, plan: StepPlan) -> torch.Tensor:
        assert plan.decode is not None
        lanes, windows = plan.decode
        seqs = [self.lanes[lane] for lane in lanes]
        self.proposed = None
        if plan.verifies:
            if self.decoder is None:
                raise RuntimeError("drafts need the lane decoder")
            logits = self.decoder.verify(seqs, [list(w) for w in windows], plan.absorb, plan.draft_masks)
            if self.decoder.proposed is not None:
                self.proposed = self.decoder.proposed.cpu().tolist()
        else:
            decode = self.decoder.decode if self.decoder is not None else self.model.decode
            logits = decode(seqs, [w[0] for w in windows]).unsqueeze(1)
        return _settled(logits)

    def release_all(self) -> None:
        for lane in list(self.lanes):
            self.lanes.pop(lane).release()
        self.kept.release_all()


def _settled(logits: torch.Tensor) -> torch.Tensor:
    """Logits left on their GPU once the step that made them is done: its own errors surface here, as a failed step,
    not later in the sampling of a row."""
    if logits.is_cuda:
        torch.cuda.current_stream(logits.device).synchronize()
    return logits


def follow_plans(group: Any, executor: StepExecutor) -> int:
    """The loop of ranks > 0. Returns the process exit code: 0 on a shutdown plan, 1 when rank 0 is gone."""
    steps = 0
    while True:
        try:
            plan = group.broadcast_object(None)
        except Exception as exc:  # the peer closed the connection or the collective timed out
            print(
                f"rank {group.rank}: rank 0 is gone ({type(exc).__name__}: {exc}); exiting", file=sys.stderr, flush=True
            )
            return 1
        if not isinstance(plan, StepPlan):
            print(f"rank {group.rank}: unexpected message {type(plan).__name__}; exiting", file=sys.stderr, flush=True)
            return 1
        if plan.shutdown:
            log.info("rank %d: shutdown after %d steps", group.rank, steps)
            executor.release_all()
            return 0
        try:
            executor.run(plan)
            if executor.failed_resumes:  # rank 0's lanes would no longer match this rank's: stop as for any failure
                raise StepOutOfMemory(executor.failed_resumes)
        except Exception as exc:
            cause = f" ({exc.__cause__})" if isinstance(exc, StepOutOfMemory) else ""
            print(
                f"rank {group.rank}: step {steps} failed ({type(exc).__name__}: {exc}{cause}); exiting",
                file=sys.stderr,
                flush=True,
            )
            return 1
        steps += 1
