"""Rank 0's scheduler: PARALLEL lanes, chunked prefill interleaved with decode rounds, a capped queue.

All model calls happen in one dedicated thread (`Scheduler.start`). The asyncio server talks to it only through
`submit` / `cancel` (thread-safe) and each request's `sink`, a callback that receives `Token` / `Finished` / `Failed`
events on the scheduler thread (the server forwards them into an asyncio queue).

Each iteration: drain the inbox, release finished or cancelled lanes, admit waiting requests into free lanes while
the pool can hold their whole budget (prompt + max_tokens), then run ONE unit of work: a prompt chunk of the oldest
filling stream or a decode round over every decoding stream, alternating when both exist, so a long prompt never
freezes running replies. The step is broadcast to the other ranks and applied through the same `StepExecutor`.

Drafts (`drafter`, engine/drafts.py): a decode round gives each lane a window — its pending token and up to
`draft_tokens` drafts — and every row comes back with logits. Row t is sampled with the keyed rule at its absolute
position, exactly as a one-token step would sample it; the draft after it counts only while it equals that sample.
The lane commits the rows it kept (the pending token and the accepted drafts) in the next plan, and the first
sample that differs from its draft is the new pending token. The reply is therefore the serial reply token for
token (`"draft": false` runs a request without drafts: the same tokens, one a step).

Prompt reuse (engine/reuse.py): an admitted request resumes from the longest kept prompt state its prompt starts
with (its lane adopts the kept rows and KDA state; it prefills only the rest), and its own prefill keeps states at
chosen chunk boundaries. Kept states never hold a request back: admission evicts them whenever the pool would
otherwise make a request wait.
"""

from __future__ import annotations

import collections
import logging
import math
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import torch.distributed

from engine.cache import kda_state_bytes
from engine.config import EngineConfig
from engine.drafts import CopyDrafter
from engine.reuse import Node, PrefixIndex, chunk_keys
from engine.runner.executor import StepExecutor, StepOutOfMemory, StepPlan
from engine.sampling import LogprobEntry, SamplingParams, rows_logprobs, sample_rows, to_device, token_logprobs
from engine.structured import Constraint
from engine.vision.prompt import PromptImage, chunk_rows, items, key_ids

log = logging.getLogger("engine.scheduler")


@dataclass(frozen=True)
class Token:
    id: int
    logprob: float | None = None  # with Request.logprobs set: its log-probability and the top alternatives
    top: tuple[tuple[int, float], ...] = ()
    # the request's (drafted, accepted) tokens once the step that made this one is counted: what a reply's usage
    # reports, up to the token a client's stop string ends it at
    drafts: tuple[int, int] = (0, 0)


@dataclass(frozen=True)
class PromptLogprobs:
    """Sent once a prompt is prefilled when Request.prompt_logprobs: for each prompt token after the first, its
    log-probability given the tokens before it, and the top alternatives."""

    entries: tuple[tuple[float, tuple[tuple[int, float], ...]], ...]


@dataclass(frozen=True)
class Finished:
    reason: str  # "stop" (end token), "length" (max_tokens) or "cancelled"
    completion_tokens: int
    cached_tokens: int = 0  # prompt tokens resumed from a kept state, not prefilled


@dataclass(frozen=True)
class Failed:
    message: str


Event = Token | PromptLogprobs | Finished | Failed
Drawn = tuple[int, LogprobEntry | None]  # a row's token drawn with its step's (`Scheduler._draw`), and its entry


def _on(like: torch.Tensor, index: list) -> torch.Tensor:
    """`index` as an int64 tensor on `like`'s device, not waited for (`sampling.to_device`)."""
    return to_device(torch.tensor(index, dtype=torch.int64), like.device)


class QueueFull(Exception):
    def __init__(self, retry_after_s: int) -> None:
        super().__init__("the server is at capacity; retry later")
        self.retry_after_s = retry_after_s


class Unavailable(Exception):
    """The engine cannot serve any more (a rank died or a step failed); the message says why."""


def describe_failure(exc: BaseException) -> str:
    """A failed step in the product's words: a collective that broke means a rank went away (its process ended,
    its machine or the link failed); anything else is a failed step. The exception itself goes to the log."""
    if isinstance(exc, StepOutOfMemory):  # with several ranks: the others wait in the step's collectives
        return "a step ran out of GPU memory on rank 0"
    text = f"{type(exc).__name__} {exc}".lower()
    if isinstance(exc, getattr(torch.distributed, "DistError", ())) or any(
        word in text for word in ("gloo", "nccl", "connection", "peer", "timed out", "timeout", "broken pipe")
    ):
        return "a rank stopped answering"
    return "a step failed on rank 0"


def _counted(req: Request, event: Event) -> Event:
    """A token as sent: with its request's draft counts as they stand (after its window's)."""
    return replace(event, drafts=(req.drafted, req.accepted)) if isinstance(event, Token) else event


