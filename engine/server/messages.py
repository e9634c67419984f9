"""POST /v1/messages and /v1/messages/count_tokens: Anthropic's Messages API (what Claude Code and the `anthropic`
SDK speak), over the same chat path as /v1/chat/completions.

A request is translated into a chat request — system text, user turns, assistant turns with their thinking, text
and tool_use blocks (as reasoning, content and tool calls), tool_result blocks (as tool turns), tools (their
input_schema as parameters), tool_choice (auto / any / tool / none as auto / required / named / none), thinking
(enabled / disabled; absent: the server's THINKING) — and rendered by the checkpoint's template like any chat. The
reply comes back as content blocks (thinking, text, tool_use with its input parsed), with Anthropic's stop_reason,
usage, and its streamed event sequence (message_start, content_block_start / delta / stop, message_delta,
message_stop, ping while waiting). Errors have Anthropic's shape (`{"type": "error", "error": {...}}`).

`output_config.format` (or the beta's `output_format`) json_schema constrains the reply's text
(engine/server/formats.py). `thinking.budget_tokens` is not a separate limit here: the reasoning counts toward max_tokens, which bounds it.
"""

from __future__ import annotations

import contextlib
import json
import secrets
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from fastapi import APIRouter, Request
from fastapi.responses import StreamingResponse
from starlette.concurrency import run_in_threadpool

from engine.server.chat import ReplyParser, ReplyPiece, render
from engine.server.chat_completions import prompt_ids_with_images, start_chat, tools_for, whole_reply
from engine.server.common import check_request, server_state
from engine.server.errors import APIError
from engine.server.formats import CODE
from engine.server.generation import Delta, End, EngineFailed, Generation
from engine.server.protocol import (
    AnthropicMessage,
    AnthropicThinking,
    AnthropicTool,
    AnthropicToolChoice,
    ChatCompletionRequest,
    CountTokensRequest,
    MessagesRequest,
    NamedAnthropicToolChoice,
    TextBlock,
)
from engine.server.tools import function_tool

if TYPE_CHECKING:
    from engine.server.state import ServerState

router = APIRouter()

PATH = "/v1/messages"


def _text(content: str | list[TextBlock] | None) -> str:
    if content is None:
        return ""
    return content if isinstance(content, str) else "".join(block.text for block in content)


def chat_messages(system: str | list[TextBlock] | None, messages: list[AnthropicMessage]) -> list[dict[str, Any]]:
    """Anthropic turns as OpenAI chat turns: tool results become tool turns (before the user's own text, which
    follows them), an assistant's thinking its reasoning_content, its tool_use blocks its tool_calls."""
    out: list[dict[str, Any]] = []
    if system:
        out.append({"role": "system", "content": _text(system)})
    for message in messages:
        if isinstance(message.content, str):
            out.append({"role": message.role, "content": message.content})
            continue
        text, reasoning, calls = [], [], []
        parts: list[dict[str, Any]] = []  # text and images in order (a turn with images sends parts)
        before = len(out)
        for block in message.content:
            if block.type == "text":
                text.append(block.text)
                parts.append({"type": "text", "text": block.text})
            elif block.type == "image":
                parts.append({"type": "image_url", "image_url": {"url": block.source.as_url}})
            elif block.type == "thinking":
                reasoning.append(block.thinking)
            elif block.type == "tool_use":
                arguments = json.dumps(block.input, ensure_ascii=False)
                calls.append(
                    {"id": block.id, "type": "function", "function": {"name": block.name, "arguments": arguments}}
                )
            elif block.type == "tool_result":
                out.append({"role": "tool", "tool_call_id": block.tool_use_id, "content": _text(block.content)})
        if message.role == "assistant" or calls:  # a tool_use block is the assistant's, wherever it was sent
            # (an image here is refused: images are taken in user turns, engine/server/images.py)
            turn: dict[str, Any] = {"role": "assistant", "content": parts if len(parts) > len(text) else "".join(text)}
            if reasoning:
                turn["reasoning_content"] = "".join(reasoning)
            if calls:
                turn["tool_calls"] = calls
            out.append(turn)
        elif len(parts) > len(text):  # it holds images
            out.append({"role": "user", "content": parts})
        elif text or len(out) == before:  # a turn of only (redacted) thinking still is a turn
            out.append({"role": "user", "content": "".join(text)})
    return out


