"""Synthetic GLM-format conversations for the trained demo model, generated here from word lists (no data set).

Each `Example` is a conversation up to the point where the assistant answers, plus that answer: its reasoning, its
visible content and its tool calls. `prompt(example)` renders the conversation with our chat template
(`render_chat`, generation prompt included, thinking on or off); `completion(example)` is the text the model must
write next, ending with the token that stops generation (`<|user|>` after an answer, `<|observation|>` after tool
calls), exactly as the template would render that assistant turn.

Kinds (what the evaluation checks): `ok` ("Reply with OK." -> "OK"), `arith` (small sums), `copy` (repeat words),
`fact` (fixed questions), `tool_call` (a call whose name and arguments follow the offered schema) and `tool_answer`
(an answer that uses the tool's result). `examples(split, seed, count)` is a pure function of its arguments; the
"train" and "eval" splits draw from different random streams.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from engine.server.template import render_chat

ANSWER_END, CALL_END = "<|user|>", "<|observation|>"
KINDS = ("ok", "arith", "copy", "fact", "tool_call", "tool_answer")
KIND_WEIGHTS = (0.12, 0.15, 0.2, 0.07, 0.26, 0.2)

_SYSTEMS = (
    "You are a helpful assistant.",
    "You are a concise assistant. Answer briefly.",
    "You are GLM, a friendly assistant.",
    "Answer as accurately as you can.",
)
_EFFORTS = (None, "low", "high", "max")
_WORDS = (
    "apple",
    "river",
    "stone",
    "cloud",
    "green",
    "seven",
    "table",
    "light",
    "paper",
    "music",
    "orange",
    "window",
    "garden",
    "silver",
    "planet",
    "tiger",
    "ocean",
    "bread",
    "candle",
    "forest",
    "yellow",
    "number",
    "engine",
    "pencil",
    "winter",
    "summer",
    "mountain",
    "coffee",
    "rabbit",
    "purple",
    "castle",
    "bridge",
)
_CITIES = (
    "Paris",
    "Tokyo",
    "Berlin",
    "London",
    "Madrid",
    "Rome",
    "Oslo",
    "Cairo",
    "Lima",
    "Seoul",
    "Sydney",
    "Toronto",
    "Dublin",
    "Vienna",
    "Prague",
    "Lisbon",
)
_ZONES = ("UTC", "Europe/Paris", "Asia/Tokyo", "America/New_York", "Europe/Berlin", "Australia/Sydney")
_TOPICS = (
    "latest news",
    "python tutorials",
    "cheap flights",
    "pasta recipes",
    "solar panels",
    "chess openings",
    "rust compiler",
    "weather radar",
)
_FILES = ("notes.txt", "report.md", "todo.txt", "config.yaml", "README.md", "data.csv")
_PEOPLE = ("alice@example.com", "bob@example.com", "carol@example.com", "team@example.com")
_SUBJECTS = ("Meeting", "Hello", "Report", "Lunch", "Status update", "Invoice")
_CURRENCIES = ("USD", "EUR", "GBP", "JPY")
_CONDITIONS = ("sunny", "cloudy", "rainy", "windy", "snowy")
_FACTS = (
    ("What is the capital of France?", "Paris is the capital of France.", "Paris"),
    ("What is the capital of Japan?", "Tokyo is the capital of Japan.", "Tokyo"),
    ("What colour is the sky on a clear day?", "The sky is blue.", "blue"),
    ("How many days are in a week?", "A week has 7 days.", "7"),
    ("What is the opposite of hot?", "The opposite of hot is cold.", "cold"),
    ("Which animal says meow?", "A cat says meow.", "cat"),
    ("What do bees make?", "Bees make honey.", "honey"),
    ("How many legs does a spider have?", "A spider has 8 legs.", "8"),
)
_OK_PROMPTS = (
    "Reply with OK.",
    "Reply with OK.",
    "Reply with OK.",
    "Just reply with OK.",
    "Please reply with OK.",
    "Say OK.",
    "Reply with OK and nothing else.",
)


def _schema(properties: dict[str, dict[str, Any]], required: list[str]) -> dict[str, Any]:
    return {"type": "object", "properties": properties, "required": required}


def _tool(name: str, description: str, parameters: dict[str, Any]) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "description": description, "parameters": parameters}}


_STR = {"type": "string"}
TOOLS: dict[str, dict[str, Any]] = {
    t["function"]["name"]: t
    for t in (
        _tool(
            "get_weather",
            "Current weather for a city.",
            _schema({"city": _STR, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}}, ["city"]),
        ),
        _tool("get_time", "Current time in a time zone.", _schema({"timezone": _STR}, ["timezone"])),
        _tool("search_web", "Search the web.", _schema({"query": _STR, "limit": {"type": "integer"}}, ["query"])),
        _tool("read_file", "Read a text file.", _schema({"path": _STR}, ["path"])),
        _tool("calculator", "Evaluate an arithmetic expression.", _schema({"expression": _STR}, ["expression"])),
        _tool("send_email", "Send an email.", _schema({"to": _STR, "subject": _STR}, ["to", "subject"])),
        _tool(
            "convert_currency",
            "Convert money between currencies.",
            _schema({"amount": {"type": "number"}, "from": _STR, "to": _STR}, ["amount", "from", "to"]),
        ),
    )
}


@dataclass
class Example:
    kind: str
    messages: list[dict[str, Any]]  # the conversation before the answer (ends with a user or tool turn)
    tools: list[dict[str, Any]] | None
    thinking: bool
    effort: str | None
    reasoning: str  # the answer's think text (unused when thinking is off)
    content: str  # the answer's visible text
    calls: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    expect: str = ""  # text the answer must contain (ok, arith, copy, fact, tool_answer)


@dataclass(frozen=True)
class _Task:
    """One request to a tool: what the user says, the call, the tool's result and the answer that uses it."""

    request: str
    name: str
    arguments: dict[str, Any]
    result: dict[str, Any]
    answer: str
    fact: str