@dataclass(eq=False)
class Request:
    id: str
    prompt: list[int]
    params: SamplingParams
    sink: Callable[[Event], None]
    stop_ids: frozenset[int] = frozenset()
    background: bool = False
    draft: bool = True  # False: no drafts for this request ("draft": false)
    logprobs: int | None = None  # report each token's log-probability and this many alternatives (None: off)
    prompt_logprobs: bool = False  # report the prompt tokens' log-probabilities too (completions' echo)
    constraint: Constraint | None = None  # a format the reply must follow (engine/structured.py)
    reuse: bool = True  # False: neither resumes from kept prompt states nor keeps its own ("prompt_reuse": false)
    cache_salt: str = ""  # only prompts with the same salt share kept states
    images: list[PromptImage] = field(default_factory=list)  # the prompt's images (engine/vision/prompt.py)
    image_rows: list[Any] | None = None  # their tower output, made (once) when the first chunk holding one runs
    arrival: float = field(default_factory=time.monotonic)
    lane: int | None = None
    filled: int = 0
    output: list[int] = field(default_factory=list)
    done: bool = False
    drafter: CopyDrafter | None = None
    mtp: bool = False  # the MTP layer drafts for it (and absorbs its tokens every decode step)
    forced: bool = False  # its format's forced text is drafted (Constraint.forced)
    fresh: list[int] = field(default_factory=list)  # tokens emitted since its last decode step (the MTP absorbs them)
    window: list[int] = field(default_factory=list)  # the last decode round's tokens: pending, then drafts
    window_by: str = ""  # which drafter made the window's drafts ("format", "copy", "mtp"; "" without drafts)
    commit: int = 0  # rows of its last verify step the lane keeps (told to the ranks in the next plan)
    drafted: int = 0
    accepted: int = 0
    prompt_lps: list[tuple[float, tuple[tuple[int, float], ...]]] = field(default_factory=list)
    cached: int = 0  # prompt tokens resumed from a kept state
    keys: list[bytes] | None = None  # its prompt's chunk keys (engine/reuse.py), computed once
    chain: Node | None = None  # the last kept state on its prompt (resumed from or kept by it)
    tips: list[Node] = field(default_factory=list)  # kept states it pins (their rows are in its budget)
    logits_for: Node | None = None  # the state its current prompt chunk keeps, waiting for that chunk's logits

    @property
    def budget(self) -> int:
        """Pool tokens this request may need by its end."""
        return len(self.prompt) + self.params.max_tokens

    @property
    def prefilling(self) -> bool:
        return self.filled < len(self.prompt)


def _lane(req: Request) -> int:
    """The lane of an admitted request (set when it is admitted, before any step names it)."""
    if req.lane is None:
        raise RuntimeError(f"request {req.id} has no lane")
    return req.lane


