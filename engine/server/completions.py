"""POST /v1/completions: raw text or token-id prompts, non-streamed and SSE."""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import StreamingResponse
from starlette.concurrency import run_in_threadpool

from engine.server.common import (
    check_request,
    collect,
    new_id,
    reply_budget,
    server_state,
    sse,
    start_generation,
    stream_error,
    usage,
)
from engine.server.errors import APIError, bad_request
from engine.server.formats import compile_format, content_format
from engine.server.generation import Delta, End, EngineFailed, Generation
from engine.server.logprobs import completion_logprobs
from engine.server.protocol import CompletionRequest

router = APIRouter()


@router.post("/v1/completions")
async def completions(body: CompletionRequest, request: Request) -> Any:
    state = server_state(request)
    check_request(state, body)
    if body.suffix:
        raise bad_request("suffix is not supported", "suffix")
    if isinstance(body.prompt, str):
        encoding = await run_in_threadpool(
            state.tokenizer.encode, body.prompt, add_special_tokens=bool(body.add_special_tokens)
        )
        prompt_ids = encoding.ids
        if not prompt_ids:
            raise bad_request("the prompt encodes to no tokens", "prompt")
    else:
        prompt_ids = list(body.prompt)
        too_big = [t for t in prompt_ids if t >= state.vocab_size]
        if too_big:
            raise bad_request(f"token id {too_big[0]} is outside the vocabulary (0..{state.vocab_size - 1})", "prompt")
    max_tokens = reply_budget(
        state, len(prompt_ids), body.max_tokens if body.max_tokens is not None else None, "prompt"
    )
    wanted = body.logprobs
    asked = content_format(body)
    grammar = await compile_format(state, asked[1], asked[0]) if asked else None
    generation = start_generation(
        state,
        body,
        prompt_ids,
        max_tokens,
        wanted,
        prompt_logprobs=bool(body.echo) and wanted is not None,
        grammar=grammar,
    )
    echo = state.tokenizer.decode(prompt_ids, skip_special_tokens=False) if body.echo else ""
    reply_id, created = new_id("cmpl"), int(time.time())

    def frame(
        text: str, finish: str | None, extra: dict[str, Any] | None = None, logprobs: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        return {
            "id": reply_id,
            "object": "text_completion",
            "created": created,
            "model": state.name,
            "choices": [{"index": 0, "text": text, "logprobs": logprobs, "finish_reason": finish}],
            **(extra or {}),
        }

    if body.stream:
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        return StreamingResponse(
            _stream(generation, frame, echo, include_usage),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache"},
        )
    text, end = echo, None
    try:
        async with contextlib.aclosing(collect(generation, request)) as events:
            async for event in events:
                if isinstance(event, Delta):
                    text += event.text
                else:
                    end = event
    except EngineFailed as exc:
        raise APIError(503, str(exc)) from exc
    end = end or End("stop", len(generation.token_ids))
    logprobs = None
    if wanted is not None:
        logprobs = completion_logprobs(state, generation, 0, len(generation.token_ids), 0, bool(body.echo))
    reply = frame(
        text,
        end.finish_reason,
        {
            "usage": usage(
                len(prompt_ids),
                end.completion_tokens,
                cached_tokens=generation.cached_tokens,
                drafts=generation.draft_counts,
            )
        },
        logprobs,
    )
    if body.return_token_ids:
        reply["choices"][0]["token_ids"] = list(generation.token_ids)
    return reply


async def _stream(generation: Generation, frame: Any, echo: str, include_usage: bool) -> AsyncIterator[str]:
    """SSE frames; with logprobs each text frame carries its tokens', and the echo frame (sent once the prompt's
    log-probabilities are known, before the first reply frame) the prompt's."""
    state, wanted = generation.state, generation.logprobs is not None
    offset = len(echo)
    if echo and not wanted:
        yield sse(frame(echo, None))
    try:
        async with contextlib.aclosing(generation.events(generation.state.keepalive_s)) as events:
            async for event in events:
                if echo and wanted and event is not None:
                    yield sse(frame(echo, None, None, completion_logprobs(state, generation, 0, 0, 0, echo=True)))
                    echo = ""
                if event is None:
                    yield ": keep-alive\n\n"
                elif isinstance(event, Delta):
                    logprobs = completion_logprobs(state, generation, *event.tokens, offset) if wanted else None
                    offset += len(event.text)
                    yield sse(frame(event.text, None, None, logprobs))
                else:
                    counts = {
                        "usage": usage(
                            len(generation.prompt_ids),
                            event.completion_tokens,
                            cached_tokens=generation.cached_tokens,
                            drafts=generation.draft_counts,
                        )
                    }
                    yield sse(frame("", event.finish_reason, counts))
                    if include_usage:
                        yield sse({**frame("", None), "choices": [], **counts})
    except EngineFailed as exc:
        yield stream_error(exc)
        return
    yield sse("[DONE]")
