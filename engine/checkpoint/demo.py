"""`python -m engine make-demo DIR [--seed N] [--size tiny|small|...] [--format bf16|exl3]`: a complete GLM-5.3-Flash-architecture checkpoint
with seeded random weights, in the real Hugging Face layout.

The directory loads unchanged with `transformers.Glm5NextForConditionalGeneration.from_pretrained(DIR)` (5.17 and
5.24: DSA layers are written as `full_attention`, which both accept) and with this engine's loader. It holds
config.json, generation_config.json, sharded safetensors + index, a BPE tokenizer trained here
(`tokenizer_build`), and our chat template.

Weights: every tensor draws from its own `torch.Generator`, seeded from (seed, tensor name), so the same seed gives
byte-identical files and adding a tensor never shifts the others. Scales follow a fan-in rule (std 1/sqrt(fan_in))
so every sublayer contributes at a similar size and logits are far from flat; norms are ones, `hc_*_scale` ones,
`hc_*_base` zeros, `A_log` zeros (the gate's lower bound does the scaling), `dt_bias` the inverse softplus of a
log-uniform step as transformers initialises it. Projections are stored in bf16 and the small control tensors in
fp32, as in the released checkpoint.

The MTP layer is written as `layers.{num_hidden_layers}` (transformers reports those keys as unexpected and skips
them; our loader reads them for drafting). A one-block vision tower is written too, so transformers finds every
weight it expects; this engine skips `model.visual.*`.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import shutil
import time
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from engine.checkpoint.layout import TensorSpec, exl3_experts, text_tensors, vision_tensors
from engine.checkpoint.tokenizer_build import EOS_TOKENS, PAD_TOKEN, token_ids, write_tokenizer

# ~1 s to build; 6 heads everywhere so TP=2 and TP=3 split evenly; index_topk 16 so a ~40-token prompt
# already runs the indexer's sparse selection. 16 index heads (as many as the real model's 32 allow cheaply): with
# few heads every head's ReLU is often zero for several pools at once, and such exact ties are resolved
# differently by transformers' whole-prompt and cached paths (see engine/models/glm5_next/dsa.py).
_TINY = dict(
    hidden_size=64,
    kinds="KDKKDK",
    dense_layers=1,
    intermediate_size=128,
    num_attention_heads=6,
    qk_nope_head_dim=16,
    v_head_dim=16,
    q_lora_rank=48,
    kv_lora_rank=32,
    linear_num_heads=6,
    linear_head_dim=16,
    n_routed_experts=8,
    num_experts_per_tok=2,
    moe_intermediate_size=32,
    index_n_heads=16,
    index_head_dim=16,
    index_topk=16,
    index_kpool=4,
    shards=2,
)

SIZES: dict[str, dict[str, Any]] = {
    "tiny": _TINY,
    # The local default's served model: the released 3 x KDA + 1 x DSA pattern, first layer dense.
    "small": dict(
        hidden_size=384,
        kinds="KKKDKKKD",
        dense_layers=1,
        intermediate_size=1024,
        num_attention_heads=6,
        qk_nope_head_dim=64,
        v_head_dim=64,
        q_lora_rank=192,
        kv_lora_rank=128,
        linear_num_heads=6,
        linear_head_dim=64,
        n_routed_experts=32,
        num_experts_per_tok=4,
        moe_intermediate_size=128,
        index_n_heads=16,
        index_head_dim=32,
        index_topk=64,
        index_kpool=4,
        shards=4,
    ),
    # The trained demo's architecture (engine/train: `python -m engine train-demo`): small enough to train on a CPU in
    # minutes and to commit in bf16 (~4 MB). index_topk 1024 keeps every synthetic conversation (< 700 tokens) in the
    # indexer's dense regime: transformers computes the indexer without gradients, so its weights stay as drawn.
    "chat": dict(
        hidden_size=128,
        kinds="KKKD",
        dense_layers=1,
        intermediate_size=192,
        num_attention_heads=6,
        qk_nope_head_dim=16,
        v_head_dim=16,
        q_lora_rank=64,
        kv_lora_rank=32,
        linear_num_heads=6,
        linear_head_dim=16,
        n_routed_experts=8,
        num_experts_per_tok=2,
        moe_intermediate_size=32,
        index_n_heads=16,
        index_head_dim=16,
        index_topk=1024,
        index_kpool=4,
        shards=2,
    ),
    # `--format exl3`'s default: tiny with the 128-multiple widths EXL3 needs (hidden 128; expert width 256 = two
    # Hadamard blocks, so TP=2 splits every expert whole-block).
    "exl3": {**_TINY, "hidden_size": 128, "intermediate_size": 256, "moe_intermediate_size": 256},
}

# config.json's quantization_config for `--format exl3`, laid out as ExLlamaV3's converter writes it (the served
# checkpoint: routed experts 4-bit mcg, everything else bf16). `version` names the converter we read; no calibration.
EXL3_QUANTIZATION = dict(quant_method="exl3", version="1.6.5", bits=4.0, head_bits=16, codebook="mcg")
FORMATS = ("bf16", "exl3")
# `--size trained`: the "chat" preset trained on synthetic GLM-format conversations by `python -m engine train-demo`
# (engine/train; seed 0), committed here in bf16. It answers, thinks and calls tools; the others are random.
TRAINED = Path(__file__).with_name("trained_demo")
VISION = dict(
    depth=1,
    hidden_size=32,
    num_heads=2,
    intermediate_size=64,
    patch_size=14,
    temporal_patch_size=2,
    spatial_merge_size=2,
    in_channels=3,
    image_size=56,
)


def _round_up(n: int, multiple: int = 128) -> int:
    return -(-n // multiple) * multiple


def build_config(size: str, tokenizer_size: int) -> dict[str, Any]:
    """config.json for a preset (top-level `glm5_next` with `text_config` and `vision_config`)."""
    p = dict(SIZES[size])
    kinds, dense = p.pop("kinds"), p.pop("dense_layers")
    p.pop("shards")
    n = len(kinds)
    eos = token_ids(EOS_TOKENS)
    (pad,) = token_ids([PAD_TOKEN])
    img = dict(
        zip(
            (
                "image_start_token_id",
                "image_end_token_id",
                "video_start_token_id",
                "video_end_token_id",
                "image_token_id",
                "video_token_id",
            ),
            token_ids(
                [
                    "<|begin_of_image|>",
                    "<|end_of_image|>",
                    "<|begin_of_video|>",
                    "<|end_of_video|>",
                    "<|image|>",
                    "<|video|>",
                ]
            ),
        )
    )
    text = dict(
        model_type="glm5_next_text",
        vocab_size=_round_up(tokenizer_size),
        num_hidden_layers=n,
        layer_types=["linear_attention" if k == "K" else "full_attention" for k in kinds],
        mlp_layer_types=["dense"] * dense + ["sparse"] * (n - dense),
        first_k_dense_replace=dense,
        indexer_types=["full"] * n,
        num_key_value_heads=p["num_attention_heads"],
        qk_rope_head_dim=0,
        linear_conv_kernel_dim=4,
        linear_lower_bound=-5.0,
        n_shared_experts=1,
        routed_scaling_factor=2.5,
        norm_topk_prob=True,
        n_group=1,
        topk_group=1,
        swiglu_limit=10.0,
        index_kpool_always_select_tail=True,
        hc_mult=4,
        hc_eps=1e-6,
        hc_sinkhorn_iters=20,
        num_nextn_predict_layers=1,
        hidden_act="silu",
        rms_norm_eps=1e-5,
        attention_bias=False,
        max_position_embeddings=131072,
        tie_word_embeddings=False,
        eos_token_id=eos,
        pad_token_id=pad,
        bos_token_id=None,
        dtype="bfloat16",
        use_cache=True,
        **p,
    )
    vision = dict(
        model_type="glm5_next_vision",
        out_hidden_size=p["hidden_size"],
        projection_intermediate_size=2 * p["hidden_size"],
        hidden_act="silu",
        attention_bias=True,
        rms_norm_eps=1e-5,
        swiglu_limit=10.0,
        **VISION,
    )
    return dict(
        architectures=["Glm5NextForConditionalGeneration"],
        model_type="glm5_next",
        text_config=dict(sorted(text.items())),
        vision_config=dict(sorted(vision.items())),
        tie_word_embeddings=False,
        dtype="bfloat16",
        eos_token_id=eos,
        pad_token_id=pad,
        **img,
    )


def _generator(seed: int, name: str) -> torch.Generator:
    digest = hashlib.sha256(f"glm5-demo/{seed}/{name}".encode()).digest()
    return torch.Generator().manual_seed(int.from_bytes(digest[:8], "little") & (2**63 - 1))


def init_tensor(spec: TensorSpec, seed: int) -> torch.Tensor:
    """One tensor's seeded initial value, already in its stored dtype."""
    name, shape, gen = spec.name, spec.shape, _generator(seed, spec.name)
    if spec.dtype:
        return _init_exl3_part(spec, gen)
    leaf = name.rsplit(".", 2)[-2] if name.endswith((".weight", ".bias")) else name.rsplit(".", 1)[-1]
    if name.endswith(".bias") or leaf.endswith(("_base", "A_log")):
        value = torch.zeros(shape)
    elif (name.endswith(".weight") and ("norm" in leaf)) or leaf.endswith("_scale"):
        value = torch.ones(shape)
    elif leaf == "dt_bias":  # inverse softplus of a step drawn log-uniformly in [1e-3, 1e-1]
        u = torch.rand(shape, generator=gen)
        dt = torch.exp(math.log(1e-3) + u * (math.log(1e-1) - math.log(1e-3))).clamp_min(1e-4)
        value = dt + torch.log(-torch.expm1(-dt))
    elif leaf == "e_score_correction_bias":
        value = 0.01 * torch.randn(shape, generator=gen)
    elif leaf == "index_kpool_compress_ape":
        value = 0.02 * torch.randn(shape, generator=gen)
    elif leaf == "embed_tokens":
        value = torch.randn(shape, generator=gen)
    elif name == "lm_head.weight":  # logits with a spread like a trained model's (std ~3), so few near-ties
        value = 3.0 * torch.randn(shape, generator=gen) / math.sqrt(shape[1])
    else:  # projections, convolutions, router, LM head: fan-in scaling
        fan_in = math.prod(shape[1:]) if len(shape) > 1 else shape[0]
        value = torch.randn(shape, generator=gen) / math.sqrt(fan_in)
    return value.to(torch.float32 if spec.fp32 else torch.bfloat16).contiguous()


