"""`python -m engine quality CHECKPOINT [--mode K=V,...]... [--text FILE] [--tokens N] [--continuation N]`: what each
precision mode costs in quality, against the exact mode, on one text.

A mode is a set of choices: `weights` (the element type the weights load in: fp32 | bf16), `dense` (how the dense,
non-expert weights are kept — DENSE: bf16 is as loaded, q4 and fp8 quantised at load, engine/quant/dense.py), `kv`
(the cached attention rows: fp32 | bf16 | fp8) and `kda` (a prompt's linear-attention form: steps — token by token,
as decode steps compute it — | chunked — the served default, fla-core's kernel on a GPU where installed). The
reference (the exact mode) is the device's own weights (fp32 on the CPU, bf16 as stored on a GPU) kept as loaded,
fp32 cache rows on the CPU (bf16 on a GPU) and token-by-token KDA; `--reference` changes it.

For each mode, against the reference, over the text's first N tokens fed as one prompt (teacher forcing, in prefill
chunks of --chunk):
- the KL divergence of the next-token distributions, KL(reference ‖ mode), mean and 99th percentile over positions;
- top-1 agreement: the share of positions whose most likely next token is the same;
- greedy continuation: from the text's first --prompt-tokens tokens, --continuation greedy tokens; how many leading
  tokens equal the reference's.
Printed as a table; `--out FILE` writes the JSON.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

CHOICES = {
    "weights": ("fp32", "bf16"),
    "dense": ("bf16", "q4", "fp8"),
    "kv": ("fp32", "bf16", "fp8"),
    "kda": ("steps", "chunked"),
}
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
DEFAULT_TEXT = Path(__file__).parent / "checkpoint" / "tokenizer_corpus.txt"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("checkpoint", help="checkpoint directory")
    p.add_argument(
        "--mode",
        action="append",
        default=None,
        help="a mode to measure, e.g. kv=fp8 or dense=q4,kv=fp8,kda=chunked (repeatable; default: the served "
        "choices one at a time — dense=q4, dense=fp8, kv=bf16, kv=fp8, kda=chunked, and weights=bf16 on the CPU — "
        "then the reference recipe's defaults together, dense=q4,kv=fp8,kda=chunked)",
    )
    p.add_argument("--reference", default="", help="the exact mode's choices, over the device's defaults")
    p.add_argument("--text", type=Path, default=DEFAULT_TEXT, help="the text to teacher-force (UTF-8)")
    p.add_argument("--tokens", type=int, default=512, help="tokens of the text fed as one prompt")
    p.add_argument("--chunk", type=int, default=128, help="prefill chunk")
    p.add_argument("--prompt-tokens", type=int, default=32, help="prompt of the greedy continuation")
    p.add_argument("--continuation", type=int, default=48, help="greedy tokens compared")
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    p.add_argument("--out", type=Path, help="write the results as JSON")


def parse_mode(text: str, base: dict[str, str]) -> dict[str, str]:
    """`k=v,k=v` over `base`; ValueError naming the bad part."""
    mode = dict(base)
    for part in filter(None, (p.strip() for p in text.split(","))):
        key, _, value = part.partition("=")
        if key not in CHOICES or value not in CHOICES[key]:
            options = "; ".join(f"{k}: {'|'.join(v)}" for k, v in CHOICES.items())
            raise ValueError(f"mode part {part!r} is not one of {options}")
        mode[key] = value
    return mode


def label(mode: dict[str, str]) -> str:
    return ",".join(f"{k}={mode[k]}" for k in CHOICES)


class Runner:
    """Loads the checkpoint once per (weights, dense, kda) and runs a mode's teacher-forced logits and greedy tokens."""

    def __init__(self, checkpoint: str, device: str, factory: Callable[[dict[str, str]], Any] | None = None) -> None:
        from engine.parallel import ParallelGroup

        self.checkpoint, self.group, self.factory = checkpoint, ParallelGroup.single(device), factory
        self._models: dict[tuple[str, str, str], Any] = {}

    def model(self, mode: dict[str, str]) -> Any:
        from engine.models.glm5_next.model import Glm5NextForCausalLM

        key = (mode["weights"], mode["dense"], mode["kda"])
        if key not in self._models:
            self._models.clear()  # one model in memory at a time
            if self.device_type == "cuda":
                torch.cuda.empty_cache()
            self._models[key] = (
                self.factory(mode)
                if self.factory is not None
                else Glm5NextForCausalLM.load(
                    self.checkpoint,
                    self.group,
                    dtype=DTYPES[mode["weights"]],
                    kda_chunked=mode["kda"] == "chunked",
                    dense=mode["dense"],
                )
            )
        return self._models[key]

    @property
    def device_type(self) -> str:
        return self.group.device.type

    @torch.inference_mode()
    def logprobs(self, mode: dict[str, str], ids: list[int], chunk: int) -> torch.Tensor:
        """[T, vocab] fp32 log-probabilities of each position's next token."""
        model = self.model(mode)
        seq = model.new_sequence(model.make_pool(len(ids) + 1, mode["kv"]))
        rows = [model.prefill(seq, ids[i : i + chunk], all_logits=True) for i in range(0, len(ids), chunk)]
        return torch.log_softmax(torch.cat([r.reshape(-1, r.shape[-1]) for r in rows]).float(), dim=-1)

    @torch.inference_mode()
    def greedy(self, mode: dict[str, str], prompt: list[int], steps: int, chunk: int) -> list[int]:
        model = self.model(mode)
        seq = model.new_sequence(model.make_pool(len(prompt) + steps + 1, mode["kv"]))
        for i in range(0, len(prompt), chunk):
            logits = model.prefill(seq, prompt[i : i + chunk])
        tokens: list[int] = []
        for _ in range(steps):
            tokens.append(int(torch.argmax(logits.reshape(-1))))
            logits = model.decode([seq], [tokens[-1]])[0]
        return tokens


