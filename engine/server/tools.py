"""GLM tool calls -> OpenAI `tool_calls`, their arguments streamed as the model writes them.

The model writes `<tool_call>NAME<arg_key>K</arg_key><arg_value>V</arg_value>…</tool_call>`, string values raw and
everything else as JSON. Once NAME is known and names an offered tool, the call is a call: `ArgumentStream` turns
the pairs into the arguments' JSON text as they arrive — a value its schema declares a string streams as it is
written (escaped), any other value goes out whole once its `</arg_value>` arrives, typed by the schema (Python
spellings True/False/None are accepted too). A value that does not fit its declared type is passed on as the
string it was (the client's validation sees it; under a forced tool_choice the grammar never lets it happen), text
between the pairs that is not markup is dropped, and a call the reply ends inside is closed where it stopped (the
finish_reason says length). A call naming a tool that was not offered is not a call: the caller keeps it as text.
"""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass
from typing import Any

from engine.server.generation import held_suffix

CALL_OPEN, CALL_CLOSE = "<tool_call>", "</tool_call>"
KEY_OPEN, KEY_CLOSE, VALUE_OPEN, VALUE_CLOSE = "<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>"
_PY_LITERALS = {"True": "true", "False": "false", "None": "null"}
_JSON_TYPES: dict[str, tuple[type, ...]] = {
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
    "array": (list,),
    "object": (dict,),
    "null": (type(None),),
}


@dataclass(frozen=True)
class ParsedCall:
    id: str
    name: str
    arguments: str  # JSON object text

    def as_openai(self, index: int | None = None) -> dict[str, Any]:
        out: dict[str, Any] = {
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        }
        if index is not None:
            out["index"] = index
        return out


def new_call_id() -> str:
    return "call_" + secrets.token_hex(12)


def offered_tools(tools: list[dict[str, Any]] | None) -> dict[str, dict[str, Any]]:
    """name -> parameter schema of every offered function."""
    out: dict[str, dict[str, Any]] = {}
    for tool in tools or []:
        fn = tool.get("function", tool)
        params = fn.get("parameters")
        out[fn["name"]] = params if isinstance(params, dict) else {}
    return out


def _declared_types(schema: Any) -> list[str]:
    if not isinstance(schema, dict):
        return []
    kind = schema.get("type")
    if isinstance(kind, str):
        return [kind]
    if isinstance(kind, list):
        return [k for k in kind if isinstance(k, str)]
    for key in ("anyOf", "oneOf"):
        if isinstance(schema.get(key), list):
            return [t for sub in schema[key] for t in _declared_types(sub)]
    if "enum" in schema or "const" in schema:
        return ["any"]
    return []


def _loads(text: str) -> tuple[bool, Any]:
    raw = text.strip()
    try:
        return True, json.loads(_PY_LITERALS.get(raw, raw))
    except ValueError:
        return False, None


def _is(value: Any, kind: str) -> bool:
    if kind in ("integer", "number") and isinstance(value, bool):
        return False
    if kind == "integer" and isinstance(value, float):
        return value.is_integer()
    return isinstance(value, _JSON_TYPES.get(kind, (object,)))


def type_value(text: str, schema: Any) -> tuple[bool, Any]:
    """(ok, value) for one written argument value under its schema."""
    kinds = _declared_types(schema)
    if not kinds:  # undeclared: JSON when it parses, else the raw string
        ok, value = _loads(text)
        return True, value if ok else text
    ok, value = _loads(text)
    if ok:
        for kind in kinds:
            if kind == "any" or (kind != "string" and _is(value, kind)):
                return True, int(value) if kind == "integer" and isinstance(value, float) else value
    if "string" in kinds or "any" in kinds:
        return True, text
    return False, None


def _streams_as_string(schema: Any) -> bool:
    return _declared_types(schema) == ["string"]