def _tool_fields(tools: list[AnthropicTool] | None, choice: AnthropicToolChoice | None) -> dict[str, Any]:
    fields: dict[str, Any] = {}
    if tools:
        fields["tools"] = [function_tool(tool.name, tool.description, tool.input_schema) for tool in tools]
    if isinstance(choice, NamedAnthropicToolChoice):
        fields["tool_choice"] = {"type": "function", "function": {"name": choice.name}}
    elif choice is not None:
        fields["tool_choice"] = {"auto": "auto", "any": "required", "none": "none"}[choice.type]
    if choice is not None and getattr(choice, "disable_parallel_tool_use", None):
        fields["parallel_tool_calls"] = False
    return fields


def _thinking_kwargs(thinking: AnthropicThinking | None) -> dict[str, Any]:
    if thinking is None:
        return {}
    on = thinking.type == "enabled"
    return {"chat_template_kwargs": {"enable_thinking": on, "thinking": on}}


def as_chat(body: MessagesRequest) -> ChatCompletionRequest:
    """The chat request this Messages request is."""
    fields: dict[str, Any] = {
        "model": body.model,
        "messages": chat_messages(body.system, body.messages),
        "max_tokens": body.max_tokens,
        "stream": False,
        **_tool_fields(body.tools, body.tool_choice),
        **_thinking_kwargs(body.thinking),
    }
    for name in ("temperature", "top_p", "top_k"):
        if getattr(body, name) is not None:
            fields[name] = getattr(body, name)
    if body.stop_sequences:
        fields["stop"] = body.stop_sequences
    if body.output_format is not None and body.output_config is not None and body.output_config.format is not None:
        raise APIError(400, "give output_config.format or output_format, not both", param="output_format", code=CODE)
    output = body.output_config.format if body.output_config is not None else None
    if (output := output or body.output_format) is not None:
        fields["response_format"] = {"type": "json_schema", "json_schema": {"schema": output.schema_}}
    try:
        return ChatCompletionRequest.model_validate(fields)
    except ValueError as exc:  # a block that does not make a valid chat turn
        raise APIError(400, f"messages: {exc}", param="messages") from exc


def _stop_reason(parser: ReplyParser, end: End) -> tuple[str, str | None]:
    if end.finish_reason == "length":
        return "max_tokens", None
    if end.stop_string is not None:
        return "stop_sequence", end.stop_string
    return ("tool_use" if parser.calls else "end_turn"), None


def _tool_use(call: Any) -> dict[str, Any]:
    try:
        arguments = json.loads(call.arguments or "{}")
    except ValueError:
        arguments = {}
    return {
        "type": "tool_use",
        "id": call.id,
        "name": call.name,
        "input": arguments if isinstance(arguments, dict) else {},
    }


class _Message:
    def __init__(self, state: ServerState, generation: Generation, parser: ReplyParser, model: str) -> None:
        self.state, self.generation, self.parser, self.model = state, generation, parser, model
        self.id = "msg_" + secrets.token_hex(12)

    def _usage(self, output_tokens: int) -> dict[str, int]:
        cached = self.generation.cached_tokens  # Anthropic counts tokens read from its cache apart
        return {
            "input_tokens": len(self.generation.prompt_ids) - cached,
            "cache_read_input_tokens": cached,
            "output_tokens": output_tokens,
        }

    async def whole(self, request: Request) -> dict[str, Any]:
        pieces, end = await whole_reply(self.generation, self.parser, request)
        content: list[dict[str, Any]] = []
        reasoning = "".join(p.text for p in pieces if p.kind == "reasoning")
        text = "".join(p.text for p in pieces if p.kind == "content")
        if reasoning:
            content.append({"type": "thinking", "thinking": reasoning, "signature": ""})
        if text:
            content.append({"type": "text", "text": text})
        content += [_tool_use(call) for call in self.parser.calls]
        stop_reason, stop_sequence = _stop_reason(self.parser, end)
        return {
            "id": self.id,
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": content,
            "stop_reason": stop_reason,
            "stop_sequence": stop_sequence,
            "usage": self._usage(end.completion_tokens),
        }

    async def stream(self) -> AsyncIterator[str]:
        start: dict[str, Any] = {
            "id": self.id,
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": self._usage(0),
        }
        yield _event("message_start", {"type": "message_start", "message": start})
        blocks = _Blocks()
        try:
            async with contextlib.aclosing(self.generation.events(self.state.keepalive_s)) as events:
                async for event in events:
                    if event is None:
                        yield _event("ping", {"type": "ping"})
                    elif isinstance(event, Delta):
                        for line in blocks.pieces(self.parser.feed(event.text)):
                            yield line
                    else:
                        for line in blocks.pieces(self.parser.finish()):
                            yield line
                        for line in blocks.close():
                            yield line
                        stop_reason, stop_sequence = _stop_reason(self.parser, event)
                        delta = {"stop_reason": stop_reason, "stop_sequence": stop_sequence}
                        yield _event(
                            "message_delta",
                            {
                                "type": "message_delta",
                                "delta": delta,
                                "usage": self._usage(event.completion_tokens),  # cached now known
                            },
                        )
                        yield _event("message_stop", {"type": "message_stop"})
        except EngineFailed as exc:
            yield _event("error", {"type": "error", "error": {"type": "overloaded_error", "message": str(exc)}})