def _init_exl3_part(spec: TensorSpec, gen: torch.Generator) -> torch.Tensor:
    """Random trellis bits (any bitstream is a valid encoding), the mcg marker, random-sign scales: suh carries
    1/(1.2437 sqrt(K)) so W has the fan-in std 1/sqrt(K) (the mcg codebook's std is 1.2437; the rotations keep it)."""
    part = spec.name.rsplit(".", 1)[1]
    if part == "trellis":
        return torch.randint(-32768, 32768, spec.shape, generator=gen, dtype=torch.int32).to(torch.int16)
    if part == "mcg":
        return torch.tensor(0xCBAC1FED - 2**32, dtype=torch.int32)
    sign = torch.randint(0, 2, spec.shape, generator=gen) * 2.0 - 1.0
    magnitude = 1 / (1.2437 * math.sqrt(spec.shape[0])) if part == "suh" else 1.0
    return (sign * magnitude).half()


def _shard_plan(specs: list[TensorSpec], shards: int) -> list[list[TensorSpec]]:
    """Contiguous runs of tensors with roughly equal bytes (checkpoint order kept)."""
    total = sum(s.nbytes for s in specs)
    groups: list[list[TensorSpec]] = [[] for _ in range(shards)]
    done = 0
    for spec in specs:
        index = min(shards - 1, done * shards // max(total, 1))
        groups[index].append(spec)
        done += spec.nbytes
    return [g for g in groups if g]


def _write_json(path: Path, value: Any) -> None:
    path.write_text(json.dumps(value, indent=2) + "\n")


def write_demo(path: str | Path, seed: int = 0, size: str = "tiny", fmt: str = "bf16") -> Path:
    """Write the demo checkpoint to `path` (created if missing) and return it; `trained` copies the committed
    trained checkpoint (the seed does not apply). `fmt` exl3 stores the routed experts as 4-bit mcg EXL3 groups."""
    if size not in (*SIZES, "trained"):
        raise ValueError(f"size {size!r} is not one of {sorted(SIZES) + ['trained']}")
    if fmt not in FORMATS:
        raise ValueError(f"format {fmt!r} is not one of {list(FORMATS)}")
    widths = ("hidden_size", "moe_intermediate_size")
    if fmt == "exl3" and (size == "trained" or any(SIZES[size][k] % 128 for k in widths)):
        raise ValueError(
            f"--format exl3 needs hidden and expert widths that are multiples of 128; size {size!r} "
            f"has not: use --size exl3 or small"
        )
    out = Path(path)
    out.mkdir(parents=True, exist_ok=True)
    if size == "trained":
        shutil.copytree(TRAINED, out, dirs_exist_ok=True)
        return out
    tokenizer_size = write_tokenizer(out, model_max_length=131072)
    config = build_config(size, tokenizer_size)
    if fmt == "exl3":
        config["quantization_config"] = dict(EXL3_QUANTIZATION)
    _write_json(out / "config.json", config)
    text = config["text_config"]
    _write_json(
        out / "generation_config.json",
        dict(
            do_sample=True,
            temperature=1.0,
            top_p=0.95,
            eos_token_id=text["eos_token_id"],
            pad_token_id=text["pad_token_id"],
        ),
    )
    specs = text_tensors(config) + vision_tensors(config)
    if fmt == "exl3":
        specs = exl3_experts(specs)
    groups = _shard_plan(specs, SIZES[size]["shards"])
    weight_map: dict[str, str] = {}
    for number, group in enumerate(groups, start=1):
        filename = f"model-{number:05d}-of-{len(groups):05d}.safetensors"
        save_file({s.name: init_tensor(s, seed) for s in group}, str(out / filename), metadata={"format": "pt"})
        (out / filename).chmod(0o644)
        weight_map.update({s.name: filename for s in group})
    total_size = sum(s.nbytes for s in specs)
    _write_json(
        out / "model.safetensors.index.json",
        {
            "metadata": {"total_size": total_size, "total_parameters": sum(s.numel for s in specs)},
            "weight_map": dict(sorted(weight_map.items())),
        },
    )
    return out


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("directory", type=Path, help="where to write the checkpoint (created if missing)")
    parser.add_argument("--seed", type=int, default=0, help="weights seed; the same seed gives byte-identical files")
    parser.add_argument(
        "--size",
        choices=sorted(SIZES) + ["trained"],
        default="tiny",
        help="tiny: for tests (~1 s); small: the local default's served model; chat: the trained "
        "model's architecture, random; trained: the committed chat model trained by train-demo; "
        "exl3: tiny with the 128-multiple widths --format exl3 needs",
    )
    parser.add_argument(
        "--format",
        dest="fmt",
        choices=FORMATS,
        default="bf16",
        help="exl3: routed experts stored as 4-bit mcg EXL3 groups (random trellis), as the served "
        "checkpoint stores them; needs --size exl3 or small",
    )


def run(args: argparse.Namespace) -> int:
    start = time.perf_counter()
    out = write_demo(args.directory, seed=args.seed, size=args.size, fmt=args.fmt)
    on_disk = sum(f.stat().st_size for f in out.iterdir() if f.is_file())
    print(
        f"wrote the {args.size} {args.fmt} demo checkpoint (seed {args.seed}) to {out}: "
        f"{on_disk / 1e6:.1f} MB in {time.perf_counter() - start:.1f} s"
    )
    return 0
