"""POST /v1/responses: OpenAI's Responses API (what Codex CLI speaks), over the same chat path as
/v1/chat/completions.

`input` (a string, or items: messages, function_call, function_call_output; reasoning items sent back are accepted
and not shown again, as the chat template drops earlier turns' reasoning), `instructions` (a system turn for this
request only, as OpenAI does), function `tools`, `tool_choice`, `reasoning.effort`, `max_output_tokens`,
`temperature`, `top_p`. The reply is output items: a reasoning item (its text as `reasoning_text` content), a
message with `output_text`, function_call items. `store` (default true) keeps the conversation in memory
(the last STORED responses) so a later request can continue it with `previous_response_id`; `store: false` keeps
nothing. Streaming sends the documented events in order, each with a `sequence_number`: response.created,
response.in_progress, response.output_item.added, response.content_part.added, response.output_text.delta /
response.reasoning_text.delta / response.function_call_arguments.delta, their .done, response.output_item.done,
then response.completed (or response.incomplete at max_output_tokens). `text.format` json_schema / json_object
constrains the output text (engine/server/formats.py). A function call's arguments stream as the model writes them
(response.function_call_arguments.delta).
"""

from __future__ import annotations

import collections
import contextlib
import secrets
import time
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from fastapi import APIRouter, Request
from fastapi.responses import StreamingResponse

from engine.server.chat import ReplyParser, ReplyPiece
from engine.server.chat_completions import reasoning_tokens, start_chat, whole_reply
from engine.server.common import server_state, sse
from engine.server.errors import APIError
from engine.server.generation import Delta, End, EngineFailed, Generation
from engine.server.protocol import ChatCompletionRequest, ResponseInputItem, ResponsesRequest
from engine.server.tools import function_tool

if TYPE_CHECKING:
    from engine.server.state import ServerState

router = APIRouter()

STORED = 1024  # responses kept for previous_response_id (oldest dropped first)


def _store(request: Request) -> collections.OrderedDict[str, list[dict[str, Any]]]:
    app_state = request.app.state
    if not hasattr(app_state, "responses"):
        app_state.responses = collections.OrderedDict()
    return app_state.responses


def _id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(12)}"


def turns(items: str | list[ResponseInputItem]) -> list[dict[str, Any]]:
    """Input items as chat turns: function calls join the assistant turn before them (or make one), their outputs
    become tool turns."""
    if isinstance(items, str):
        return [{"role": "user", "content": items}]
    out: list[dict[str, Any]] = []
    for item in items:
        if item.type == "function_call":
            call = {
                "id": item.call_id,
                "type": "function",
                "function": {"name": item.name, "arguments": item.arguments},
            }
            if out and out[-1]["role"] == "assistant":
                out[-1].setdefault("tool_calls", []).append(call)
            else:
                out.append({"role": "assistant", "content": "", "tool_calls": [call]})
        elif item.type == "function_call_output":
            out.append({"role": "tool", "tool_call_id": item.call_id, "content": item.output})
        elif item.type == "reasoning":
            continue
        else:
            content = item.content if isinstance(item.content, str) else _content(item.content)
            out.append({"role": "system" if item.role == "developer" else item.role, "content": content})
    return out


def _content(parts: list[Any]) -> str | list[dict[str, Any]]:
    """A message item's parts as chat content: its text joined, or text and image parts in order when it holds an
    image."""
    if all(part.type != "input_image" for part in parts):
        return "".join(part.text for part in parts)
    return [
        {"type": "image_url", "image_url": {"url": part.image_url}}
        if part.type == "input_image"
        else {"type": "text", "text": part.text}
        for part in parts
    ]


def as_chat(body: ResponsesRequest, history: list[dict[str, Any]]) -> ChatCompletionRequest:
    messages = history + turns(body.input)
    if not messages:  # input of nothing but reasoning items: an empty user turn, so the template has one
        messages = [{"role": "user", "content": ""}]
    system = [{"role": "system", "content": body.instructions}] if body.instructions else []
    fields: dict[str, Any] = {"model": body.model, "messages": system + messages}
    if body.tools:
        fields["tools"] = [function_tool(tool.name, tool.description, tool.parameters) for tool in body.tools]
    if isinstance(body.tool_choice, str):
        fields["tool_choice"] = body.tool_choice
    elif body.tool_choice is not None:
        fields["tool_choice"] = {"type": "function", "function": {"name": body.tool_choice.name}}
    if body.reasoning is not None and body.reasoning.effort is not None:
        fields["reasoning_effort"] = body.reasoning.effort
    if body.parallel_tool_calls is not None:
        fields["parallel_tool_calls"] = body.parallel_tool_calls
    text_format = body.text.format if body.text is not None else None
    if text_format is not None and text_format.type == "json_schema":
        fields["response_format"] = {"type": "json_schema", "json_schema": {"schema": text_format.schema_}}
    elif text_format is not None:
        fields["response_format"] = {"type": text_format.type}
    for ours, theirs in (("max_tokens", "max_output_tokens"), ("temperature", "temperature"), ("top_p", "top_p")):
        if getattr(body, theirs) is not None:
            fields[ours] = getattr(body, theirs)
    try:
        return ChatCompletionRequest.model_validate(fields)
    except ValueError as exc:  # items that do not make valid chat turns
        raise APIError(400, f"input: {exc}", param="input") from exc


