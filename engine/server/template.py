"""Render the chat template exactly as transformers' `apply_chat_template` does, without importing transformers.

The environment matches transformers' (sandboxed, `trim_blocks`, `lstrip_blocks`, a `tojson` that keeps non-ASCII
text), so a prompt rendered here and one rendered by transformers from the same checkpoint are the same string.
One addition: tool-call `arguments` given as a JSON string are parsed into a mapping first (OpenAI clients send
strings; the template writes `<arg_key>/<arg_value>` pairs from a mapping), as vLLM does before rendering.
"""

from __future__ import annotations

import copy
import functools
import json
from importlib import resources
from pathlib import Path
from typing import Any

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment

TEMPLATE_NAME = "chat_template.jinja"
_REASONING_ALIASES = ("reasoning_content", "thinking", "reasoning")


def load_chat_template(checkpoint: str | Path | None = None) -> str:
    """The template source: the checkpoint's own `chat_template.jinja` (or `tokenizer_config.json`'s
    `chat_template`) when a directory is given, else the one shipped in this package."""
    if checkpoint is not None:
        directory = Path(checkpoint)
        if (directory / TEMPLATE_NAME).exists():
            return (directory / TEMPLATE_NAME).read_text()
        config = directory / "tokenizer_config.json"
        if config.exists() and isinstance(json.loads(config.read_text()).get("chat_template"), str):
            return json.loads(config.read_text())["chat_template"]
    return resources.files("engine.checkpoint").joinpath(TEMPLATE_NAME).read_text()


def _tojson(
    value: Any, ensure_ascii: bool = False, indent: int | None = None, separators: Any = None, sort_keys: bool = False
) -> str:
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _raise(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


@functools.lru_cache(maxsize=8)
def _compile(source: str) -> jinja2.Template:
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise
    return env.from_string(source)


def _normalise(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for message in copy.deepcopy(list(messages)):
        reasoning = next((message[k] for k in _REASONING_ALIASES if message.get(k) is not None), None)
        if reasoning is not None:  # transformers fills both names the same way
            message = {"thinking": reasoning, **message, "reasoning_content": reasoning}
        for call in message.get("tool_calls") or []:
            fn = call.get("function", call)
            if isinstance(fn.get("arguments"), str):
                try:
                    parsed = json.loads(fn["arguments"])
                except ValueError:
                    continue
                if isinstance(parsed, dict):
                    fn["arguments"] = parsed
        out.append(message)
    return out


def render_chat(
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None = None,
    add_generation_prompt: bool = True,
    template: str | None = None,
    **kwargs: Any,
) -> str:
    """The prompt text for `messages`; `kwargs` are template variables (enable_thinking, reasoning_effort,
    clear_thinking, thinking)."""
    source = template if template is not None else load_chat_template()
    return _compile(source).render(
        messages=_normalise(messages), tools=tools, add_generation_prompt=add_generation_prompt, **kwargs
    )