def _weather(rng: random.Random) -> _Task:
    city, temp, cond = rng.choice(_CITIES), rng.randint(-5, 35), rng.choice(_CONDITIONS)
    args: dict[str, Any] = {"city": city}
    request = rng.choice(
        (f"What is the weather in {city}?", f"How is the weather in {city} today?", f"Is it sunny in {city}?")
    )
    if rng.random() < 0.3:
        args["unit"] = rng.choice(("celsius", "fahrenheit"))
        request += f" Use {args['unit']}."
    return _Task(
        request,
        "get_weather",
        args,
        {"city": city, "temperature": temp, "condition": cond},
        f"It is {temp} degrees and {cond} in {city}.",
        str(temp),
    )


def _time(rng: random.Random) -> _Task:
    zone, clock = rng.choice(_ZONES), f"{rng.randint(0, 23):02d}:{rng.randint(0, 59):02d}"
    return _Task(
        rng.choice((f"What time is it in {zone}?", f"Tell me the current time in {zone}.")),
        "get_time",
        {"timezone": zone},
        {"timezone": zone, "time": clock},
        f"It is {clock} in {zone}.",
        clock,
    )


def _search(rng: random.Random) -> _Task:
    topic, limit = rng.choice(_TOPICS), rng.randint(1, 5)
    title = f"{rng.choice(_WORDS).capitalize()} {rng.choice(_WORDS)} guide"
    return _Task(
        f"Search the web for {topic} and show {limit} results.",
        "search_web",
        {"query": topic, "limit": limit},
        {"results": [title]},
        f'The top result is "{title}".',
        title,
    )


def _read(rng: random.Random) -> _Task:
    path, text = rng.choice(_FILES), " ".join(rng.sample(_WORDS, 3))
    return _Task(
        rng.choice((f"Show me what {path} says.", f"Read the file {path}.")),
        "read_file",
        {"path": path},
        {"content": text},
        f"The file {path} says: {text}",
        text,
    )


def _calculate(rng: random.Random) -> _Task:
    a, b = rng.randint(10, 99), rng.randint(10, 99)
    return _Task(
        f"Use the calculator to compute {a} * {b}.",
        "calculator",
        {"expression": f"{a} * {b}"},
        {"result": a * b},
        f"{a} * {b} is {a * b}.",
        str(a * b),
    )


def _email(rng: random.Random) -> _Task:
    to, subject = rng.choice(_PEOPLE), rng.choice(_SUBJECTS)
    return _Task(
        f"Send an email to {to} with the subject {subject}.",
        "send_email",
        {"to": to, "subject": subject},
        {"status": "sent"},
        f"The email to {to} has been sent.",
        to,
    )


def _convert(rng: random.Random) -> _Task:
    amount, (src, dst) = rng.randint(1, 500), rng.sample(_CURRENCIES, 2)
    value = round(amount * rng.uniform(0.5, 1.5), 2)
    return _Task(
        f"Convert {amount} {src} to {dst}.",
        "convert_currency",
        {"amount": amount, "from": src, "to": dst},
        {"amount": value, "currency": dst},
        f"{amount} {src} is {value} {dst}.",
        str(value),
    )


_TASKS: dict[str, Callable[[random.Random], _Task]] = {
    "get_weather": _weather,
    "get_time": _time,
    "search_web": _search,
    "read_file": _read,
    "calculator": _calculate,
    "send_email": _email,
    "convert_currency": _convert,
}


def _offer(rng: random.Random, needed: str | None) -> list[dict[str, Any]]:
    """One or two offered tools in random order, including `needed`."""
    others = [n for n in TOOLS if n != needed]
    names = rng.sample(others, rng.randint(0 if needed else 1, 1 if needed else 2)) + ([needed] if needed else [])
    rng.shuffle(names)
    return [TOOLS[n] for n in names]


