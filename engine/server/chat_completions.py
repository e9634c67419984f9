"""POST /v1/chat/completions: non-streamed and SSE replies with reasoning, content and tool calls."""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from fastapi import APIRouter, Request
from fastapi.responses import StreamingResponse
from starlette.concurrency import run_in_threadpool

from engine.server.chat import ReplyParser, ReplyPiece, render, starts_in_reasoning
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
from engine.server.formats import (
    Format,
    after_thinking,
    calls_format,
    compile_format,
    content_format,
    forced_call_format,
)
from engine.server.generation import Delta, End, EngineFailed, Generation
from engine.server.images import media_parts, place_media, prepare_media
from engine.server.logprobs import chat_entries
from engine.server.protocol import ChatCompletionRequest, NamedToolChoice, Tool
from engine.server.tools import CALL_OPEN, offered_tools
from engine.vision.prompt import PromptImage

if TYPE_CHECKING:
    from engine.server.state import ServerState

router = APIRouter()


def tools_for(body: ChatCompletionRequest) -> tuple[list[Tool] | None, dict[str, dict[str, Any]]]:
    """(tools shown to the model, tools whose calls are parsed) under tool_choice."""
    tools = body.tools or None
    if body.tool_choice == "none" or not tools:
        if isinstance(body.tool_choice, NamedToolChoice):
            raise bad_request(
                "tool_choice names a function but no tools were offered", "tool_choice", code="invalid_tool_choice"
            )
        return None, {}
    if isinstance(body.tool_choice, NamedToolChoice):
        chosen = [t for t in tools if t.function.name == body.tool_choice.function.name]
        if not chosen:
            raise bad_request(
                f"tool_choice names {body.tool_choice.function.name!r}, which is not among the offered tools",
                "tool_choice",
                code="invalid_tool_choice",
            )
        tools = chosen
    return tools, offered_tools([t.model_dump(exclude_none=True) for t in tools])


def forced_call_prefix(body: ChatCompletionRequest, shown: list[Tool] | None) -> str:
    """The start of the reply that tool_choice forces: `<tool_call>NAME` for a named function or for "required" with
    one tool offered; `<tool_call>` for "required" among several (the model writes the name: one it was not offered
    stays text, as under "auto"); "" when the model may answer freely."""
    if not shown:
        return ""
    if isinstance(body.tool_choice, NamedToolChoice):
        return CALL_OPEN + body.tool_choice.function.name
    if body.tool_choice == "required":
        return CALL_OPEN + shown[0].function.name if len(shown) == 1 else CALL_OPEN
    return ""


def reply_format(
    body: ChatCompletionRequest, shown: list[Tool] | None, forced: str, thinking: bool
) -> tuple[str, Format | None]:
    """(the field that asked, the format the reply must follow) for a chat request: a forced call's completion, or
    the content format asked for (or tool calls instead, under tool_choice auto), after the think block if any."""
    asked = content_format(body)
    if forced and shown:
        return "tool_choice", forced_call_format(shown, forced, body.parallel_tool_calls is not False)
    if asked is None:
        return "", None
    param, fmt = asked
    if shown:
        fmt = {"type": "or", "elements": [fmt, calls_format(shown)]}
    return param, after_thinking(fmt) if thinking else fmt


def reasoning_tokens(state: ServerState, generation: Generation, thinking: bool) -> int:
    if not thinking:
        return 0
    close = state.token_id("</think>")
    ids = generation.token_ids
    return ids.index(close) if close is not None and close in ids else len(ids)


@router.post("/v1/chat/completions")
async def chat_completions(body: ChatCompletionRequest, request: Request) -> Any:
    state = server_state(request)
    generation, parser, thinking = await start_chat(state, body)
    reply = _Reply(state, generation, parser, thinking, new_id("chatcmpl"), bool(body.return_token_ids))
    if body.stream:
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        return StreamingResponse(
            reply.stream(include_usage),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )
    return await reply.whole(request)


def logprobs_wanted(body: ChatCompletionRequest) -> int | None:
    """How many alternatives a token's log-probability comes with, or None for no log-probabilities
    (`top_logprobs` > 0 implies `logprobs`)."""
    top = body.top_logprobs or 0
    return top if body.logprobs or top > 0 else None


