"""One request's generation as seen from the asyncio side: submit to the scheduler thread, turn its token events
into text deltas (incremental detokenisation, stop strings), and cancel the request when the consumer goes away.
"""

from __future__ import annotations

import asyncio
import itertools
import secrets
import time
from collections.abc import AsyncGenerator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from engine.sampling import SamplingParams
from engine.scheduler import Failed, Finished, PromptLogprobs, QueueFull, Request, Token, Unavailable
from engine.server.errors import APIError
from engine.structured import Constraint

if TYPE_CHECKING:
    from engine.server.state import ServerState

_counter = itertools.count()


@dataclass
class Delta:
    text: str
    tokens: tuple[int, int] = (0, 0)  # the reply tokens [first, last) whose text this delta completes


@dataclass
class End:
    finish_reason: str  # stop | length
    completion_tokens: int
    stop_string: str | None = None  # the request's stop string that ended the reply, if one did


class EngineFailed(Exception):
    """The engine stopped while this request ran (the message says why)."""


class IncrementalDecoder:
    """Token ids -> text deltas; holds back a tail that ends in an incomplete UTF-8 sequence."""

    def __init__(self, tokenizer: object) -> None:
        self.tokenizer = tokenizer
        self.ids: list[int] = []
        self.prefix = 0
        self.read = 0

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=False)  # type: ignore[attr-defined]

    def push(self, token: int) -> str:
        self.ids.append(token)
        before = self._decode(self.ids[self.prefix : self.read])
        after = self._decode(self.ids[self.prefix :])
        if len(after) <= len(before) or after.endswith("\ufffd"):
            return ""
        self.prefix, self.read = self.read, len(self.ids)
        return after[len(before) :]