class _Blocks:
    """Pieces of a reply as Anthropic content blocks: one block open at a time, a new one when the kind changes;
    a tool call is one tool_use block whose input arrives in input_json_delta events as the model writes it."""

    def __init__(self) -> None:
        self.index = -1
        self.open: str | None = None

    def _start(self, block: dict[str, Any]) -> str:
        self.index += 1
        self.open = block["type"]
        return _event(
            "content_block_start", {"type": "content_block_start", "index": self.index, "content_block": block}
        )

    def close(self) -> list[str]:
        if self.open is None:
            return []
        self.open = None
        return [_event("content_block_stop", {"type": "content_block_stop", "index": self.index})]

    def _delta(self, delta: dict[str, Any]) -> str:
        return _event("content_block_delta", {"type": "content_block_delta", "index": self.index, "delta": delta})

    def pieces(self, pieces: list[ReplyPiece]) -> list[str]:
        out: list[str] = []
        for piece in pieces:
            if piece.kind == "call_open" and piece.call is not None:
                out += self.close()
                out.append(self._start({"type": "tool_use", "id": piece.call.id, "name": piece.call.name, "input": {}}))
            elif piece.kind == "call_args":
                out.append(self._delta({"type": "input_json_delta", "partial_json": piece.text}))
            elif piece.kind == "call_close":
                out += self.close()
            elif piece.text:
                kind = "thinking" if piece.kind == "reasoning" else "text"
                if self.open != kind:
                    out += self.close()
                    out.append(
                        self._start(
                            {"type": "thinking", "thinking": "", "signature": ""}
                            if kind == "thinking"
                            else {"type": "text", "text": ""}
                        )
                    )
                delta = (
                    {"type": "thinking_delta", "thinking": piece.text}
                    if kind == "thinking"
                    else {"type": "text_delta", "text": piece.text}
                )
                out.append(self._delta(delta))
        return out


def _event(name: str, data: dict[str, Any]) -> str:
    return f"event: {name}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n"


@router.post(PATH)
async def messages(body: MessagesRequest, request: Request) -> Any:
    state = server_state(request)
    chat = as_chat(body)
    where = "output_config.format" if body.output_format is None else "output_format"
    generation, parser, _ = await start_chat(state, chat, format_param=where)
    message = _Message(state, generation, parser, body.model)
    if body.stream:
        return StreamingResponse(
            message.stream(),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )
    return await message.whole(request)


@router.post(PATH + "/count_tokens")
async def count_tokens(body: CountTokensRequest, request: Request) -> dict[str, int]:
    """The prompt's tokens as /v1/messages would render it (thinking, tools and all)."""
    state = server_state(request)
    full = MessagesRequest.model_validate({**body.model_dump(exclude_none=True), "max_tokens": 1})
    chat = as_chat(full)
    check_request(state, chat)
    shown, _ = tools_for(chat)
    prompt = await run_in_threadpool(
        render, state.template, chat.messages, shown, state.thinking, chat.reasoning_effort, chat.chat_template_kwargs
    )
    ids, _ = await prompt_ids_with_images(state, chat.messages, prompt)
    return {"input_tokens": len(ids)}
