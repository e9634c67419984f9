"""`python -m engine eval-demo CHECKPOINT [--count N]`: greedy-decode held-out synthetic prompts with this engine
(`Glm5NextForCausalLM`, fp32, CPU) and print how often the replies are right.

Per reply: well-formed (it stops on an end token; thinking on -> exactly one `</think>` and then an answer or a call,
no `<think>`; thinking off -> neither), correct (ok: the answer is "OK"; arith / copy / fact / tool_answer: the answer
contains the expected text and calls no tool; tool_call: exactly the expected call), and for tool calls, whether the
call parses and its arguments validate against the offered schema.
"""

from __future__ import annotations

import argparse
import json
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from engine.checkpoint.tokenizer_build import EOS_TOKENS
from engine.models.glm5_next.model import Glm5NextForCausalLM
from engine.train import synthetic

_CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)
_PAIR = re.compile(r"<arg_key>(.*?)</arg_key><arg_value>(.*?)</arg_value>", re.DOTALL)
_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
    "array": (list,),
    "object": (dict,),
}


@dataclass(frozen=True)
class Reply:
    text: str  # everything generated, special tokens included, the end token excluded
    stopped: bool  # ended on an end token (not cut at the length limit)

    @property
    def content(self) -> str:
        """The visible answer: after `</think>`, without tool calls."""
        return _CALL.sub("", self.text.split("</think>")[-1]).strip()


@dataclass(frozen=True)
class Score:
    kind: str
    well_formed: bool
    correct: bool
    call_valid: bool | None = None  # tool_call only: parsed, offered, arguments fit the schema


@dataclass
class Report:
    scores: list[Score] = field(default_factory=list)
    seconds: float = 0.0

    def fraction(self, attribute: str, kind: str | None = None) -> float:
        values = [getattr(s, attribute) for s in self.scores if kind in (None, s.kind)]
        values = [v for v in values if v is not None]
        return sum(values) / len(values) if values else float("nan")

    def table(self) -> str:
        rows = [f"{'kind':<12} {'n':>4} {'well-formed':>12} {'correct':>8} {'valid call':>11}"]
        for kind in (*synthetic.KINDS, None):
            n = sum(1 for s in self.scores if kind in (None, s.kind))
            if not n:
                continue
            valid = self.fraction("call_valid", kind)
            rows.append(
                f"{kind or 'all':<12} {n:>4} {self.fraction('well_formed', kind):>12.1%} "
                f"{self.fraction('correct', kind):>8.1%} {'' if valid != valid else f'{valid:.1%}':>11}"
            )
        return "\n".join(rows)


def parse_calls(text: str, tools: list[dict[str, Any]] | None) -> list[tuple[str, dict[str, Any]] | None]:
    """Every `<tool_call>` block as (name, typed arguments), or None where it does not fit an offered schema."""
    offered = {t["function"]["name"]: t["function"]["parameters"] for t in tools or []}
    return [_parse_call(body, offered) for body in _CALL.findall(text)]


def _parse_call(body: str, offered: dict[str, dict[str, Any]]) -> tuple[str, dict[str, Any]] | None:
    name, _, rest = body.partition("<arg_key>")
    rest = "<arg_key>" + rest if rest else ""
    schema = offered.get(name.strip())
    if schema is None or _PAIR.sub("", rest).strip():
        return None
    arguments: dict[str, Any] = {}
    for key, raw in _PAIR.findall(rest):
        spec = schema["properties"].get(key)
        if spec is None or key in arguments:
            return None
        if spec["type"] == "string":
            value: Any = raw
        else:
            try:
                value = json.loads(raw)
            except ValueError:
                return None
        if not isinstance(value, _TYPES[spec["type"]]) or isinstance(value, bool) != (spec["type"] == "boolean"):
            return None
        if "enum" in spec and value not in spec["enum"]:
            return None
        arguments[key] = value
    if any(key not in arguments for key in schema.get("required", [])):
        return None
    return name.strip(), arguments


def _well_formed(example: synthetic.Example, reply: Reply) -> bool:
    if not reply.stopped or "<think>" in reply.text:
        return False
    if not example.thinking:
        return "</think>" not in reply.text and bool(reply.text.strip())
    return reply.text.count("</think>") == 1 and bool(reply.text.split("</think>")[1].strip())


def score(example: synthetic.Example, reply: Reply) -> Score:
    calls = parse_calls(reply.text, example.tools)
    well_formed = _well_formed(example, reply)
    if example.kind == "tool_call":
        valid = len(calls) == 1 and calls[0] is not None
        return Score(example.kind, well_formed, valid and calls == list(example.calls), valid)
    if example.kind == "ok":
        return Score(example.kind, well_formed, not calls and reply.content == "OK")
    return Score(example.kind, well_formed, not calls and example.expect in reply.content)


def generate(model: Glm5NextForCausalLM, tokenizer, prompts: list[str], max_new_tokens: int = 96) -> list[Reply]:
    """Greedy replies to several prompts, decoded together in one batch."""
    stop = {tokenizer.token_to_id(t) for t in EOS_TOKENS}
    encoded = [tokenizer.encode(p).ids for p in prompts]
    pool = model.make_pool(sum(len(ids) for ids in encoded) + len(prompts) * (max_new_tokens + 1))
    seqs = [model.new_sequence(pool) for _ in prompts]
    nxt = [int(model.prefill(seq, ids).argmax()) for seq, ids in zip(seqs, encoded)]
    out: list[list[int]] = [[] for _ in prompts]
    done = [False] * len(prompts)
    for _ in range(max_new_tokens):
        live = [i for i in range(len(prompts)) if not done[i]]
        for i in live:
            done[i] = nxt[i] in stop
            if not done[i]:
                out[i].append(nxt[i])
        live = [i for i in live if not done[i]]
        if not live:
            break
        logits = model.decode([seqs[i] for i in live], [nxt[i] for i in live])
        for row, i in enumerate(live):
            nxt[i] = int(logits[row].argmax())
    for seq in seqs:
        seq.release()
    return [Reply(tokenizer.decode(ids, skip_special_tokens=False), done[i]) for i, ids in enumerate(out)]


def evaluate(checkpoint: str | Path, count: int = 140, seed: int = 0, batch: int = 16) -> Report:
    """Score `count` held-out ("eval" split) examples on the checkpoint."""
    from tokenizers import Tokenizer

    began = time.perf_counter()
    model = Glm5NextForCausalLM.load(checkpoint)
    tokenizer = Tokenizer.from_file(str(Path(checkpoint) / "tokenizer.json"))
    examples = synthetic.examples("eval", seed, count)
    report = Report()
    for start in range(0, count, batch):
        chunk = examples[start : start + batch]
        replies = generate(model, tokenizer, [synthetic.prompt(e) for e in chunk])
        report.scores += [score(e, r) for e, r in zip(chunk, replies)]
    report.seconds = time.perf_counter() - began
    return report


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("checkpoint", type=Path, help="a checkpoint directory (e.g. from make-demo --size trained)")
    parser.add_argument("--count", type=int, default=140, help="held-out examples to score")
    parser.add_argument("--seed", type=int, default=0, help="which held-out examples")
    parser.add_argument("--threads", type=int, default=1, help="torch threads")


def run(args: argparse.Namespace) -> int:
    torch.set_num_threads(args.threads)
    report = evaluate(args.checkpoint, count=args.count, seed=args.seed)
    print(report.table())
    print(f"{len(report.scores)} held-out prompts, greedy, in {report.seconds:.0f} s")
    return 0