class _Response:
    def __init__(
        self,
        state: ServerState,
        generation: Generation,
        parser: ReplyParser,
        thinking: bool,
        body: ResponsesRequest,
        conversation: list[dict[str, Any]],
    ) -> None:
        self.state, self.generation, self.parser, self.thinking, self.body = state, generation, parser, thinking, body
        self.conversation = conversation  # the turns before this reply (without instructions), for the store
        self.id, self.created = _id("resp"), int(time.time())

    def envelope(self, status: str, output: list[dict[str, Any]], end: End | None) -> dict[str, Any]:
        body = self.body
        out: dict[str, Any] = {
            "id": self.id,
            "object": "response",
            "created_at": self.created,
            "status": status,
            "model": self.state.name,
            "output": output,
            "instructions": body.instructions,
            "previous_response_id": body.previous_response_id,
            "max_output_tokens": body.max_output_tokens,
            "temperature": body.temperature,
            "top_p": body.top_p,
            "tools": [tool.model_dump(exclude_none=True) for tool in body.tools or []],
            "tool_choice": body.tool_choice
            if isinstance(body.tool_choice, str) or body.tool_choice is None
            else body.tool_choice.model_dump(),
            "parallel_tool_calls": body.parallel_tool_calls if body.parallel_tool_calls is not None else True,
            "store": body.store is not False,
            "text": {
                "format": body.text.format.model_dump(exclude_none=True, by_alias=True)
                if body.text is not None and body.text.format is not None
                else {"type": "text"}
            },
            "error": None,
            "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
            "metadata": {},
            "usage": None,
        }
        if end is not None:
            prompt = len(self.generation.prompt_ids)
            out["usage"] = {
                "input_tokens": prompt,
                "input_tokens_details": {"cached_tokens": self.generation.cached_tokens},
                "output_tokens": end.completion_tokens,
                "output_tokens_details": {
                    "reasoning_tokens": reasoning_tokens(self.state, self.generation, self.thinking)
                },
                "total_tokens": prompt + end.completion_tokens,
            }
        return out

    def remember(self, output: list[dict[str, Any]], store: collections.OrderedDict) -> None:
        if self.body.store is False:
            return
        reply: dict[str, Any] = {"role": "assistant", "content": ""}
        for item in output:
            if item["type"] == "message":
                reply["content"] = "".join(part["text"] for part in item["content"])
            elif item["type"] == "function_call":
                call = {"name": item["name"], "arguments": item["arguments"]}
                reply.setdefault("tool_calls", []).append({"id": item["call_id"], "type": "function", "function": call})
        store[self.id] = [*self.conversation, reply]
        while len(store) > STORED:
            store.popitem(last=False)

    async def whole(self, request: Request) -> dict[str, Any]:
        pieces, end = await whole_reply(self.generation, self.parser, request)
        output: list[dict[str, Any]] = []
        reasoning = "".join(p.text for p in pieces if p.kind == "reasoning")
        text = "".join(p.text for p in pieces if p.kind == "content")
        if reasoning:
            output.append(_reasoning_item(_id("rs"), reasoning))
        if text:
            output.append(_message_item(_id("msg"), text, "completed"))
        output += [_call_item(call) for call in self.parser.calls]
        self.remember(output, _store(request))
        return self.envelope("incomplete" if end.finish_reason == "length" else "completed", output, end)

    async def stream(self, store: collections.OrderedDict) -> AsyncIterator[str]:
        events = _Events()
        yield events.send("response.created", response=self.envelope("in_progress", [], None))
        yield events.send("response.in_progress", response=self.envelope("in_progress", [], None))
        try:
            async with contextlib.aclosing(self.generation.events(self.state.keepalive_s)) as stream:
                async for event in stream:
                    if event is None:
                        yield ": keep-alive\n\n"
                    elif isinstance(event, Delta):
                        for line in events.pieces(self.parser.feed(event.text)):
                            yield line
                    else:
                        for line in events.pieces(self.parser.finish()):
                            yield line
                        for line in events.close():
                            yield line
                        self.remember(events.output, store)
                        status = "incomplete" if event.finish_reason == "length" else "completed"
                        yield events.send(f"response.{status}", response=self.envelope(status, events.output, event))
        except EngineFailed as exc:
            failed = {
                **self.envelope("failed", events.output, None),
                "error": {"code": "server_error", "message": str(exc)},
            }
            yield events.send("response.failed", response=failed)


def _reasoning_item(item_id: str, text: str) -> dict[str, Any]:
    return {"type": "reasoning", "id": item_id, "summary": [], "content": [{"type": "reasoning_text", "text": text}]}


def _message_item(item_id: str, text: str, status: str) -> dict[str, Any]:
    content = [{"type": "output_text", "text": text, "annotations": []}] if status == "completed" else []
    return {"type": "message", "id": item_id, "status": status, "role": "assistant", "content": content}