async def start_chat(
    state: ServerState, body: ChatCompletionRequest, format_param: str | None = None
) -> tuple[Generation, ReplyParser, bool]:
    """Check, render, tokenise and submit a chat request (the OpenAI route's, and the Anthropic and Responses routes'
    once translated): its generation, the parser that splits its reply, and whether the reply starts in reasoning.
    `format_param`: the field a translated request's format came from, named when it cannot be compiled."""
    check_request(state, body)
    shown, parsed = tools_for(body)
    forced = forced_call_prefix(body, shown)
    # A forced call is written into the reply's start, so the reply cannot open with a think block: thinking is off.
    kwargs = (
        {**(body.chat_template_kwargs or {}), "enable_thinking": False, "thinking": False}
        if forced
        else body.chat_template_kwargs
    )
    # rendering and tokenising a long prompt take real time: off the event loop, so streams and /health go on
    prompt = await run_in_threadpool(
        render, state.template, body.messages, shown, state.thinking, body.reasoning_effort, kwargs
    )
    prompt += forced
    prompt_ids, images = await prompt_ids_with_images(state, body.messages, prompt)
    max_tokens = reply_budget(state, len(prompt_ids), body.max_completion_tokens or body.max_tokens, "messages")
    thinking = starts_in_reasoning(prompt)
    param, fmt = reply_format(body, shown, forced, thinking)
    if format_param and param.startswith("response_format"):  # what the translated request's client sent
        param = format_param
    grammar = await compile_format(state, fmt, param)
    generation = start_generation(
        state, body, prompt_ids, max_tokens, logprobs_wanted(body), grammar=grammar, images=images
    )
    parser = ReplyParser(thinking, parsed, single_call=body.parallel_tool_calls is False)
    parser.feed(forced)  # held back until the model closes the call (the prefix alone is never a piece)
    return generation, parser, thinking


async def prompt_ids_with_images(
    state: ServerState, messages: list[Any], prompt: str
) -> tuple[list[int], list[PromptImage]]:
    """The rendered prompt's ids, each image's placeholder widened to its rows and each video's to its frames'
    markup, and the images and frame pairs (read, decoded and prepared off the event loop: fetching and decoding
    take time)."""
    parts = media_parts(messages)
    prepared = await run_in_threadpool(prepare_media, state.vision, parts) if parts else []
    ids = (await run_in_threadpool(state.tokenizer.encode, prompt, add_special_tokens=False)).ids

    def encode(text: str) -> list[int]:
        return list(state.tokenizer.encode(text, add_special_tokens=False).ids)

    return place_media(ids, prepared, state.vision.tokens if state.vision is not None else None, encode)


async def whole_reply(generation: Generation, parser: ReplyParser, request: Request) -> tuple[list[ReplyPiece], End]:
    """A non-streamed reply's pieces (reasoning, content, tool calls) and its end; a client that hangs up cancels
    it (`collect`), an engine that stops gives a 503."""
    pieces: list[ReplyPiece] = []
    end: End | None = None
    try:
        async with contextlib.aclosing(collect(generation, request)) as events:
            async for event in events:
                if isinstance(event, Delta):
                    pieces += parser.feed(event.text)
                else:
                    end = event
    except EngineFailed as exc:
        raise APIError(503, str(exc)) from exc
    pieces += parser.finish()
    return pieces, end or End("stop", len(generation.token_ids))


