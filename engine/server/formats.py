"""Structured outputs, from a request's fields to the format its reply must follow (engine/structured.py applies it).

What asks for a format (at most one per request; two are a 400 `invalid_format`):
- chat and completions: `response_format` (json_object, json_schema), vLLM's `structured_outputs` (json, regex,
  choice, grammar, json_object; disable_any_whitespace) and its older `guided_json` / `guided_regex` / `guided_choice` / `guided_grammar`;
  `guided_decoding_backend` may only name xgrammar (or auto);
- Responses: `text.format` (json_object, json_schema); Anthropic Messages: `output_format` or
  `output_config.format` (json_schema); both arrive here as a chat request's response_format;
- tool_choice `required` or a named function: the call the reply is forced to start with is completed under the
  tool's parameter schema, in GLM's `<arg_key>/<arg_value>` form, so its arguments always validate; with
  parallel_tool_calls (the default) further calls may follow, each under its own tool's schema.

A reply that starts inside a think block thinks freely up to `</think>`; the format applies to what follows. Under
tool_choice auto with tools offered, a response_format allows either the formatted content or tool calls.

A format is an xgrammar structural tag (JSON). Compiling runs off the event loop; a schema, regex or grammar the
compiler rejects is a 400 `invalid_format` naming the field.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from starlette.concurrency import run_in_threadpool

from engine.server.errors import bad_request
from engine.server.tools import CALL_CLOSE, CALL_OPEN
from engine.structured import FormatError

if TYPE_CHECKING:
    from engine.server.protocol import SamplingFields, Tool
    from engine.server.state import ServerState

Format = dict[str, Any]
CODE = "invalid_format"
# Longest run of whitespace between JSON tokens: room for pretty-printing three levels deep, while a model that
# would rather write anything else cannot fill its reply with blanks (small models do). 1: single spaces.
WHITESPACE_RUN = 8


def json_format(schema: Any, param: str, whitespace: int = WHITESPACE_RUN) -> Format:
    """A JSON value under `schema` (a mapping, its JSON text, or None for any JSON value)."""
    if isinstance(schema, str):
        try:
            schema = json.loads(schema)
        except ValueError as exc:
            raise bad_request(f"{param} is not a JSON schema: {exc}", param, code=CODE) from exc
    if schema is None:
        schema = True
    if not isinstance(schema, (dict, bool)):
        raise bad_request(f"{param} must be a JSON schema (an object)", param, code=CODE)
    return {"type": "json_schema", "json_schema": schema, "max_whitespace_cnt": whitespace}


def _one_of(options: list[Format]) -> Format:
    return options[0] if len(options) == 1 else {"type": "or", "elements": options}


def choice_format(choices: list[str]) -> Format:
    return _one_of([{"type": "const_string", "value": c} for c in dict.fromkeys(choices)])


def _asked(kind: str, value: Any, param: str, whitespace: int = WHITESPACE_RUN) -> Format:
    """The format of one vLLM-style field: json (a schema or its text), regex, choice, grammar, json_object."""
    if kind == "json":
        return json_format(value, param, whitespace)
    if kind == "json_object":
        return json_format({"type": "object"}, param, whitespace)
    if kind == "choice":
        return choice_format(value)
    if kind == "regex":
        return {"type": "regex", "pattern": value}
    return {"type": "grammar", "grammar": value}


def content_format(body: SamplingFields) -> tuple[str, Format] | None:
    """(the field that asked, the format) for what a chat or completions request asks its content to follow."""
    asked: list[tuple[str, Format]] = []
    response_format = body.response_format
    if response_format is not None and response_format.type == "json_object":
        asked.append(("response_format", _asked("json_object", None, "response_format")))
    elif response_format is not None and response_format.type == "json_schema":
        spec, param = response_format.json_schema, "response_format.json_schema"
        asked.append((param, _asked("json", spec.schema_ if spec else None, param)))
    outputs = body.structured_outputs
    if outputs is not None:
        run = 1 if outputs.disable_any_whitespace else WHITESPACE_RUN
        for kind, value in (("json", outputs.json_), ("regex", outputs.regex), ("choice", outputs.choice),
                            ("grammar", outputs.grammar), ("json_object", outputs.json_object or None)):  # fmt: skip
            if value is not None:
                asked.append((f"structured_outputs.{kind}", _asked(kind, value, f"structured_outputs.{kind}", run)))
    for kind in ("json", "regex", "choice", "grammar"):  # vLLM's older names
        if (value := getattr(body, f"guided_{kind}")) is not None:
            asked.append((f"guided_{kind}", _asked(kind, value, f"guided_{kind}")))
    if len(asked) > 1:
        names = ", ".join(name for name, _ in asked)
        raise bad_request(f"a request may ask for one format; this one asks for {names}", asked[1][0], code=CODE)
    return asked[0] if asked else None


def _arguments(tool: Tool) -> Format:
    params = tool.function.parameters if isinstance(tool.function.parameters, dict) else None
    return {"type": "json_schema", "json_schema": params or {"type": "object"}, "style": "glm_xml"}


def _calls(tools: list[Tool], opening: str) -> Format:
    """One call to any of `tools`: `opening` + its name, its arguments under its schema, `</tool_call>`."""
    return _one_of(
        [
            {"type": "tag", "begin": opening + t.function.name, "content": _arguments(t), "end": CALL_CLOSE}
            for t in tools
        ]
    )


def calls_format(tools: list[Tool]) -> Format:
    """One or more whole calls, each to an offered tool, its arguments under that tool's schema."""
    return {"type": "plus", "content": _calls(tools, CALL_OPEN)}


def forced_call_format(tools: list[Tool], forced: str, parallel: bool) -> Format:
    """The rest of a reply whose start `forced` (`<tool_call>NAME` or `<tool_call>`) the prompt already holds: the
    call's arguments (and name, when only `<tool_call>` was written) and its end, then further calls if parallel."""
    named = forced[len(CALL_OPEN) :]
    if named:  # the name is written already: its arguments, then the end
        tool = next(t for t in tools if t.function.name == named)
        first = {"type": "sequence", "elements": [_arguments(tool), {"type": "const_string", "value": CALL_CLOSE}]}
    else:
        first = _calls(tools, "")
    if not parallel:
        return first
    return {"type": "sequence", "elements": [first, {"type": "star", "content": _calls(tools, CALL_OPEN)}]}


def after_thinking(fmt: Format) -> Format:
    """Free reasoning up to `</think>`, then `fmt`."""
    think = {"type": "tag", "begin": "", "content": {"type": "any_text"}, "end": "</think>"}
    return {"type": "sequence", "elements": [think, fmt]}


def spec_text(fmt: Format) -> str:
    """The structural tag's JSON text (the compiled-grammar cache's key). Keys keep their order: a schema's
    properties are written in the order it declares them."""
    return json.dumps({"type": "structural_tag", "format": fmt}, ensure_ascii=False)


async def compile_format(state: ServerState, fmt: Format | None, param: str) -> Any:
    """The compiled grammar for `fmt` (None for none); off the event loop, since a large schema takes a while."""
    if fmt is None:
        return None
    try:
        return await run_in_threadpool(state.grammars.compile, spec_text(fmt))
    except FormatError as exc:
        raise bad_request(f"{param} cannot be followed: {exc}", param, code=CODE) from exc
