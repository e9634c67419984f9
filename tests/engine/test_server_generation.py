"""The asyncio side of one request, against a scripted scheduler stub: stop strings (cut, held-back prefixes,
token count), keep-alive ticks during silence, cancel when the consumer leaves, and 429 from a full queue."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from engine.checkpoint.tokenizer_build import build_tokenizer
from engine.sampling import SamplingParams
from engine.scheduler import Finished, QueueFull, Token
from engine.server.errors import APIError
from engine.server.generation import Delta, End, Generation
from engine.server.metrics import Metrics

TOKENIZER = build_tokenizer()


class ScriptedScheduler:
    """Stub: replays token ids into the request's sink when submitted."""

    def __init__(self, ids: list[int], finish: str | None = "length", full: bool = False) -> None:
        self.ids, self.finish, self.full, self.cancelled = ids, finish, full, []

    def submit(self, request: Any) -> None:
        if self.full:
            raise QueueFull(5)
        for token in self.ids:
            request.sink(Token(token))
        if self.finish:
            request.sink(Finished(self.finish, len(self.ids)))

    def cancel(self, request_id: str) -> None:
        self.cancelled.append(request_id)


class State:
    def __init__(self, scheduler: ScriptedScheduler) -> None:
        self.scheduler, self.tokenizer, self.metrics, self.eos_ids = scheduler, TOKENIZER, Metrics(), frozenset()


async def run(
    text: str, stop: list[str], finish: str | None = "length", keepalive: float | None = None, limit: int = 100
) -> tuple[list[Any], ScriptedScheduler]:
    scheduler = ScriptedScheduler(TOKENIZER.encode(text).ids, finish)
    gen = Generation(State(scheduler), [1, 2], SamplingParams(max_tokens=99), stop=stop)  # type: ignore[arg-type]
    gen.start()
    out: list[Any] = []
    events = gen.events(keepalive)
    async for event in events:
        out.append(event)
        if len(out) >= limit:
            break
    await events.aclose()
    return out, scheduler


def text_of(events: list[Any]) -> str:
    return "".join(e.text for e in events if isinstance(e, Delta))


def test_stop_string_cuts_the_reply_and_cancels() -> None:
    events, scheduler = asyncio.run(run("The weather is sunny today and tomorrow.", ["sunny"]))
    assert text_of(events) == "The weather is " and isinstance(events[-1], End)
    assert events[-1].finish_reason == "stop" and scheduler.cancelled
    assert events[-1].completion_tokens <= len(TOKENIZER.encode("The weather is sunny").ids)


def test_partial_stop_prefix_is_held_then_released() -> None:
    events, _ = asyncio.run(run("one two three", ["two threes"]))
    assert text_of(events) == "one two three" and events[-1] == End(
        "length", len(TOKENIZER.encode("one two three").ids)
    )


def test_keepalive_ticks_during_silence_and_leaving_cancels() -> None:
    events, scheduler = asyncio.run(run("hello", [], finish=None, keepalive=0.05, limit=4))
    assert events[-1] is None and text_of(events) == "hello" and len(scheduler.cancelled) == 1


def test_full_queue_is_429_with_retry_after() -> None:
    async def go() -> None:
        gen = Generation(State(ScriptedScheduler([], full=True)), [1], SamplingParams())  # type: ignore[arg-type]
        gen.start()

    with pytest.raises(APIError) as refused:
        asyncio.run(go())
    assert refused.value.status == 429 and refused.value.headers["Retry-After"] == "5"