class _Reply:
    def __init__(
        self,
        state: ServerState,
        generation: Generation,
        parser: ReplyParser,
        thinking: bool,
        reply_id: str,
        return_token_ids: bool = False,
    ) -> None:
        self.state, self.generation, self.parser, self.thinking = state, generation, parser, thinking
        self.return_token_ids = return_token_ids
        self.id, self.created = reply_id, int(time.time())

    def _usage(self, end: End) -> dict[str, Any]:
        return usage(
            len(self.generation.prompt_ids),
            end.completion_tokens,
            reasoning_tokens(self.state, self.generation, self.thinking),
            self.generation.cached_tokens,
            self.generation.draft_counts,
        )

    def _finish_reason(self, end: End) -> str:
        return "tool_calls" if self.parser.calls and end.finish_reason == "stop" else end.finish_reason

    async def whole(self, request: Request) -> dict[str, Any]:
        pieces, end = await whole_reply(self.generation, self.parser, request)
        reasoning = "".join(p.text for p in pieces if p.kind == "reasoning")
        content = "".join(p.text for p in pieces if p.kind == "content")
        message: dict[str, Any] = {
            "role": "assistant",
            "content": content or None,
            "reasoning_content": reasoning or None,
        }
        if self.parser.calls:
            message["tool_calls"] = [call.as_openai() for call in self.parser.calls]
        logprobs = None
        if self.generation.logprobs is not None:
            logprobs = {"content": chat_entries(self.state, self.generation, 0, len(self.generation.token_ids))}
        choice: dict[str, Any] = {
            "index": 0,
            "message": message,
            "logprobs": logprobs,
            "finish_reason": self._finish_reason(end),
        }
        if self.return_token_ids:
            choice["token_ids"] = list(self.generation.token_ids)
        return {
            "id": self.id,
            "object": "chat.completion",
            "created": self.created,
            "model": self.state.name,
            "choices": [choice],
            "usage": self._usage(end),
        }

    def _chunk(
        self, delta: dict[str, Any], finish_reason: str | None = None, logprobs: dict[str, Any] | None = None
    ) -> str:
        return sse(
            {
                "id": self.id,
                "object": "chat.completion.chunk",
                "created": self.created,
                "model": self.state.name,
                "choices": [{"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": finish_reason}],
            }
        )

    def _with_logprobs(self, lines: list[str], tokens: tuple[int, int]) -> list[str]:
        """The chunks of one text delta, the log-probabilities of the tokens it completes on the last of them (or on
        a chunk of their own when the parser held the text back)."""
        if self.generation.logprobs is None or tokens[1] <= tokens[0]:
            return lines
        logprobs = {"content": chat_entries(self.state, self.generation, *tokens)}
        if not lines:
            return [self._chunk({}, None, logprobs)]
        last = json.loads(lines[-1][len("data: ") :])
        last["choices"][0]["logprobs"] = logprobs
        return [*lines[:-1], sse(last)]

    def _deltas(self, pieces: list[ReplyPiece]) -> list[str]:
        out = []
        for piece in pieces:
            if piece.kind == "call_open" and piece.call is not None:  # id, type and name; the arguments follow
                out.append(self._chunk({"tool_calls": [piece.call.as_openai(piece.index)]}))
            elif piece.kind == "call_args":
                out.append(self._chunk({"tool_calls": [{"index": piece.index, "function": {"arguments": piece.text}}]}))
            elif piece.kind == "call_close":
                continue
            elif piece.kind == "reasoning":
                out.append(self._chunk({"reasoning_content": piece.text}))
            else:
                out.append(self._chunk({"content": piece.text}))
        return out

    async def stream(self, include_usage: bool) -> AsyncIterator[str]:
        yield self._chunk({"role": "assistant", "content": ""})
        try:
            async with contextlib.aclosing(self.generation.events(self.state.keepalive_s)) as events:
                async for event in events:
                    if event is None:
                        yield ": keep-alive\n\n"
                    elif isinstance(event, Delta):
                        for line in self._with_logprobs(self._deltas(self.parser.feed(event.text)), event.tokens):
                            yield line
                    else:
                        for line in self._deltas(self.parser.finish()):
                            yield line
                        last = {
                            "id": self.id,
                            "object": "chat.completion.chunk",
                            "created": self.created,
                            "model": self.state.name,
                            "choices": [
                                {"index": 0, "delta": {}, "logprobs": None, "finish_reason": self._finish_reason(event)}
                            ],
                            "usage": self._usage(event),
                        }
                        yield sse(last)
                        if include_usage:
                            yield sse({**last, "choices": []})
        except EngineFailed as exc:
            yield stream_error(exc)
            return
        yield sse("[DONE]")
