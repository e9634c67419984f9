"""What a format costs rank 0 per token: xgrammar's next-token mask plus our unpacking and masking of the logits row
(engine/structured.py's `Constraint.mask`), and one grammar's compile time, for the trained demo's vocabulary
(2.7k tokens) and a synthetic byte-level vocabulary of GLM's size (151,552 tokens: all bytes, the demo's tokens and
generated word pieces; the real tokenizer is not available offline, so its figure is indicative).

    python bench/structured_bench.py [--out FILE] [--device cuda]

Each format is walked for up to STEPS tokens, choosing a seeded random allowed token each step (as sampling under
the mask would), restarting when the format is complete; times are medians per token: xgrammar filling the bitmask,
our unpacking and masking of a copy of the row, and xgrammar's own `apply_token_bitmask_inplace` on a copy."""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from engine.checkpoint.demo import TRAINED  # noqa: E402
from engine.server import formats  # noqa: E402
from engine.structured import Constraint, Grammars  # noqa: E402

GLM_VOCAB = 151_552
STEPS = int(__import__("os").environ.get("STEPS", "400"))
SCHEMA = {
    "type": "object",
    "properties": {
        "city": {"type": "string"},
        "days": {"type": "integer"},
        "tags": {"type": "array", "items": {"type": "string"}},
        "unit": {"enum": ["celsius", "fahrenheit"]},
    },
    "required": ["city", "days", "tags", "unit"],
}
TOOL = {"type": "object", "properties": {"to": {"type": "string"}, "subject": {"type": "string"}}, "required": ["to"]}


class SyntheticTokenizer:
    """The two methods Grammars reads, over a made-up byte-level vocabulary."""

    def __init__(self, base, size: int) -> None:
        vocab = dict(base.get_vocab(with_added_tokens=True))
        rng = random.Random(0)
        letters = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
        words = [w for w in vocab if w.isalpha()]
        while len(vocab) < size:
            piece = rng.choice(words) + "".join(rng.choice(letters) for _ in range(rng.randint(0, 6)))
            piece = ("Ġ" if rng.random() < 0.5 else "") + piece
            vocab.setdefault(piece, len(vocab))
        self.vocab = vocab
        self.base = base

    def get_vocab(self, with_added_tokens: bool = True) -> dict[str, int]:
        return self.vocab

    def get_vocab_size(self, with_added_tokens: bool = True) -> int:
        return len(self.vocab)

    def to_str(self) -> str:
        return self.base.to_str()


def walk(grammars: Grammars, fmt: dict, device: str) -> dict:
    started = time.perf_counter()
    compiled = grammars.compile(formats.spec_text(fmt))
    compile_s = time.perf_counter() - started
    rng = random.Random(1)
    logits = torch.zeros(grammars.vocab_size, device=device)
    constraint = Constraint(compiled, frozenset())
    import xgrammar

    fill, ours, theirs = [], [], []
    for _ in range(STEPS):
        if constraint.ended:
            constraint = Constraint(compiled, frozenset())
        t0 = time.perf_counter()
        constraint._matcher.fill_next_token_bitmask(constraint._bitmask)
        t1 = time.perf_counter()
        row = constraint.mask(logits)  # fills the bitmask again, then unpacks it and masks a copy of the row
        if device == "cuda":
            torch.cuda.synchronize()
        t2 = time.perf_counter()
        copy = logits.clone()  # xgrammar's own kernel, in place on a copy
        xgrammar.apply_token_bitmask_inplace(copy, constraint._bitmask.to(device, non_blocking=True))
        if device == "cuda":
            torch.cuda.synchronize()
        t3 = time.perf_counter()
        choices = torch.isfinite(row).nonzero().flatten().tolist()
        assert torch.equal(torch.isfinite(copy), torch.isfinite(row))
        constraint.accept(rng.choice(choices))
        fill.append(t1 - t0)
        ours.append(t2 - t1 - (t1 - t0))
        theirs.append(t3 - t2)
    return {
        "compile_ms": round(compile_s * 1e3, 2),
        "fill_bitmask_us": round(statistics.median(fill) * 1e6, 1),
        "unpack_and_mask_us": round(statistics.median(ours) * 1e6, 1),
        "xgrammar_apply_us": round(statistics.median(theirs) * 1e6, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    from tokenizers import Tokenizer

    base = Tokenizer.from_file(str(TRAINED / "tokenizer.json"))
    cases = {
        "json_schema": formats.json_format(SCHEMA, "j"),
        "json_object": formats.json_format({"type": "object"}, "j"),
        "regex": {"type": "regex", "pattern": "[a-z]{1,12}( [a-z]{1,12}){0,20}\\."},
        "tool_call": {
            "type": "sequence",
            "elements": [
                {"type": "json_schema", "json_schema": TOOL, "style": "glm_xml"},
                {"type": "const_string", "value": "</tool_call>"},
            ],
        },
    }
    results: dict = {"device": args.device, "torch": torch.__version__, "steps": STEPS, "vocabularies": {}}
    for name, tokenizer in (("demo", base), ("synthetic_glm", SyntheticTokenizer(base, GLM_VOCAB))):
        grammars = Grammars(tokenizer)
        results["vocabularies"][name] = {"size": grammars.vocab_size}
        for case, fmt in cases.items():
            results["vocabularies"][name][case] = walk(grammars, fmt, args.device)
            print(name, case, results["vocabularies"][name][case], flush=True)
    text = json.dumps(results, indent=2)
    if args.out:
        args.out.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