def _call_item(call: Any) -> dict[str, Any]:
    return {
        "type": "function_call",
        "id": _id("fc"),
        "call_id": call.id,
        "name": call.name,
        "arguments": call.arguments,
        "status": "completed",
    }


class _Events:
    """Reply pieces as Responses stream events: one output item open at a time (reasoning or message), a new one
    when the kind changes; a function call is one item whose arguments arrive in deltas as the model writes them."""

    def __init__(self) -> None:
        self.sequence = 0
        self.output: list[dict[str, Any]] = []
        self.open: dict[str, Any] | None = None
        self.call: dict[str, Any] | None = None  # the function_call item whose arguments are arriving
        self.text = ""

    def send(self, kind: str, **fields: Any) -> str:
        payload = {"type": kind, "sequence_number": self.sequence, **fields}
        self.sequence += 1
        return f"event: {kind}\n{sse(payload)}"

    def _index(self) -> int:
        return len(self.output) - 1

    def close(self) -> list[str]:
        item, self.open = self.open, None
        if item is None:
            return []
        where = {"item_id": item["id"], "output_index": self._index()}
        if item["type"] == "reasoning":
            item["content"] = [{"type": "reasoning_text", "text": self.text}]
            out = [self.send("response.reasoning_text.done", **where, content_index=0, text=self.text)]
        else:
            part = {"type": "output_text", "text": self.text, "annotations": []}
            item.update(status="completed", content=[part])
            out = [
                self.send("response.output_text.done", **where, content_index=0, text=self.text, logprobs=[]),
                self.send("response.content_part.done", **where, content_index=0, part=part),
            ]
        self.text = ""
        return [*out, self.send("response.output_item.done", output_index=self._index(), item=item)]

    def pieces(self, pieces: list[ReplyPiece]) -> list[str]:
        out: list[str] = []
        for piece in pieces:
            if piece.kind == "call_open" and piece.call is not None:
                out += self.close()
                item = _call_item(piece.call)
                item["status"] = "in_progress"
                self.output.append(item)
                self.call = item
                out.append(self.send("response.output_item.added", output_index=self._index(), item=dict(item)))
            elif piece.kind == "call_args" and self.call is not None:
                self.call["arguments"] += piece.text
                where = {"item_id": self.call["id"], "output_index": self._index()}
                out.append(self.send("response.function_call_arguments.delta", **where, delta=piece.text))
            elif piece.kind == "call_close" and self.call is not None and piece.call is not None:
                item, self.call = self.call, None
                item.update(arguments=piece.call.arguments, status="completed")
                where = {"item_id": item["id"], "output_index": self._index()}
                out.append(
                    self.send(
                        "response.function_call_arguments.done", **where, name=item["name"], arguments=item["arguments"]
                    )
                )
                out.append(self.send("response.output_item.done", output_index=self._index(), item=item))
            elif piece.text:
                kind = "reasoning" if piece.kind == "reasoning" else "message"
                if self.open is None or self.open["type"] != kind:
                    out += self.close()
                    item = (
                        _reasoning_item(_id("rs"), "")
                        if kind == "reasoning"
                        else _message_item(_id("msg"), "", "in_progress")
                    )
                    if kind == "reasoning":
                        item["content"] = []
                    self.open = item
                    self.output.append(item)
                    out.append(self.send("response.output_item.added", output_index=self._index(), item=dict(item)))
                    if kind == "message":
                        part = {"type": "output_text", "text": "", "annotations": []}
                        out.append(
                            self.send(
                                "response.content_part.added",
                                item_id=item["id"],
                                output_index=self._index(),
                                content_index=0,
                                part=part,
                            )
                        )
                self.text += piece.text
                delta_kind = "response.reasoning_text.delta" if kind == "reasoning" else "response.output_text.delta"
                extra: dict[str, Any] = {} if kind == "reasoning" else {"logprobs": []}
                out.append(
                    self.send(
                        delta_kind,
                        item_id=self.open["id"],
                        output_index=self._index(),
                        content_index=0,
                        delta=piece.text,
                        **extra,
                    )
                )
        return out


@router.post("/v1/responses")
async def responses(body: ResponsesRequest, request: Request) -> Any:
    state = server_state(request)
    store = _store(request)
    history: list[dict[str, Any]] = []
    if body.previous_response_id is not None:
        if body.previous_response_id not in store:
            raise APIError(
                404,
                f"no stored response {body.previous_response_id!r} (responses are kept in memory, the last {STORED}, "
                "and not with store: false)",
                param="previous_response_id",
            )
        history = list(store[body.previous_response_id])
        store.move_to_end(body.previous_response_id)
    chat = as_chat(body, history)
    generation, parser, thinking = await start_chat(state, chat, format_param="text.format")
    conversation = history + turns(body.input)
    reply = _Response(state, generation, parser, thinking, body, conversation)
    if body.stream:
        return StreamingResponse(
            reply.stream(store),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )
    return await reply.whole(request)