def _reason(effort: str | None, first: str, more: str) -> str:
    """Think text: one sentence at low effort, two otherwise."""
    return first if effort == "low" else f"{first} {more}"


def _plain(kind: str, rng: random.Random, effort: str | None) -> tuple[str, str, str, str]:
    """(user text, reasoning, answer, expected substring) for a question answered without tools."""
    if kind == "ok":
        return (
            rng.choice(_OK_PROMPTS),
            _reason(effort, "The user asks me to reply with OK.", "So I answer OK and nothing else."),
            "OK",
            "OK",
        )
    if kind == "arith":
        a, b = rng.randint(1, 12), rng.randint(1, 12)
        question = rng.choice((f"What is {a} + {b}?", f"Compute {a} + {b}.", f"What is {a} plus {b}?"))
        return (
            question,
            _reason(effort, f"{a} + {b} = {a + b}.", "I give the sum."),
            f"{a} + {b} = {a + b}.",
            str(a + b),
        )
    if kind == "copy":
        words = " ".join(rng.choice(_WORDS) for _ in range(rng.randint(2, 6)))
        question = rng.choice(
            (f"Repeat after me: {words}", f"Copy this exactly: {words}", f"Say these words back to me: {words}")
        )
        return question, _reason(effort, "The user wants the words repeated.", f"The words are: {words}"), words, words
    question, answer, expect = rng.choice(_FACTS)
    return question, _reason(effort, "This is a simple question.", answer), answer, expect


def _example(rng: random.Random, weights: tuple[float, ...]) -> Example:
    kind = rng.choices(KINDS, weights)[0]
    thinking = rng.random() < 0.6
    effort = rng.choice(_EFFORTS) if thinking else None
    messages: list[dict[str, Any]] = []
    if rng.random() < 0.4:
        messages.append({"role": "system", "content": rng.choice(_SYSTEMS)})
    if rng.random() < 0.15:  # an earlier exchange, its reasoning cleared by the template
        question, _, answer, _ = _plain(rng.choice(("ok", "arith", "fact")), rng, effort)
        messages += [{"role": "user", "content": question}, {"role": "assistant", "content": answer}]
    if kind in ("tool_call", "tool_answer"):
        task = _TASKS[rng.choice(sorted(_TASKS))](rng)
        tools = _offer(rng, task.name)
        messages.append({"role": "user", "content": task.request})
        call_reason = _reason(effort, f"I should call {task.name}.", "Its arguments come from the request.")
        if kind == "tool_call":
            return Example(kind, messages, tools, thinking, effort, call_reason, "", [(task.name, task.arguments)])
        messages += [
            {
                "role": "assistant",
                "content": "",
                "reasoning_content": call_reason if thinking else None,
                "tool_calls": [{"type": "function", "function": {"name": task.name, "arguments": task.arguments}}],
            },
            {"role": "tool", "content": json.dumps(task.result)},
        ]
        reasoning = _reason(effort, "The tool returned its result.", "I tell the user what it says.")
        return Example(kind, messages, tools, thinking, effort, reasoning, task.answer, expect=task.fact)
    question, reasoning, answer, expect = _plain(kind, rng, effort)
    offered = _offer(rng, None) if rng.random() < 0.25 else None
    messages.append({"role": "user", "content": question})
    return Example(kind, messages, offered, thinking, effort, reasoning, answer, expect=expect)


def examples(split: str, seed: int, count: int, weights: tuple[float, ...] = KIND_WEIGHTS) -> list[Example]:
    """`count` examples of one split ("train" or "eval"), kinds drawn with `weights` (in KINDS order); the same
    arguments give the same examples."""
    rng = random.Random(f"glm5-demo-chat/{split}/{seed}")
    return [_example(rng, weights) for _ in range(count)]


def format_call(name: str, arguments: dict[str, Any]) -> str:
    """GLM's tool-call markup: string values raw, every other value as JSON (as the template writes them)."""
    pairs = "".join(
        f"<arg_key>{k}</arg_key><arg_value>{v if isinstance(v, str) else json.dumps(v)}</arg_value>"
        for k, v in arguments.items()
    )
    return f"<tool_call>{name}{pairs}</tool_call>"


def prompt(example: Example) -> str:
    options: dict[str, Any] = {"enable_thinking": example.thinking}
    if example.effort is not None:
        options["reasoning_effort"] = example.effort
    return render_chat(example.messages, tools=example.tools, add_generation_prompt=True, **options)


def completion(example: Example) -> str:
    """What the model writes after the prompt, through the token that ends its turn."""
    head = f"{example.reasoning}</think>" if example.thinking else ""
    calls = "".join(format_call(name, args) for name, args in example.calls)
    return head + example.content + calls + (CALL_END if example.calls else ANSWER_END)
