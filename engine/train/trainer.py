"""Train the demo model on synthetic conversations with transformers' glm5_next (the differentiable reference).

Start: `write_demo(..., size="chat")` (seeded random weights in the real layout), loaded with
`Glm5NextForConditionalGeneration.from_pretrained` in fp32. Loss: cross-entropy on the completion tokens only (what
the assistant writes, through the token that ends its turn). Batches are right-padded, which needs no attention mask
here: every token mixer is causal, so padding after a sequence never reaches it, and padded positions carry no loss.

Reproducible on one machine: one thread, deterministic algorithms, every random draw seeded. KDA runs in chunks of 16
instead of transformers' 64 (the chunked form is exact for any chunk size; the intra-chunk tensors are 4x smaller,
which makes a step ~5x faster on a CPU). The indexer is computed without gradients by transformers, so its weights
stay as drawn; the "chat" preset's index_topk keeps every training conversation in the dense regime.

transformers is a dev dependency; this module imports it only inside `train`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import itertools
import math
import random
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import torch

from engine.checkpoint.demo import write_demo
from engine.checkpoint.tokenizer_build import build_tokenizer
from engine.train import synthetic

PRESET = "chat"
KDA_CHUNK = 16
# The first pools of examples are mostly copying (short, many to a batch): retrieving a token from the prompt is
# what every later skill needs (tool arguments, tool results, answers), and a dense signal makes it emerge early.
COPY_FIRST = (0.08, 0.08, 0.6, 0.04, 0.12, 0.08)
COPY_FIRST_POOLS = 6


@dataclass(frozen=True)
class TrainSettings:
    seed: int = 0
    steps: int = 800
    tokens_per_step: int = 2560  # padded batch area: short conversations come many to a step, long ones few
    lr: float = 5e-3
    warmup: int = 30
    threads: int = 1
    preset: str = PRESET
    mtp_steps: int = 400  # then the MTP layer, the main model frozen (engine/train/mtp.py)
    mtp_lr: float = 3e-3


@dataclass(frozen=True)
class TrainResult:
    model: object  # transformers Glm5NextForConditionalGeneration, trained, fp32
    losses: list[float]
    seconds: float
    tokens: int
    mtp: dict[str, torch.Tensor]  # the trained MTP layer's tensors by checkpoint name (fp32)
    mtp_losses: list[float]


def encode(example: synthetic.Example, tokenizer) -> tuple[list[int], list[int]]:
    """(prompt ids, completion ids), each encoded on its own as serving sees them: the prompt alone, then the
    tokens the model writes."""
    return (tokenizer.encode(synthetic.prompt(example)).ids, tokenizer.encode(synthetic.completion(example)).ids)


def batches(settings: TrainSettings, group: int = 512) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """(ids [B, T], loss mask [B, T]) for each step: fresh examples, grouped by length so that each batch's padded
    area stays within `tokens_per_step`."""
    tokenizer = build_tokenizer()
    rng = random.Random(f"glm5-demo-batches/{settings.seed}")
    for number, start in enumerate(itertools.count(0, group)):
        weights = COPY_FIRST if number < COPY_FIRST_POOLS else synthetic.KIND_WEIGHTS
        pool = [
            encode(e, tokenizer) for e in synthetic.examples("train", settings.seed * 1_000_003 + start, group, weights)
        ]
        pool.sort(key=lambda pc: len(pc[0]) + len(pc[1]))
        chunks: list[list[tuple[list[int], list[int]]]] = [[]]
        for item in pool:
            if chunks[-1] and (len(chunks[-1]) + 1) * (len(item[0]) + len(item[1])) > settings.tokens_per_step:
                chunks.append([])
            chunks[-1].append(item)
        rng.shuffle(chunks)
        for chunk in chunks:
            yield _pad(chunk)


def _pad(chunk: list[tuple[list[int], list[int]]]) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(p) + len(c) for p, c in chunk)
    ids = torch.zeros(len(chunk), width, dtype=torch.long)
    mask = torch.zeros(len(chunk), width, dtype=torch.bool)
    for row, (p, c) in enumerate(chunk):
        ids[row, : len(p) + len(c)] = torch.tensor(p + c)
        mask[row, len(p) : len(p) + len(c)] = True  # position t is scored on predicting ids[t] from ids[:t]
    return ids, mask


@contextlib.contextmanager
def _kda_chunk(size: int) -> Iterator[None]:
    import transformers.models.glm5_next.modeling_glm5_next as modeling

    original = modeling.chunk_kimi_delta_attention
    modeling.chunk_kimi_delta_attention = functools.partial(original, chunk_size=size)
    try:
        yield
    finally:
        modeling.chunk_kimi_delta_attention = original


@contextlib.contextmanager
def _reproducible(threads: int) -> Iterator[None]:
    saved = torch.get_num_threads(), torch.are_deterministic_algorithms_enabled()
    torch.set_num_threads(threads)
    torch.use_deterministic_algorithms(True)
    try:
        yield
    finally:
        torch.set_num_threads(saved[0])
        torch.use_deterministic_algorithms(saved[1])


def _lr(step: int, settings: TrainSettings) -> float:
    """Linear warm-up, then cosine decay to a tenth."""
    if step < settings.warmup:
        return settings.lr * (step + 1) / settings.warmup
    progress = (step - settings.warmup) / max(1, settings.steps - settings.warmup)
    return settings.lr * (0.1 + 0.45 * (1 + math.cos(math.pi * progress)))


def load_start(directory: Path):
    from transformers import Glm5NextForConditionalGeneration
    from transformers.utils import logging

    logging.disable_progress_bar()
    logging.set_verbosity_error()  # the MTP layer's keys are "unexpected" to transformers, by design
    model = Glm5NextForConditionalGeneration.from_pretrained(directory, dtype=torch.float32)
    model.config._attn_implementation = "eager"
    model.model.language_model.config._attn_implementation = "eager"
    return model


def train(
    settings: TrainSettings,
    progress: Callable[[int, float], None] | None = None,
    mtp_progress: Callable[[int, float], None] | None = None,
) -> TrainResult:
    """Train from the preset's seeded start, then its MTP layer on the trained model; `progress(step, loss)` /
    `mtp_progress(step, loss)` after every step."""
    with _reproducible(settings.threads), _kda_chunk(KDA_CHUNK), tempfile.TemporaryDirectory() as start_dir:
        torch.manual_seed(settings.seed)
        write_demo(start_dir, seed=settings.seed, size=settings.preset)
        model = load_start(Path(start_dir)).train()
        with torch.no_grad():  # the demo's LM head is drawn wide (confident random logits); start near uniform
            model.lm_head.weight.mul_(0.1)
        params = [p for n, p in model.named_parameters() if not n.startswith("model.visual.")]
        optimizer = torch.optim.AdamW(params, lr=settings.lr, betas=(0.9, 0.95), weight_decay=0.0)
        losses, tokens, began = [], 0, time.perf_counter()
        for step, (ids, mask) in enumerate(itertools.islice(batches(settings), settings.steps)):
            for group in optimizer.param_groups:
                group["lr"] = _lr(step, settings)
            logits = model(input_ids=ids, use_cache=False).logits[:, :-1]
            loss = torch.nn.functional.cross_entropy(logits[mask[:, 1:]], ids[:, 1:][mask[:, 1:]])
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            optimizer.step()
            losses.append(float(loss.detach()))
            tokens += int(ids.numel())
            if progress:
                progress(step, losses[-1])
        model.eval()
        mtp, mtp_losses = _train_mtp(model, Path(start_dir), settings, mtp_progress)
        return TrainResult(model, losses, time.perf_counter() - began, tokens, mtp, mtp_losses)


def _train_mtp(
    model, start: Path, settings: TrainSettings, progress: Callable[[int, float], None] | None
) -> tuple[dict[str, torch.Tensor], list[float]]:
    """The MTP layer's seeded start from the demo written at `start`, trained on fresh batches (engine/train/mtp.py)."""
    from safetensors.torch import load_file

    from engine.checkpoint.layout import PREFIX
    from engine.models.glm5_next.config import TextConfig
    from engine.train.mtp import train_mtp

    cfg = TextConfig.from_file(start)
    prefix = f"{PREFIX}layers.{cfg.num_hidden_layers}."
    weights: dict[str, torch.Tensor] = {}
    for path in sorted(start.glob("*.safetensors")):
        for name, value in load_file(str(path)).items():
            if name.startswith(prefix):
                weights[name[len(prefix) :]] = value.float().clone()
    if not weights or settings.mtp_steps <= 0:
        return {}, []
    data = batches(dataclasses.replace(settings, seed=settings.seed + 1))
    losses, _ = train_mtp(model, weights, cfg, data, settings.mtp_steps, settings.mtp_lr, progress)
    return {prefix + name: t.detach() for name, t in weights.items()}, losses