@dataclass
class Generation:
    state: ServerState
    prompt_ids: list[int]
    params: SamplingParams
    stop: list[str] = field(default_factory=list)
    background: bool = False
    ignore_eos: bool = False
    draft: bool = True  # False: decoded without drafts (the same tokens, one a step)
    logprobs: int | None = None  # each token's log-probability and this many alternatives (None: off)
    prompt_logprobs: bool = False
    grammar: Any = None  # the compiled format the reply must follow (engine/structured.py), or None
    prompt_reuse: bool = True  # False: no kept prompt state is resumed or kept for this request
    cache_salt: str = ""  # kept prompt states are shared only between requests with the same salt
    images: list[Any] = field(default_factory=list)  # the prompt's images (engine/vision/prompt.py PromptImage)
    request_id: str = field(default_factory=lambda: f"{next(_counter)}-{secrets.token_hex(6)}")
    token_ids: list[int] = field(default_factory=list)
    # with logprobs: per reply token (log-probability, top alternatives); per prompt token after the first, the same
    token_logprobs: list[tuple[float | None, tuple[tuple[int, float], ...]]] = field(default_factory=list)
    prompt_token_logprobs: tuple[tuple[float, tuple[tuple[int, float], ...]], ...] = ()
    started: float = field(default_factory=time.monotonic)
    first_token_at: float | None = None
    _queue: asyncio.Queue = field(default_factory=asyncio.Queue)
    _finished: bool = False
    _request: Request | None = None
    _drafts: tuple[int, int] = (0, 0)  # the draft counts the last token came with (`Token.drafts`)
    _cut_at: tuple[int, int] | None = None  # those of the token completing a stop string, where one ended the reply

    def start(self) -> None:
        """Submit; raises APIError 429 (queue full) or 503 (engine down) before any response starts."""
        loop = asyncio.get_running_loop()
        queue = self._queue

        def sink(event: object) -> None:
            loop.call_soon_threadsafe(queue.put_nowait, event)

        stop_ids = frozenset() if self.ignore_eos else self.state.eos_ids
        request = Request(
            self.request_id,
            self.prompt_ids,
            self.params,
            sink,
            stop_ids,
            self.background,
            draft=self.draft,
            logprobs=self.logprobs,
            prompt_logprobs=self.prompt_logprobs,
            constraint=None if self.grammar is None else Constraint(self.grammar, stop_ids),
            reuse=self.prompt_reuse,
            cache_salt=self.cache_salt,
            images=self.images,
        )
        self._request = request
        try:
            self.state.scheduler.submit(request)
        except QueueFull as full:
            self.state.metrics.rejected.inc()
            raise APIError(
                429,
                "the server is at capacity (every lane busy and the queue full); retry later",
                code="rate_limit_exceeded",
                headers={"Retry-After": str(full.retry_after_s)},
            ) from full
        except Unavailable as down:
            raise APIError(503, str(down)) from down

    @property
    def cached_tokens(self) -> int:
        """Prompt tokens resumed from a kept prompt state (set by the scheduler before the first token is sent)."""
        return self._request.cached if self._request is not None else 0

    @property
    def draft_counts(self) -> tuple[int, int]:
        """(drafted, accepted) tokens of this reply's verify windows: final once the scheduler has ended the request
        (its end goes out after the last window's counts); for a reply a stop string ended, those the token that
        completed it came with: every window up to and including its own (drafts past the stop included), never a
        later one the scheduler ran before it saw the cancel."""
        if self._cut_at is not None:
            return self._cut_at
        return (self._request.drafted, self._request.accepted) if self._request is not None else (0, 0)

    def cancel(self) -> None:
        if not self._finished:
            self._finished = True
            self.state.scheduler.cancel(self.request_id)
            self.state.metrics.disconnects.inc()

    async def events(self, keepalive_s: float | None = None) -> AsyncGenerator[Delta | End | None, None]:
        """Text deltas, then one End. Yields None after `keepalive_s` of silence (for SSE keep-alives and
        disconnect checks). Closing the iterator early cancels the request."""
        decoder = IncrementalDecoder(self.state.tokenizer)
        text = ""
        sent = 0
        covered = 0  # reply tokens whose text has gone out in a delta
        hold = max((len(s) for s in self.stop), default=0)
        try:
            while True:
                try:
                    event = await asyncio.wait_for(self._queue.get(), keepalive_s)
                except asyncio.TimeoutError:
                    yield None
                    continue
                if isinstance(event, Failed):
                    self._finished = True
                    raise EngineFailed(event.message)
                if isinstance(event, PromptLogprobs):
                    self.prompt_token_logprobs = event.entries
                    continue
                if isinstance(event, Finished):
                    self._finished = True
                    if sent < len(text) or covered < len(self.token_ids):
                        yield Delta(text[sent:], (covered, len(self.token_ids)))
                    yield self._end("length" if event.reason == "length" else "stop", event.completion_tokens)
                    return
                if isinstance(event, Token):
                    self._on_token(event)
                    text += decoder.push(event.id)
                    cut = _find_stop(text, self.stop, max(0, sent - hold))
                    if cut is not None:
                        self._cut_at = self._drafts
                        if sent < cut:
                            yield Delta(text[sent:cut], (covered, len(self.token_ids)))
                        self.cancel_quietly()
                        matched = next(s for s in self.stop if s and text.startswith(s, cut))
                        yield self._end("stop", len(self.token_ids), matched)
                        return
                    safe = len(text) - held_suffix(text, self.stop)
                    if safe > sent:
                        yield Delta(text[sent:safe], (covered, len(self.token_ids)))
                        sent, covered = safe, len(self.token_ids)
        finally:
            if not self._finished:
                self.cancel()

    def cancel_quietly(self) -> None:
        self._finished = True
        self.state.scheduler.cancel(self.request_id)

    def _on_token(self, event: Token) -> None:
        if self.first_token_at is None:
            self.first_token_at = time.monotonic()
            self.state.metrics.ttft.observe(self.first_token_at - self.started)
        self.token_ids.append(event.id)
        self._drafts = event.drafts
        if self.logprobs is not None:
            self.token_logprobs.append((event.logprob, event.top))

    def _end(self, reason: str, count: int, stop_string: str | None = None) -> End:
        """`count`: an end token counts as generated; tokens after the one completing a stop string do not."""
        self.state.metrics.finished(self, reason, count)
        return End(reason, count, stop_string)


def _find_stop(text: str, stops: list[str], start: int) -> int | None:
    hits = [i for i in (text.find(s, start) for s in stops if s) if i >= 0]
    return min(hits) if hits else None


def held_suffix(text: str, tags: tuple[str, ...] | list[str]) -> int:
    """Length of the longest tail of `text` that could be the start of one of `tags` (text to hold back until the
    next token says whether a stop string / a tag is coming)."""
    best = 0
    for tag in tags:
        for n in range(min(len(tag) - 1, len(text)), 0, -1):
            if text.endswith(tag[:n]):
                best = max(best, n)
                break
    return best