class ArgumentStream:
    """One call's `<arg_key>/<arg_value>` pairs, fed as they arrive, -> its arguments' JSON text in deltas.
    `feed` returns (delta, rest): rest is None while the call is open, else the text after its `</tool_call>`."""

    def __init__(self, parameters: dict[str, Any]) -> None:
        declared = parameters.get("properties")
        self.properties: dict[str, Any] = declared if isinstance(declared, dict) else {}
        self.buffer = ""
        self.text = ""  # the arguments' JSON so far
        self.key: str | None = None  # inside a value: its key
        self.streaming = False  # inside a string value that streams

    def _emit(self, out: list[str], text: str) -> None:
        out.append(text)
        self.text += text

    def _open_value(self, out: list[str], key: str) -> None:
        self.key, self.streaming = key, _streams_as_string(self.properties.get(key))
        head = ", " if self.text else "{"
        self._emit(out, f"{head}{json.dumps(key, ensure_ascii=False)}: " + ('"' if self.streaming else ""))

    def _close_value(self, out: list[str], raw: str) -> None:
        if self.streaming:
            self._emit(out, json.dumps(raw, ensure_ascii=False)[1:-1] + '"')
        else:
            ok, value = type_value(raw, self.properties.get(self.key or ""))
            self._emit(out, json.dumps(value if ok else raw, ensure_ascii=False))
        self.key, self.streaming = None, False

    def feed(self, text: str) -> tuple[str, str | None]:
        self.buffer += text
        out: list[str] = []
        while True:
            if self.key is not None:  # inside a value
                end = self.buffer.find(VALUE_CLOSE)
                if end >= 0:
                    raw, self.buffer = self.buffer[:end], self.buffer[end + len(VALUE_CLOSE) :]
                    self._close_value(out, raw)
                    continue
                if self.streaming:
                    ready = len(self.buffer) - held_suffix(self.buffer, (VALUE_CLOSE,))
                    self._emit(out, json.dumps(self.buffer[:ready], ensure_ascii=False)[1:-1])
                    self.buffer = self.buffer[ready:]
                return "".join(out), None
            rest = self.buffer.lstrip()
            if rest.startswith(CALL_CLOSE):
                self._emit(out, "}" if self.text else "{}")
                return "".join(out), rest[len(CALL_CLOSE) :]
            if rest.startswith(KEY_OPEN):
                end = rest.find(KEY_CLOSE)
                after = rest[end + len(KEY_CLOSE) :].lstrip() if end >= 0 else ""
                if end < 0 or (len(after) < len(VALUE_OPEN) and VALUE_OPEN.startswith(after)):
                    self.buffer = rest  # the pair's markup is not all here yet
                    return "".join(out), None
                if not after.startswith(VALUE_OPEN):  # a key with no value: dropped
                    self.buffer = after
                    continue
                self._open_value(out, rest[len(KEY_OPEN) : end].strip())
                self.buffer = after[len(VALUE_OPEN) :]
                continue
            if not rest or held_suffix(rest, (CALL_CLOSE, KEY_OPEN)) == len(rest):
                self.buffer = rest  # empty, or the start of the markup that comes next
                return "".join(out), None
            stray = rest.find("<", 1)  # text that is not markup: dropped up to the next tag
            self.buffer = rest[stray:] if stray > 0 else ""

    def finish(self) -> str:
        """The reply ended inside the call: close what is open, so the arguments are JSON."""
        out: list[str] = []
        if self.key is not None:
            self._close_value(out, self.buffer)
        self._emit(out, "}" if self.text else "{}")
        return "".join(out)


def parse_call(block: str, tools: dict[str, dict[str, Any]]) -> ParsedCall | None:
    """A whole `<tool_call>…</tool_call>` block -> a call (as the streamed reply would give it), or None when it
    names no offered tool."""
    if not (block.startswith(CALL_OPEN) and block.endswith(CALL_CLOSE)):
        return None
    body = block[len(CALL_OPEN) :]
    cut = min((i for i in (body.find(KEY_OPEN), body.find(CALL_CLOSE)) if i >= 0), default=-1)
    name = body[:cut].strip()
    if name not in tools:
        return None
    stream = ArgumentStream(tools[name])
    _, rest = stream.feed(body[cut:])
    return ParsedCall(new_call_id(), name, stream.text if rest is not None else stream.text + stream.finish())


def function_tool(name: str, description: str | None, parameters: dict[str, Any] | None) -> dict[str, Any]:
    """An OpenAI chat `tools` entry (what the Messages and Responses routes translate their tools into)."""
    function: dict[str, Any] = {"name": name}
    if description is not None:
        function["description"] = description
    if parameters is not None:
        function["parameters"] = parameters
    return {"type": "function", "function": function}
