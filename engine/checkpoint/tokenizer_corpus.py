"""Training text for the demo tokenizer, generated here from word lists written for this project.

The demo model is random, so the tokenizer only has to be plausible: it should split English prose, chat turns,
JSON tool arguments, code and numbers into sensible pieces. `corpus_lines()` is a pure function of its seed, so the
trained tokenizer is the same on every machine. No downloaded text is involved.
"""

from __future__ import annotations

import json
import random
from importlib import resources

_SUBJECTS = (
    "the server",
    "a user",
    "the model",
    "our engine",
    "the scheduler",
    "each rank",
    "the cluster",
    "a request",
    "the tokenizer",
    "this function",
    "the cache",
    "a student",
    "my friend",
    "the weather service",
    "the library",
    "a small team",
    "the kernel",
    "every worker",
    "the browser",
    "the database",
    "an assistant",
    "the teacher",
)
_VERBS = (
    "reads",
    "writes",
    "sends",
    "returns",
    "checks",
    "loads",
    "starts",
    "stops",
    "answers",
    "explains",
    "counts",
    "builds",
    "measures",
    "splits",
    "joins",
    "waits for",
    "computes",
    "prints",
    "stores",
    "finds",
    "opens",
    "closes",
    "schedules",
    "decodes",
    "encodes",
    "streams",
    "keeps",
    "drops",
    "updates",
    "compares",
    "sorts",
    "selects",
)
_OBJECTS = (
    "the weights",
    "a new token",
    "the prompt",
    "every layer",
    "the result",
    "a short answer",
    "the file",
    "the index",
    "two numbers",
    "the whole list",
    "a JSON object",
    "the next batch",
    "the logits",
    "its state",
    "the first chunk",
    "a clear message",
    "the recipe",
    "the forecast",
    "a summary",
    "the error",
    "the output",
    "the history",
    "a long document",
    "the settings",
    "a table of values",
    "the last step",
    "the tool result",
)
_TAILS = (
    "before it replies.",
    "on every step.",
    "in a few milliseconds.",
    "without copying memory.",
    "when asked.",
    "after the prompt is filled.",
    "for each sequence.",
    "so the numbers match.",
    "and then it stops.",
    "in rank order.",
    "because the pool is full.",
    "while the others wait.",
    "with a single call.",
    "as fast as it can.",
    "one token at a time.",
    "for the whole team.",
    "and nothing else.",
    "by the deadline.",
)
_QUESTIONS = (
    "What is the capital of France?",
    "How many tokens fit in the cache?",
    "Can you explain how attention works?",
    "Why does the loss go down?",
    "What time is it in Tokyo?",
    "Please summarise this paragraph.",
    "Write a haiku about the sea.",
    "How do I sort a list in Python?",
    "What is 17 times 23?",
    "Is it going to rain tomorrow?",
    "Translate 'good morning' into French.",
    "Which city is larger?",
    "What does a tensor-parallel engine do?",
    "Give me three ideas for dinner.",
    "How far away is the moon?",
)
_ANSWERS = (
    "Paris is the capital of France.",
    "The moon is about 384,400 kilometres away.",
    "17 times 23 is 391.",
    "Sure, here is a short summary.",
    "Attention compares each query with every key and mixes the values.",
    "Use the sorted() function or call list.sort() in place.",
    "It will probably rain in the afternoon.",
    "Bonjour means good morning.",
    "Here are three ideas: soup, pasta and a salad.",
    "A tensor-parallel engine splits every large matrix across several devices.",
)
_TOOLS = ("get_weather", "search_web", "read_file", "run_python", "get_time", "send_email", "calculator")
_KEYS = ("city", "query", "path", "code", "timezone", "to", "expression", "unit", "limit", "subject")
_VALUES = (
    "Paris",
    "Tokyo",
    "Berlin",
    "celsius",
    "notes.txt",
    "print(2 + 2)",
    "UTC",
    "alice@example.com",
    "3 * (4 + 5)",
    "latest news",
    "10",
    "true",
    "fahrenheit",
    "report.md",
)
_CODE = (
    "def add(a, b):\n    return a + b\n",
    "for i in range(10):\n    print(i * i)\n",
    "import json\ndata = json.loads(text)\nprint(data['name'])\n",
    "class Point:\n    def __init__(self, x, y):\n        self.x = x\n        self.y = y\n",
    "if value is None:\n    raise ValueError('value is required')\n",
    "result = [x for x in items if x > 0]\n",
    "with open(path) as handle:\n    lines = handle.readlines()\n",
    "const total = items.reduce((a, b) => a + b, 0);\n",
    "SELECT name, count(*) FROM users GROUP BY name;\n",
    "$ python -m engine info ./demo --tp 2\n",
)


def _sentence(rng: random.Random) -> str:
    text = f"{rng.choice(_SUBJECTS)} {rng.choice(_VERBS)} {rng.choice(_OBJECTS)} {rng.choice(_TAILS)}"
    return text[0].upper() + text[1:]


def _arguments(rng: random.Random) -> dict[str, object]:
    keys = rng.sample(_KEYS, rng.randint(1, 3))
    return {k: (rng.randint(0, 999) if rng.random() < 0.3 else rng.choice(_VALUES)) for k in keys}


def _line(rng: random.Random) -> str:
    kind = rng.randrange(8)
    if kind <= 2:
        return " ".join(_sentence(rng) for _ in range(rng.randint(1, 4)))
    if kind == 3:
        return f"{rng.choice(_QUESTIONS)} {rng.choice(_ANSWERS)}"
    if kind == 4:
        name = rng.choice(_TOOLS)
        return json.dumps({"name": name, "arguments": _arguments(rng)}, ensure_ascii=False)
    if kind == 5:
        return rng.choice(_CODE)
    if kind == 6:
        numbers = [str(rng.randint(0, 10 ** rng.randint(1, 6))) for _ in range(rng.randint(2, 6))]
        return f"The values were {', '.join(numbers)} and the mean was {rng.uniform(0, 1000):.2f}."
    return f"Step {rng.randint(1, 99)}: {_sentence(rng)} Then {_sentence(rng).lower()}"


def corpus_lines(seed: int = 0, count: int = 6000) -> list[str]:
    """`count` generated lines of mixed prose, dialogue, JSON, code and numbers, plus the hand-written lines of
    tokenizer_corpus.txt (repeated so its words are frequent enough to merge); identical for the same seed."""
    rng = random.Random(seed)
    written = resources.files("engine.checkpoint").joinpath("tokenizer_corpus.txt").read_text().splitlines()
    return [_line(rng) for _ in range(count)] + [line for line in written if line.strip()] * 4