def compare(reference: torch.Tensor, other: torch.Tensor) -> dict[str, float]:
    """KL(reference ‖ other) per position (mean, p99) and top-1 agreement, in float64."""
    ref, oth = reference.double(), other.double()
    kl = (ref.exp() * (ref - oth)).sum(-1).clamp_min(0.0)
    return {
        "kl_mean": float(kl.mean()),
        "kl_p99": float(torch.quantile(kl, 0.99)),
        "top1_agreement": float((ref.argmax(-1) == oth.argmax(-1)).double().mean()),
    }


def same_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def measure(
    args: argparse.Namespace, device: str, ids: list[int], factory: Callable[[dict[str, str]], Any] | None = None
) -> dict[str, Any]:
    """The results for args' modes (`factory`: builds a mode's model instead of loading args.checkpoint: the
    full-width random configs of bench/quality_full_width.py)."""
    base = {"weights": "fp32" if device == "cpu" else "bf16", "kv": "fp32" if device == "cpu" else "bf16"}
    reference = parse_mode(args.reference, {**base, "dense": "bf16", "kda": "steps"})
    default_modes = (
        ["dense=q4", "dense=fp8", "kv=bf16", "kv=fp8", "kda=chunked"]
        + (["weights=bf16"] if device == "cpu" else [])
        + ["dense=q4,kv=fp8,kda=chunked"]
    )
    modes = [parse_mode(m, reference) for m in (args.mode or default_modes)]
    runner = Runner(args.checkpoint, device, factory)
    prompt = ids[: args.prompt_tokens]
    ref_logprobs = runner.logprobs(reference, ids, args.chunk)
    ref_tokens = runner.greedy(reference, prompt, args.continuation, args.chunk)
    rows = []
    for mode in modes:
        scores = compare(ref_logprobs, runner.logprobs(mode, ids, args.chunk))
        tokens = runner.greedy(mode, prompt, args.continuation, args.chunk)
        rows.append({"mode": label(mode), **scores, "greedy_same": same_prefix(ref_tokens, tokens)})
    return {
        "checkpoint": str(args.checkpoint),
        "device": device,
        "reference": label(reference),
        "tokens": len(ids),
        "chunk": args.chunk,
        "prompt_tokens": len(prompt),
        "continuation": args.continuation,
        "modes": rows,
    }


def table(result: dict[str, Any]) -> str:
    lines = [
        f"reference: {result['reference']} · {result['tokens']} tokens teacher-forced on {result['device']} · "
        f"greedy: {result['continuation']} tokens after {result['prompt_tokens']}",
        f"{'mode':<46} {'KL mean':>10} {'KL p99':>10} {'top-1':>7} {'greedy same':>12}",
    ]
    for row in result["modes"]:
        lines.append(
            f"{row['mode']:<46} {row['kl_mean']:>10.2e} {row['kl_p99']:>10.2e} {row['top1_agreement']:>7.1%} "
            f"{row['greedy_same']:>5} / {result['continuation']:<4}"
        )
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    from tokenizers import Tokenizer

    device = args.device if args.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    try:
        for text in [args.reference, *(args.mode or [])]:
            parse_mode(text, {})
    except ValueError as error:
        print(f"error: {error}")
        return 2
    tokenizer = Tokenizer.from_file(str(Path(args.checkpoint, "tokenizer.json")))
    ids = tokenizer.encode(args.text.read_text()).ids[: args.tokens]
    if len(ids) <= args.prompt_tokens:
        print(f"error: {args.text} gives {len(ids)} tokens; --prompt-tokens {args.prompt_tokens} needs more")
        return 2
    result = measure(args, device, ids)
    print(table(result))
    if args.out:
        args.out.write_text(json.dumps(result, indent=2))
    return 0
