"""Chat: rendering messages with the checkpoint's template, and splitting a reply into reasoning, content and
tool calls as its text arrives.

Thinking: on by default (server flag); per request `chat_template_kwargs.enable_thinking` / `thinking`, or
`reasoning_effort` (none turns it off; low / high / max pass through, medium -> high, minimal -> low, xhigh -> max).
Whether a reply starts inside a think block is read off the rendered prompt: it does when the prompt ends `<think>`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from engine.server.errors import bad_request
from engine.server.generation import held_suffix
from engine.server.images import IMAGE_MARKUP, VIDEO_MARKUP
from engine.server.protocol import ChatMessage, ImagePart, Tool, VideoPart
from engine.server.template import render_chat
from engine.server.tools import CALL_CLOSE, CALL_OPEN, KEY_OPEN, ArgumentStream, ParsedCall, new_call_id

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
EFFORTS = {"minimal": "low", "low": "low", "medium": "high", "high": "high", "xhigh": "max", "max": "max"}


def template_messages(messages: list[ChatMessage]) -> list[dict[str, Any]]:
    """Plain dicts for the template: developer turns become system turns, text parts are joined, an empty
    assistant content is "" (never the literal None), empty-string tool arguments mean {}."""
    out: list[dict[str, Any]] = []
    for message in messages:
        item = message.model_dump(exclude_none=True, exclude_unset=False)
        item["role"] = "system" if message.role == "developer" else message.role
        if isinstance(message.content, list):
            # an image (video) part is the checkpoint's image (video) markup where it stood (engine/server/images.py)
            item["content"] = "".join(
                IMAGE_MARKUP
                if isinstance(part, ImagePart)
                else VIDEO_MARKUP
                if isinstance(part, VideoPart)
                else part.text or ""
                for part in message.content
            )
        item.setdefault("content", "")
        if message.reasoning is not None and message.reasoning_content is None:
            item["reasoning_content"] = message.reasoning
        for call in item.get("tool_calls") or []:
            if call["function"].get("arguments") in (None, ""):
                call["function"]["arguments"] = {}
        out.append(item)
    return out


def thinking_options(default_on: bool, effort: str | None, kwargs: dict[str, Any] | None) -> dict[str, Any]:
    """Template variables deciding thinking and its effort; explicit enable_thinking / thinking win."""
    options = dict(kwargs or {})
    effort = effort if effort is not None else options.pop("reasoning_effort", None)
    if effort is not None and not isinstance(effort, str):
        raise bad_request("reasoning_effort must be a string", "reasoning_effort")
    if effort is not None and effort not in EFFORTS and effort != "none":
        raise bad_request(
            f"reasoning_effort {effort!r} is not one of none, minimal, low, medium, high, xhigh, max",
            "reasoning_effort",
        )
    for name in ("enable_thinking", "thinking"):
        if options.get(name) is not None and not isinstance(options[name], bool):
            raise bad_request(
                f"chat_template_kwargs.{name} must be true or false, not {options[name]!r}",
                f"chat_template_kwargs.{name}",
            )
    explicit = options.get("enable_thinking") is not None or options.get("thinking") is not None
    if not explicit:
        options["enable_thinking"] = default_on and effort != "none"
    if effort in EFFORTS:
        options["reasoning_effort"] = EFFORTS[effort]
    return options


def render(
    template: str,
    messages: list[ChatMessage],
    tools: list[Tool] | None,
    default_thinking: bool,
    effort: str | None,
    kwargs: dict[str, Any] | None,
    add_generation_prompt: bool = True,
) -> str:
    tool_dicts = [t.model_dump(exclude_none=True) for t in tools] if tools else None
    options = thinking_options(default_thinking, effort, kwargs)
    for reserved in ("messages", "tools", "add_generation_prompt", "template"):
        options.pop(reserved, None)
    try:
        return render_chat(
            template_messages(messages),
            tool_dicts,
            add_generation_prompt=add_generation_prompt,
            template=template,
            **options,
        )
    except Exception as exc:  # a template error is the request's fault (its messages or kwargs)
        raise bad_request(f"the chat template could not render these messages: {exc}", "messages") from exc


def starts_in_reasoning(prompt: str) -> bool:
    return prompt.rstrip().endswith(THINK_OPEN)


@dataclass
class ReplyPiece:
    """A part of a reply as it arrives: reasoning or content text; or a tool call opening (`call` has its id and
    name), its arguments' JSON text growing (`text`), and closing (`call` has the whole arguments). `index`: the
    call's place among the reply's calls."""

    kind: str  # "reasoning" | "content" | "call_open" | "call_args" | "call_close"
    text: str = ""
    call: ParsedCall | None = None
    index: int = 0


@dataclass
class ReplyParser:
    """Feed text deltas, get reasoning / content / tool-call pieces; `finish` flushes what is held back."""

    in_reasoning: bool
    tools: dict[str, dict[str, Any]] = field(default_factory=dict)  # empty: no tool-call parsing
    buffer: str = ""
    calls: list[ParsedCall] = field(default_factory=list)  # the calls closed so far
    single_call: bool = False  # parallel_tool_calls false: the reply ends with its first call (the rest is dropped)
    _open: ParsedCall | None = None  # the call being written (its id and name)
    _arguments: ArgumentStream | None = None

    def feed(self, text: str) -> list[ReplyPiece]:
        if self.single_call and self.calls:
            return []
        self.buffer += text
        pieces: list[ReplyPiece] = []
        while self.buffer:
            if self.in_reasoning:
                head, sep, tail = self.buffer.partition(THINK_CLOSE)
                if sep:
                    self._out(pieces, "reasoning", head)
                    self.in_reasoning, self.buffer = False, tail
                    continue
                keep = held_suffix(self.buffer, (THINK_CLOSE,))
                self._out(pieces, "reasoning", self.buffer[: len(self.buffer) - keep])
                self.buffer = self.buffer[len(self.buffer) - keep :]
                return pieces
            if self._arguments is not None:
                delta, rest = self._arguments.feed(self.buffer)
                self.buffer = ""
                self._args(pieces, delta)
                if rest is None:
                    return pieces
                self._close(pieces)
                self.buffer = "" if self.single_call else rest
                continue
            if self.tools and CALL_OPEN in self.buffer:
                head, _, tail = self.buffer.partition(CALL_OPEN)
                self._out(pieces, "content", head)
                self.buffer = CALL_OPEN + tail
                ends = [i for i in (tail.find(KEY_OPEN), tail.find(CALL_CLOSE)) if i >= 0]
                if not ends:
                    return pieces  # the name is not all here yet
                name = tail[: min(ends)].strip()
                if name in self.tools:
                    self._open_call(pieces, name)
                    self.buffer = tail[min(ends) :]
                    continue
                if CALL_CLOSE not in tail:  # a tool that was not offered: the block stays text, once it is whole
                    return pieces
                body, _, rest = tail.partition(CALL_CLOSE)
                self._out(pieces, "content", CALL_OPEN + body + CALL_CLOSE)
                self.buffer = rest
                continue
            keep = held_suffix(self.buffer, (CALL_OPEN,) if self.tools else ())
            self._out(pieces, "content", self.buffer[: len(self.buffer) - keep])
            self.buffer = self.buffer[len(self.buffer) - keep :]
            return pieces
        return pieces

    def finish(self) -> list[ReplyPiece]:
        """The reply ended: a call it ended inside (its offered name written) is closed where it stopped; whatever
        else is held back is text."""
        pieces: list[ReplyPiece] = []
        if self.single_call and self.calls:
            return pieces
        name = self.buffer[len(CALL_OPEN) :].strip() if self.buffer.startswith(CALL_OPEN) else ""
        if self._arguments is None and self.tools and name in self.tools:  # ended right after an offered name
            self._open_call(pieces, name)
            self.buffer = ""
        if self._arguments is not None:
            self._args(pieces, self._arguments.finish())
            self._close(pieces)
        self._out(pieces, "reasoning" if self.in_reasoning else "content", self.buffer)
        self.buffer = ""
        return pieces

    def _open_call(self, pieces: list[ReplyPiece], name: str) -> None:
        self._open, self._arguments = ParsedCall(new_call_id(), name, ""), ArgumentStream(self.tools[name])
        pieces.append(ReplyPiece("call_open", call=self._open, index=len(self.calls)))

    def _args(self, pieces: list[ReplyPiece], delta: str) -> None:
        if delta:
            pieces.append(ReplyPiece("call_args", delta, self._open, len(self.calls)))

    def _close(self, pieces: list[ReplyPiece]) -> None:
        assert self._open is not None and self._arguments is not None
        call = ParsedCall(self._open.id, self._open.name, self._arguments.text)
        pieces.append(ReplyPiece("call_close", call=call, index=len(self.calls)))
        self.calls.append(call)
        self._open, self._arguments = None, None

    @staticmethod
    def _out(pieces: list[ReplyPiece], kind: str, text: str) -> None:
        if not text:
            return
        if pieces and pieces[-1].kind == kind:
            pieces[-1].text += text
        else:
            pieces.append(ReplyPiece(kind, text))