class Scheduler:
    # a step's rows handed to `sample_rows` together (`_draw`) on the host too: only tests set it, with the
    # rows-together form patched in for `sample_rows` (which on the host takes a row at a time), to drive the GPU's
    # path through this scheduler on the CPU
    batch_host_rows = False

    @classmethod
    def for_config(
        cls,
        executor: StepExecutor,
        group: Any,
        cfg: EngineConfig,
        marks: frozenset[int] = frozenset(),
        encode_images: Callable[[list[PromptImage]], list[Any]] | None = None,
    ) -> Scheduler:
        """Rank 0's scheduler as the flags set it: PARALLEL lanes, the queue cap, the prompt chunk size, drafts,
        prompt reuse (`marks`: the tokenizer's chat role tokens), the vision tower when --vision is on."""
        return cls(
            executor,
            group,
            parallel=cfg.parallel,
            max_queued=cfg.max_queued,
            prefill_chunk=cfg.prefill_chunk,
            drafter=cfg.drafter if cfg.drafting else "none",
            draft_tokens=cfg.draft_tokens,
            reuse_bytes=int(cfg.prompt_reuse_gib * 2**30) if cfg.prompt_reuse else None,
            reuse_marks=marks,
            encode_images=encode_images,
        )

    def __init__(
        self,
        executor: StepExecutor,
        group: Any,
        *,
        parallel: int,
        max_queued: int,
        prefill_chunk: int = 128,
        heartbeat_s: float = 1.0,
        retry_after_s: int = 5,
        on_broken: Callable[[str], None] | None = None,
        drafter: str = "none",
        draft_tokens: int = 0,
        reuse_bytes: int | None = None,
        reuse_marks: frozenset[int] = frozenset(),
        encode_images: Callable[[list[PromptImage]], list[Any]] | None = None,
    ) -> None:
        """`reuse_bytes`: keep prompt states, their KDA snapshots capped at this many bytes (None: prompt reuse off;
        it needs the lane decoder). `encode_images`: the vision tower (rank 0), images -> their rows each."""
        if drafter != "none" and draft_tokens > executor.window - 1:
            raise ValueError(f"{draft_tokens} drafts need verify windows of {draft_tokens + 1} rows")
        if "mtp" in drafter and draft_tokens > 0 and not executor.drafts_with_mtp:
            raise ValueError(f"drafter {drafter} needs the model loaded with its MTP layer (and verify windows)")
        self.drafter = drafter if draft_tokens > 0 else "none"
        self.draft_tokens = draft_tokens if self.drafter != "none" else 0
        self.executor = executor
        self.group = group
        self.parallel = parallel
        self.max_queued = max_queued
        self.prefill_chunk = prefill_chunk
        self.heartbeat_s = heartbeat_s
        self.retry_after_s = retry_after_s
        self.encode_images = encode_images
        self.on_broken = on_broken
        self.broken: str | None = None
        self._inbox: queue.SimpleQueue[tuple[str, Any]] = queue.SimpleQueue()
        self._waiting: collections.deque[Request] = collections.deque()
        self._background: collections.deque[Request] = collections.deque()
        self._lanes: list[Request | None] = [None] * parallel
        self._to_release: list[int] = []
        self._prefill_turn = True
        self._lock = threading.Lock()
        self._in_system = 0
        self._closed: str | None = None  # set (under _lock) once the loop stops taking requests
        self._thread: threading.Thread | None = None
        self.totals = {
            "requests": 0,
            "prompt_tokens": 0,
            "completion_tokens": 0,
            "steps": 0,
            "cancelled": 0,
            "out_of_memory": 0,  # steps that ran out of GPU memory (their requests failed; one rank: the server went on)
        }
        # decode rounds: lane windows run, drafted and accepted tokens, tokens committed by them, and accepted
        # drafts by position in the window (vLLM's spec-decode counters)
        self.drafts = {"windows": 0, "drafted_windows": 0, "drafted": 0, "accepted": 0, "committed": 0}
        self.accepted_at = [0] * self.draft_tokens
        # the same counts by drafter (mtp+copy chooses per lane per step)
        self.by_drafter = {name: {"windows": 0, "drafted": 0, "accepted": 0} for name in ("format", "copy", "mtp")}
        self._verifies = False  # whether the decode step in flight verifies (its lanes commit in the next plan)
        # the tokens and the end sampled inside a lane's window, sent once the window's counts are in (usage,
        # /health); only the thread sampling that window holds (the peer watch's `abandon` sends its ends at once)
        self._held: list[tuple[Request, Event]] | None = None
        self._held_by = 0
        decoder = executor.decoder
        self.index: PrefixIndex | None = None
        if reuse_bytes is not None and decoder is not None:
            snapshot = kda_state_bytes(decoder.model.kda_state_shapes())
            self.index = PrefixIndex(prefill_chunk, snapshot, reuse_bytes, reuse_marks)
        self._drops: list[tuple[int, bool]] = []
        self._first: list[tuple[Request, Any]] = []  # resumed at their prompt's end: sampled after the step
        self._rows_device: torch.device | None = None  # where the steps' logits are: every row is sampled there
        self.draws_graphed = True  # benches set it off to time the eager passes (`_graph_draws`)
        self._draw_logged = -math.inf  # when `_draw`'s failure was last logged with its traceback
        self._stats: dict[str, Any] = {}
        self._refresh_stats()

    # -- called from other threads ----------------------------------------------------------------------------
    def submit(self, request: Request) -> None:
        with self._lock:
            if self._closed is not None:
                raise Unavailable(
                    f"the engine is not serving ({self.broken}); retry once the server is back"
                    if self.broken
                    else "the server is shutting down; retry once it is back"
                )
            if self._in_system >= self.parallel + self.max_queued:
                raise QueueFull(self.retry_after_s)
            self._in_system += 1
        self._inbox.put(("submit", request))

    def cancel(self, request_id: str) -> None:
        self._inbox.put(("cancel", request_id))

    def stats(self) -> dict[str, Any]:
        """The last step's snapshot; `requests_waiting` also counts submissions the loop has not picked up yet."""
        stats = dict(self._stats)
        with self._lock:
            stats["requests_waiting"] = max(0, self._in_system - stats["requests_running"])
        return stats

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="scheduler", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 10.0) -> None:
        self._inbox.put(("stop", None))
        if self._thread is not None:
            self._thread.join(timeout_s)

    # -- the scheduler thread ---------------------------------------------------------------------------------
    def _loop(self) -> None:
        try:
            while True:
                if self._drain(block=not self._has_work()):
                    self._fail_everyone("the server is shutting down; this request was not finished")
                    self._run(StepPlan(releases=self._to_release, shutdown=True))
                    self.executor.release_all()
                    return
                self._refresh_stats()
                plan, work = self._plan()
                try:
                    logits = self._run(plan)
                except StepOutOfMemory as exc:
                    if self.group.is_distributed:
                        raise
                    self._out_of_memory(plan, work, exc)
                else:
                    self._apply(work, logits)
                logits = None  # a decode step's rows may be on the GPU: not held through the next step
                self._refresh_stats()
        except Exception as exc:  # a peer died or a step failed: latch, fail everything, report
            log.exception("scheduler stopped")  # the raw error goes to the log; clients and /health get words
            self.abandon(describe_failure(exc))

    def abandon(self, reason: str) -> None:
        """Stop serving for `reason` (product words, e.g. "rank 1 stopped answering"): every request known or
        submitted later fails with it, /health reports it, `on_broken` is told. Called by the loop when a step
        fails, or by the peer watch while the loop may be stuck in a collective (the process ends soon after)."""
        if self.broken is not None:
            return
        self.broken = reason
        try:
            self._fail_everyone(f"the engine stopped while this request ran: {reason}; retry once the server is back")
        except RuntimeError:  # the loop thread changed a queue under us; the process is ending anyway
            log.warning("some requests could not be told that the engine stopped")
        self._refresh_stats()
        if self.on_broken is not None:
            self.on_broken(reason)

    def _has_work(self) -> bool:
        return bool(
            self._to_release
            or any(self._lanes)
            or ((self._waiting or self._background) and self._free_lane() is not None)
        )

    def _drain(self, block: bool) -> bool:
        """Take every inbox message; wait (sending heartbeats to the peers) when there is nothing to do.
        Returns True on a stop request."""
        while True:
            try:
                kind, value = self._inbox.get(timeout=self.heartbeat_s) if block else self._inbox.get_nowait()
            except queue.Empty:
                if not block:
                    return False
                self._run(StepPlan())  # heartbeat: a dead peer shows up as a failed collective
                continue
            block = False
            if kind == "stop":
                return True
            if kind == "submit":
                (self._background if value.background else self._waiting).append(value)
            elif kind == "cancel":
                self._cancel(value)

    def _cancel(self, request_id: str) -> None:
        for line in (self._waiting, self._background):
            for req in line:
                if req.id == request_id:
                    line.remove(req)
                    self._finish(req, "cancelled")
                    return
        for running in self._lanes:
            if running is not None and running.id == request_id:
                self._finish(running, "cancelled")
                return

    def _free_lane(self) -> int | None:
        return next((i for i, req in enumerate(self._lanes) if req is None), None)

    def _plan(self) -> tuple[StepPlan, tuple[str, list[Request]] | None]:
        plan = StepPlan(releases=self._to_release, drops=self._drops)
        self._to_release, self._drops = [], []
        for req in self._lanes:
            if req is not None and req.commit:
                plan.commits.append((_lane(req), req.commit))
                req.commit = 0
        reserved = sum(req.budget for req in self._lanes if req is not None)
        while (lane := self._free_lane()) is not None and (self._waiting or self._background):
            line = self._waiting or self._background
            if reserved + line[0].budget > self.executor.pool.num_tokens:
                if not any(self._lanes) and line[0].budget > self.executor.pool.num_tokens:
                    self._finish(line.popleft(), "failed", "the request needs more cache than the whole pool")
                    continue
                break  # it waits until running streams hand back their rows
            hit = self._match(line[0])
            if self.index is not None:  # kept rows no running request holds give way first
                excess = reserved + line[0].budget + self.index.unpinned_tokens(hit) - self.executor.pool.num_tokens
                if excess > 0:
                    plan.drops += self.index.evict(excess, hit)
            req = line.popleft()
            req.lane, reserved = lane, reserved + req.budget
            if "copy" in self.drafter and req.draft:
                req.drafter = CopyDrafter()
            req.mtp = "mtp" in self.drafter and req.draft
            req.forced = self.drafter != "none" and req.draft and req.constraint is not None
            self.totals["prompt_tokens"] += len(req.prompt)
            self._lanes[lane] = req
            plan.admits.append(lane)
            if self.index is not None and self._resumable(req):
                self.index.queries += len(req.prompt)
            if hit is not None:
                self._resume(req, hit, plan)
        filling = sorted((r for r in self._lanes if r is not None and r.prefilling), key=lambda r: r.arrival)
        # a request resumed at its prompt's end has no token yet: its first one is sampled after this step
        decoding = [r for r in self._lanes if r is not None and not r.prefilling and r.output]
        if filling and (self._prefill_turn or not decoding):
            req = filling[0]
            chunk = req.prompt[req.filled : req.filled + self.prefill_chunk]
            if req.images:
                try:
                    plan.embeds = self._image_rows(req, req.filled, len(chunk))
                except Exception as exc:  # this request's images only: every other request and rank go on
                    log.exception("the vision tower failed on request %s", req.id)
                    self._finish(req, "failed", f"its images could not be encoded ({type(exc).__name__}: {exc})")
                    return plan, None
            plan.prefill = (_lane(req), chunk)
            plan.prefill_logits = req.prompt_logprobs
            plan.keep = self._keep(req, req.filled + len(chunk), plan)
            self._prefill_turn = False
            return plan, ("prefill", [req])
        if decoding:
            for r in decoding:
                r.window = [r.output[-1], *self._drafts(r)]
            plan.decode = ([_lane(r) for r in decoding], [r.window for r in decoding])
            if any(r.mtp for r in decoding):
                plan.absorb = [r.fresh if r.mtp else [] for r in decoding]
                # under a format, the MTP layer's draft 1 is one the format allows after the pending token (the
                # matcher stands there: `_emit` took the pending token)
                masks = {
                    _lane(r): words
                    for r in decoding
                    if r.window_by == "mtp" and r.constraint is not None and (words := r.constraint.words()) is not None
                }
                plan.draft_masks = masks or None
            for r in decoding:
                r.fresh = []
            self._verifies = plan.verifies
            self._prefill_turn = True
            return plan, ("decode", decoding)
        return plan, None

    def _out_of_memory(self, plan: StepPlan, work: tuple[str, list[Request]] | None, exc: StepOutOfMemory) -> None:
        """A step that ran out of GPU memory on the only rank: its requests fail (their lanes' rows and states may be
        half written; the lanes go back in the next plan), as do those whose resume failed in it, a state its chunk
        was to keep is forgotten (no rank kept it), and every other request goes on — requests resumed in this plan
        take their first token as after any step. With several ranks the others wait in the step's collectives: the
        engine stops (`describe_failure`)."""
        log.error("%s (%s); its requests fail, the server goes on", str(exc), str(exc.__cause__))  # not the frames
        self.totals["out_of_memory"] += 1
        self._fail_resumes()  # a chunk whose own resume failed fails with the resume's words
        self._apply(None, None)
        if work is None:
            return
        kind, reqs = work
        for req in reqs:
            self._finish(
                req,
                "failed",
                f"the GPU ran out of memory in this request's {'prompt chunk' if kind == 'prefill' else 'decode step'}"
                "; the server goes on: retry, with a shorter prompt or fewer requests at once",
            )
        if plan.keep is not None and self.index is not None:  # the chunk's request holds the state `_keep` made
            assert reqs[0].chain is not None and reqs[0].chain.id == plan.keep[0]
            self._drops += self.index.forget(reqs[0].chain)

    def _image_rows(self, req: Request, start: int, count: int) -> tuple[list[int], Any] | None:
        """The image rows of the prompt chunk at `start` (None when it holds no image position). The images still
        ahead of the prompt's filled part go through the tower, once, when the first chunk holding one is planned, a
        video's frame pairs all together (engine/vision/prompt.py `items`); those a kept state already holds (a
        later turn of a conversation) never do."""
        if not any(image.start < start + count and image.end > start for image in req.images):
            return None
        if req.image_rows is None:
            if self.encode_images is None:
                raise RuntimeError("this server has no vision tower")
            ahead = items(req.images, [i for i, image in enumerate(req.images) if image.end > start])
            rows = self.encode_images([req.images[i] for i in ahead])
            req.image_rows = [None] * len(req.images)
            for i, image_rows in zip(ahead, rows):
                req.image_rows[i] = image_rows.cpu()
        return chunk_rows(req.images, req.image_rows, start, count)

    def _resumable(self, req: Request) -> bool:
        """Whether a request may resume from kept states (prompt logprobs need every prompt row's logits)."""
        return req.reuse and not req.prompt_logprobs

    def _match(self, req: Request) -> Node | None:
        if self.index is None or not self._resumable(req):
            return None
        return self.index.match(self._keys(req))  # a kept state has its logits: set in the step that kept it

    def _keys(self, req: Request) -> list[bytes]:
        if req.keys is None:
            req.keys = chunk_keys(key_ids(req.prompt, req.images), self.prefill_chunk, req.cache_salt)
        return req.keys

    def _resume(self, req: Request, hit: Node, plan: StepPlan) -> None:
        """An admitted request goes on from kept state `hit`: its lane adopts the rows and the KDA state there."""
        assert self.index is not None
        self.index.pin(hit)
        self.index.touch(hit)
        req.tips.append(hit)
        req.chain = hit
        req.filled = req.cached = hit.end
        self.index.hits += hit.end
        plan.resumes.append((_lane(req), [node.id for node in hit.path()]))
        if req.drafter is not None:
            req.drafter.extend(req.prompt[: hit.end])
        if hit.end == len(req.prompt):  # nothing left to prefill: the first token comes from the kept logits
            self._first.append((req, hit.logits))

    def _keep(self, req: Request, end: int, plan: StepPlan) -> tuple[int, int] | None:
        """Whether the prefill chunk ending at `end` keeps the lane's state there: (node, page start) or None."""
        index = self.index
        if index is None or not self._resumable(req) or (end % self.prefill_chunk and end != len(req.prompt)):
            return None
        key = self._keys(req)[(end - 1) // self.prefill_chunk]
        existing = index.nodes.get(key)
        if existing is not None:  # another request kept these chunks meanwhile: hold its rows instead of our own
            index.pin(existing)  # first: unpinning our own states may prune, never what we adopt
            self._unpin(req)
            index.touch(existing)
            req.tips, req.chain = [existing], existing
            plan.adopt = [node.id for node in existing.path()]
            return None
        if not index.wants(req.prompt, end, req.chain.end if req.chain is not None else 0):
            return None
        node, drops = index.add(key, end, req.chain)
        plan.drops += drops
        if node is None:
            return None
        index.pin(node)
        req.tips.append(node)
        req.chain = node
        req.logits_for = node  # the chunk's logits go with the state (_apply)
        return node.id, node.start

    def _unpin(self, req: Request) -> None:
        """The kept states `req` pinned stay, unpinned (evictable from now on): it is done, or holds other rows."""
        if self.index is not None and req.tips:
            for tip in req.tips:
                self.index.pin(tip, -1)
            req.tips = []
            self._drops += self.index.prune()

    def _drafts(self, req: Request) -> list[int]:
        """The drafts a lane verifies this round: at most draft_tokens, and never past the request's max_tokens
        (so its rows stay inside the budget the pool reserved for it). Under a format, the text it forces comes
        first and a copy match may go on from there; forced text, or a copy match that fills the whole window,
        wins; otherwise the MTP layer drafts (-1: made on the device in the step; under a format its first draft
        under the format's mask, `_plan`). Forced text wins even when short: it is near certain, where the MTP
        layer's drafts after the first are unmasked (on the trained demo's JSON replies, before the first draft took
        the mask, 1.23-1.98 tokens a step against 1.16-1.79 when only a full window won; docs/BENCHMARKS.md)."""
        room = min(self.draft_tokens, req.params.max_tokens - len(req.output) - 1)
        forced = req.constraint.forced(room) if req.forced and req.constraint is not None else []
        drafts = forced
        if req.drafter is not None and len(forced) < room:
            drafts = forced + req.drafter.propose(room - len(forced), after=forced)
        if req.constraint is not None and drafts:
            # a draft its format rejects could never equal the sample: not verified (forced text and copy alike)
            drafts = drafts[: req.constraint.admissible(drafts)]
            forced = forced[: len(drafts)]
        if req.mtp and room > 0 and len(drafts) < room and not forced:
            req.window_by = "mtp"
            return [-1] * room
        req.window_by = "format" if forced else "copy" if drafts else ""
        return drafts

    def _run(self, plan: StepPlan) -> Any:
        self.group.broadcast_object(plan)
        logits = self.executor.run(plan)
        failed = self.executor.failed_resumes
        if failed:  # the step's work ran; only those lanes' resumes did not
            if self.group.is_distributed:  # the other ranks resumed them: the lanes no longer agree
                raise StepOutOfMemory(failed)
            self.totals["out_of_memory"] += 1
            self._fail_resumes()
        return logits

    def _fail_resumes(self) -> None:
        """The requests whose resume from a kept prompt state ran out of GPU memory in this step fail (one rank):
        their lanes go back in the next plan with whatever they took (shared rows are held, and so released, once
        per holder); every other request goes on."""
        for lane in self.executor.failed_resumes:
            req = self._lanes[lane]
            if req is not None:
                if self.index is not None:  # nothing was reused after all
                    self.index.hits -= req.cached
                self._finish(
                    req,
                    "failed",
                    "the GPU ran out of memory while this request resumed from a kept prompt state; the server goes "
                    "on: retry, with a shorter prompt or fewer requests at once",
                )

    def _apply(self, work: tuple[str, list[Request]] | None, logits: Any) -> None:
        if isinstance(logits, torch.Tensor):
            self._rows_device = logits.device
        first, self._first = self._first, []
        for req, kept in first:  # after the step that resumed them: their lanes hold the kept state
            if not req.done:
                self._sample(req, kept)
        if work is None:
            return
        self.totals["steps"] += 1
        kind, reqs = work
        if kind == "prefill":
            req = reqs[0]
            chunk = req.prompt[req.filled : req.filled + self.prefill_chunk]
            start = req.filled
            req.filled += len(chunk)
            if req.logits_for is not None:  # not prompt logprobs' rows: those requests keep no state
                req.logits_for.logits, req.logits_for = logits.cpu(), None  # a kept state holds it off the GPU
            if req.drafter is not None:
                req.drafter.extend(chunk)
            if req.prompt_logprobs:  # row j predicts the prompt's token start + j + 1
                following = req.prompt[start + 1 : start + len(chunk) + 1]
                try:  # on a GPU this takes its memory (blocks of float64 rows): running out fails this request alone
                    req.prompt_lps += rows_logprobs(logits, following, req.logprobs or 0)
                except Exception:
                    log.exception("prompt log-probabilities failed for request %s", req.id)
                    message = "its prompt's log-probabilities could not be made; the other requests were not affected"
                    self._finish(req, "failed", message + " (the server log has the details)")
                    return
                logits = logits[-1]
            if not req.prefilling:
                req.image_rows = None  # every image row is in the caches now
                if req.prompt_logprobs:
                    self._send(req, PromptLogprobs(tuple(req.prompt_lps)))
                self._sample(req, logits)
            return
        proposed = self.executor.proposed
        for row, req in enumerate(reqs):
            if req.window_by == "mtp":
                if proposed is None:
                    raise RuntimeError("the step made no MTP drafts for a window that asked for them")
                req.window = [req.window[0], *proposed[row][: len(req.window) - 1]]
        drawn = self._draw(reqs, logits)
        for row, req in enumerate(reqs):
            self._take_window(req, logits[row], self._verifies, drawn.get(row))

    @property
    def _graph_draws(self) -> bool:
        """A GPU's sampling passes are replayed from CUDA graphs while its decode steps are (--cuda-graphs; not after
        a failed step capture turned them off)."""
        decoder = self.executor.decoder
        return self.draws_graphed and decoder is not None and decoder.uses_graphs

    def _draw(self, reqs: list[Request], logits: Any) -> dict[int, list[Drawn]]:
        """On a GPU, every window row's token at once (`sample_rows`: one pass, one read, where a row at a time is
        a read each): row t of a window is sampled at its position as though the drafts before it were accepted,
        which is the only case its token is taken in; the drawn tokens' log-probabilities together too, for the
        lanes that ask (`_draw_logprobs`). A lane under a format has its first row drawn under the format's mask;
        its later rows are left to `_sample` (their masks follow the tokens taken before them). A failure here
        leaves every row to `_sample`, which fails the request whose row cannot be sampled, alone. On the host
        `_sample` samples a row at a time and stops at the first rejected draft."""
        if getattr(logits, "is_cpu", True) and not self.batch_host_rows:
            return {}
        lanes = [row for row, req in enumerate(reqs) if req.constraint is None and not req.done]
        spans = [(row, t) for row in lanes for t in range(len(reqs[row].window))]
        formats = [
            row
            for row, req in enumerate(reqs)
            if req.constraint is not None and not req.done and not req.constraint.ended
        ]
        if not spans and not formats:
            return {}
        try:
            if len(spans) == logits.shape[0] * logits.shape[1]:  # every row of the step: no rows to pick out
                rows = logits.reshape(len(spans), -1)
            elif spans:
                rows = logits[_on(logits, spans).unbind(1)]
            # a format's first row under its mask, known before any token of the step is taken (a later row's
            # follows the tokens taken before it: `_sample`'s); one the format allows nothing in is `_sample`'s too
            masks = [(row, reqs[row].constraint.mask(logits[row, 0])) for row in formats]  # type: ignore[union-attr]
            masked = [(row, m) for row, m in masks if m is not None]
            if masked:
                extra = torch.stack([m for _, m in masked])
                rows = torch.cat([rows, extra]) if spans else extra
                spans += [(row, 0) for row, _ in masked]
            if not spans:
                return {}
            params = [reqs[row].params for row, _ in spans]
            positions = [len(reqs[row].prompt) + len(reqs[row].output) + t for row, t in spans]
            tokens = sample_rows(rows, params, positions, self._graph_draws)
        except Exception:
            self._log_draw("sampling a step's rows together failed; they are sampled a row at a time")
            return {}
        drawn: dict[int, list[Drawn]] = {}
        for (row, _), token, entry in zip(spans, tokens, self._draw_logprobs(reqs, spans, rows, tokens)):
            drawn.setdefault(row, []).append((token, entry))
        return drawn

    def _draw_logprobs(
        self, reqs: list[Request], spans: list[tuple[int, int]], rows: Any, tokens: list[int]
    ) -> list[LogprobEntry | None]:
        """The drawn tokens' log-probabilities for the lanes that ask for them, in one `rows_logprobs` pass over
        their rows (64 rows a pass on a GPU, where a row alone is a dozen launches and reads), each cut to its
        request's count of alternatives (the ranking is total: score desc, id asc, so a shorter list is a prefix).
        None for a row whose lane asks none, or all of them when this fails: `_sample` then makes its own."""
        # a format's row is drawn from its masked copy: its log-probabilities are the model's own (`_sample`'s)
        wanted = [
            i for i, (row, _) in enumerate(spans) if reqs[row].logprobs is not None and reqs[row].constraint is None
        ]
        out: list[LogprobEntry | None] = [None] * len(spans)
        if not wanted:
            return out
        try:
            some = rows if len(wanted) == len(spans) else rows[_on(rows, wanted)]
            top = max(reqs[spans[i][0]].logprobs or 0 for i in wanted)
            for i, (value, best) in zip(wanted, rows_logprobs(some, [tokens[i] for i in wanted], top)):
                out[i] = (value, best[: reqs[spans[i][0]].logprobs or 0])
        except Exception:
            self._log_draw("a step's log-probabilities together failed; they are made a row at a time")
            return [None] * len(spans)
        return out

    def _log_draw(self, message: str) -> None:
        now = time.monotonic()
        if now - self._draw_logged >= 60.0:  # a cause that persists: its traceback once a minute
            self._draw_logged = now
            log.exception(message)

    def _take_window(self, req: Request, logits: Any, verified: bool, drawn: list[Drawn] | None = None) -> None:
        """Sample a lane's rows in order, each at its own position; a draft counts while it equals the sample
        before it. The lane keeps the rows up to the first sample that differs from its draft (that sample is its
        new pending token); after a verify step it commits them in the next plan. A reply that ends in the window
        gets its tokens and its end after the window's counts: its usage (and /health) then include this step's
        drafts, and each token carries the counts so far (`Token.drafts`)."""
        window, kept = req.window, 0
        self._held, self._held_by = [], threading.get_ident()
        try:
            for t in range(len(window)):
                token = self._sample(req, logits[t], drawn[t] if drawn is not None and t < len(drawn) else None)
                if token is None:
                    break
                kept = t + 1
                if req.done or t + 1 >= len(window) or window[t + 1] != token:
                    break
            self._count_window(req, kept)
            if verified and not req.done:
                req.commit = kept
        finally:
            held, self._held = self._held, None
            for done, event in held:
                self._send(done, _counted(done, event))

    def _count_window(self, req: Request, kept: int) -> None:
        """A window's counts: /health's and vLLM's spec-decode counters, per drafter, and the reply's own (usage)."""
        window = req.window
        accepted = max(0, kept - 1)
        self.drafts["windows"] += 1
        self.drafts["committed"] += kept
        if len(window) > 1:
            req.drafted += len(window) - 1
            req.accepted += accepted
            self.drafts["drafted_windows"] += 1
            self.drafts["drafted"] += len(window) - 1
            self.drafts["accepted"] += accepted
            for position in range(accepted):
                self.accepted_at[position] += 1
            counts = self.by_drafter[req.window_by]
            counts["windows"] += 1
            counts["drafted"] += len(window) - 1
            counts["accepted"] += accepted

    def _sample(self, req: Request, logits: Any, drawn: Drawn | None = None) -> int | None:
        """Sample and emit one request's next token. Sampling runs on rank 0 alone, after the step every rank ran,
        so a failure here concerns this request only: it gets an error and its lane is released in the next plan;
        every other request and every rank go on. With a format, the tokens it forbids are masked first; the
        log-probabilities reported are the model's own (before the mask). `drawn`: the token `_draw` sampled for
        this row already (under its format's mask), with its log-probabilities when the request asks for them. A row
        elsewhere than the steps' logits (a kept prompt state's, on the host) is sampled where they are, so a reply
        does not depend on whether its prompt was kept."""
        try:
            if self._rows_device is not None and logits.device != self._rows_device:
                logits = logits.to(self._rows_device)
            allowed = logits
            if req.constraint is not None and drawn is None:  # (a drawn row was drawn under its mask: `_draw`)
                # the format is complete and wants no end token (ignore_eos; or one that is empty, such as a choice
                # of ""), or it allows no token at all here: the reply ends where it is
                masked = None if req.constraint.ended else req.constraint.mask(logits)
                if masked is None:
                    self._finish(req, "stop")
                    return None
                allowed = masked
            if drawn is None:  # a single row: on a GPU in the rows' form (fewer host reads)
                position = len(req.prompt) + len(req.output)
                drawn = (sample_rows(allowed.reshape(1, -1), [req.params], [position], self._graph_draws)[0], None)
            token, entry = drawn
            event = Token(token)
            if req.logprobs is not None:
                event = Token(token, *(entry or token_logprobs(logits, token, req.logprobs)))
        except Exception:
            log.exception("sampling failed for request %s (%s)", req.id, req.params)
            self._finish(
                req,
                "failed",
                "this request's next token could not be sampled; the other requests "
                "were not affected (the server log has the details)",
            )
            return None
        self._emit(req, event)
        return token

    def _emit(self, req: Request, event: Token) -> None:
        token = event.id
        if req.constraint is not None and not req.constraint.accept(token):
            # only when the format allowed nothing at all (the sampler then draws from every token)
            self._finish(req, "failed", "the reply could not go on under its format (no token fits it here)")
            return
        req.output.append(token)
        if req.drafter is not None:
            req.drafter.extend((token,))
        if req.mtp:
            req.fresh.append(token)
        self.totals["completion_tokens"] += 1
        if token in req.stop_ids:
            self._finish(req, "stop")
            return
        self._deliver(req, event)
        if req.constraint is not None and req.constraint.ended:
            self._finish(req, "stop")  # the format is complete and wants no end token (ignore_eos)
        elif len(req.output) >= req.params.max_tokens:
            self._finish(req, "length")

    def _finish(self, req: Request, reason: str, message: str = "") -> None:
        if req.done:
            return
        req.done = True
        self._unpin(req)
        if req.lane is not None:
            self._lanes[req.lane] = None
            self._to_release.append(req.lane)
        with self._lock:
            self._in_system -= 1
        self.totals["requests"] += 1
        self.totals["cancelled"] += reason == "cancelled"
        self._deliver(req, Failed(message) if reason == "failed" else Finished(reason, len(req.output), req.cached))

    def _deliver(self, req: Request, event: Event) -> None:
        """Send `event` now, or hold it until the lane's window is counted (`_take_window`, this thread only)."""
        held = self._held
        if held is not None and self._held_by == threading.get_ident():
            held.append((req, event))
        else:
            self._send(req, _counted(req, event))

    def _send(self, req: Request, event: Event) -> None:
        try:
            req.sink(event)
        except Exception:  # the receiving side went away; the request is cancelled by its own handler
            log.debug("sink of %s refused an event", req.id)

    def _fail_everyone(self, message: str) -> None:
        """Fail every request the loop knows of, and those still in the inbox; refuse later submissions."""
        with self._lock:
            self._closed = message
        unread = []
        while True:
            try:
                kind, value = self._inbox.get_nowait()
            except queue.Empty:
                break
            if kind == "submit":
                unread.append(value)
        for req in [
            *list(self._waiting),
            *list(self._background),
            *(r for r in list(self._lanes) if r is not None),
            *unread,
        ]:
            self._finish(req, "failed", message)
        self._waiting.clear()
        self._background.clear()

    def _refresh_stats(self) -> None:
        running = [r for r in self._lanes if r is not None]
        pool = self.executor.pool
        self._stats = {
            "requests_running": len(running),
            "requests_waiting": len(self._waiting) + len(self._background),
            "streams": {
                "decoding": sum(not r.prefilling for r in running),
                "prefilling": sum(r.prefilling for r in running),
                "max": self.parallel,
            },
            "pool_tokens": int(pool.num_tokens),
            # rows held only by kept prompt states count as free (they give way to any request), as in vLLM
            "pool_free_tokens": int(pool.free_tokens) + (self.index.unpinned_tokens() if self.index else 0),
            "totals": dict(self.totals),
            "drafts": {
                "drafter": self.drafter,
                "draft_tokens": self.draft_tokens,
                **self.drafts,
                "accepted_at": list(self.accepted_at),
                "by_drafter": {name: dict(counts) for name, counts in self.by_drafter.items()},
            },
            "prompt_reuse": (self.index.stats(pool.token_bytes) if self.index is not None else {"enabled": False}),
            "broken": self.broken,
        }
