"""GLM tool calls -> OpenAI `tool_calls`.

The model writes `<tool_call>NAME<arg_key>K</arg_key><arg_value>V</arg_value>…</tool_call>`, string values raw and
everything else as JSON. Each value is typed by the offered tool's JSON schema (Python spellings True/False/None
are accepted too). A call naming a tool that was not offered, or one whose markup or values do not fit, is not a
call: the caller keeps it as text.
"""

from __future__ import annotations

import json
import re
import secrets
from dataclasses import dataclass
from typing import Any

CALL_OPEN, CALL_CLOSE = "<tool_call>", "</tool_call>"
# a key is plain text; a value may hold anything but the argument markup itself
_PAIR = re.compile(r"<arg_key>([^<>]*)</arg_key>\s*<arg_value>((?:(?!</?arg_(?:key|value)>).)*)</arg_value>", re.DOTALL)
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


def parse_call(block: str, tools: dict[str, dict[str, Any]]) -> ParsedCall | None:
    """A whole `<tool_call>…</tool_call>` block -> a call, or None when it must stay text."""
    if not (block.startswith(CALL_OPEN) and block.endswith(CALL_CLOSE)):
        return None
    body = block[len(CALL_OPEN) : -len(CALL_CLOSE)]
    name, _, rest = body.partition("<arg_key>")
    name = name.strip()
    if name not in tools:
        return None
    rest = "<arg_key>" + rest if _ else ""
    declared = tools[name].get("properties")
    properties: dict[str, Any] = declared if isinstance(declared, dict) else {}
    arguments: dict[str, Any] = {}
    for match in _PAIR.finditer(rest):
        key = match.group(1).strip()
        ok, value = type_value(match.group(2), properties.get(key))
        if not ok or not key:
            return None
        arguments[key] = value
    if _PAIR.sub("", rest).strip():
        return None  # markup the pairs do not explain
    return ParsedCall(new_call_id(), name, json.dumps(arguments, ensure_ascii=False))


def function_tool(name: str, description: str | None, parameters: dict[str, Any] | None) -> dict[str, Any]:
    """An OpenAI chat `tools` entry (what the Messages and Responses routes translate their tools into)."""
    function: dict[str, Any] = {"name": name}
    if description is not None:
        function["description"] = description
    if parameters is not None:
        function["parameters"] = parameters
    return {"type": "function", "function": function}
