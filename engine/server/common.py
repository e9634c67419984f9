"""What the generating routes share: request checks, the reply budget against the window, sampling parameters,
ids, usage, and SSE framing."""

from __future__ import annotations

import asyncio
import contextlib
import json
import secrets
from collections.abc import AsyncGenerator
from typing import TYPE_CHECKING, Any

from fastapi import Request

from engine.sampling import MASK64, SamplingParams, prompt_seed
from engine.server.errors import APIError, bad_request, error_body
from engine.server.generation import Delta, End, EngineFailed, Generation
from engine.server.protocol import SamplingFields
from engine.vision.prompt import PromptImage, key_ids

if TYPE_CHECKING:
    from engine.server.state import ServerState


# Fields that would change what the reply may contain, which this engine does not honour: refused, never ignored.
NOT_HONOURED = ("guided_whitespace_pattern",)


def server_state(request: Request) -> ServerState:
    return request.app.state.server


def new_id(prefix: str) -> str:
    return f"{prefix}-{secrets.token_hex(12)}"


def check_request(state: ServerState, body: SamplingFields) -> None:
    if body.model is not None and body.model != state.name:
        raise APIError(
            404,
            f"model {body.model!r} is not served here; this server serves {state.name!r}",
            code="model_not_found",
            param="model",
        )
    if body.n is not None and body.n != 1:
        raise bad_request(f"n must be 1 (got {body.n}); send separate requests for more choices", "n")
    extra = body.model_extra or {}
    for name in NOT_HONOURED:
        if extra.get(name) is not None:
            raise bad_request(f"{name} is not supported by this engine; leave {name} out", name)


def reply_budget(state: ServerState, prompt_tokens: int, requested: int | None, param: str) -> int:
    """max_tokens for this request: the requested one if prompt + it fits the window, else 400
    context_length_exceeded; an omitted one is capped to what the window leaves."""
    room = state.context - prompt_tokens
    if requested is not None and requested > room or room < 1:
        asked = requested if requested is not None else 1
        raise APIError(
            400,
            f"This server's maximum context length is {state.context} tokens. However, you requested "
            f"{prompt_tokens + asked} tokens ({prompt_tokens} in the {param}, {asked} for the "
            f"completion). Please reduce the length of the {param} or the completion.",
            code="context_length_exceeded",
            param=param,
        )
    return requested if requested is not None else min(state.max_tokens, room)


def sampling_params(state: ServerState, body: SamplingFields, prompt_ids: list[int], max_tokens: int) -> SamplingParams:
    temperature = state.temperature if body.temperature is None else body.temperature
    top_k = state.top_k if body.top_k is None else max(0, body.top_k)
    seed = prompt_seed(prompt_ids) if body.seed is None else body.seed & MASK64
    return SamplingParams(
        temperature=temperature,
        top_p=state.top_p if body.top_p is None else body.top_p,
        top_k=top_k,
        min_p=body.min_p or 0.0,
        seed=seed,
        max_tokens=max_tokens,
    )


def stop_strings(body: SamplingFields) -> list[str]:
    stops = [body.stop] if isinstance(body.stop, str) else list(body.stop or [])
    return [s for s in stops if s]


def start_generation(
    state: ServerState,
    body: SamplingFields,
    prompt_ids: list[int],
    max_tokens: int,
    logprobs: int | None = None,
    prompt_logprobs: bool = False,
    grammar: Any = None,
    images: list[PromptImage] | None = None,
) -> Generation:
    """Submit a request; `images`: the prompt's images (their ids keyed by their pixels for the unseeded sampling
    seed, so two images under the same text do not share it)."""
    generation = Generation(
        state,
        prompt_ids,
        sampling_params(state, body, key_ids(prompt_ids, images or []), max_tokens),
        stop=stop_strings(body),
        background=body.priority == "background",
        draft=body.draft is not False,
        prompt_reuse=body.prompt_reuse is not False,
        cache_salt=body.cache_salt or "",
        ignore_eos=bool(body.ignore_eos),
        logprobs=logprobs,
        prompt_logprobs=prompt_logprobs,
        grammar=grammar,
        images=images or [],
    )
    generation.start()
    return generation


def usage(
    prompt_tokens: int,
    completion_tokens: int,
    reasoning_tokens: int | None = None,
    cached_tokens: int = 0,
    drafts: tuple[int, int] | None = None,
) -> dict[str, Any]:
    """Chat's and completions' usage. `drafts` (drafted, accepted): the reply's own draft counts, under OpenAI's
    predicted-output names (accepted_prediction_tokens, rejected_prediction_tokens)."""
    out: dict[str, Any] = {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": cached_tokens},
    }
    details: dict[str, int] = {}
    if reasoning_tokens is not None:
        details["reasoning_tokens"] = reasoning_tokens
    if drafts is not None:
        details["accepted_prediction_tokens"] = drafts[1]
        details["rejected_prediction_tokens"] = drafts[0] - drafts[1]
    if details:
        out["completion_tokens_details"] = details
    return out


def sse(payload: dict[str, Any] | str) -> str:
    return f"data: {payload if isinstance(payload, str) else json.dumps(payload, ensure_ascii=False)}\n\n"


async def collect(generation: Generation, request: Request) -> AsyncGenerator[Delta | End, None]:
    """Events of a non-streamed reply. A watcher listens on the connection meanwhile: when the client hangs up,
    the request is cancelled at once (its lane and cache rows go back within a step), not at max_tokens."""
    watcher = asyncio.create_task(_cancel_on_disconnect(generation, request))
    try:
        async with contextlib.aclosing(generation.events()) as events:
            async for event in events:
                if event is not None:
                    yield event
    finally:
        watcher.cancel()


async def _cancel_on_disconnect(generation: Generation, request: Request) -> None:
    """Wait for the ASGI `http.disconnect` (the body has been read, so the next message is that one)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            generation.cancel()
            return


def stream_error(exc: EngineFailed) -> str:
    """The last events of a stream the engine could not finish: an error in OpenAI's body (the status line
    was sent long ago; 503 is what a fresh request would get now), then the end marker."""
    return sse(error_body(503, str(exc))) + sse("[DONE]")
