"""Tiny random GLM-5.3-Flash checkpoints built with transformers (the numerical reference), for parity tests.

transformers' own init is too gentle for a useful test (every logit near zero, greedy ties everywhere), so every
weight is redrawn with a seeded generator at a scale that gives clear logit margins. The indexer gets 16 heads: a
pool scores exactly zero only when every head's ReLU is zero, and such exact ties are broken arbitrarily by the
reference (see engine/models/glm5_next/dsa.py), so the parity configs keep them improbable.
"""

from __future__ import annotations

import math
from pathlib import Path

import torch

TINY_BASE = dict(
    vocab_size=97,
    hidden_size=48,
    intermediate_size=80,
    moe_intermediate_size=24,
    num_attention_heads=6,
    num_key_value_heads=6,
    kv_lora_rank=16,
    q_lora_rank=20,
    qk_nope_head_dim=12,
    v_head_dim=10,
    index_topk=8,
    index_head_dim=8,
    index_n_heads=16,
    index_kpool=4,
    linear_head_dim=8,
    linear_num_heads=6,
    n_routed_experts=8,
    num_experts_per_tok=2,
    pad_token_id=0,
    rms_norm_eps=1e-5,
)

CONFIGS = {
    # 3 KDA + 1 DSA, one dense layer, 8 experts top-2
    "kda3_dsa1": dict(
        num_hidden_layers=4,
        layer_types=["linear_attention"] * 3 + ["full_attention"],
        mlp_layer_types=["dense", "sparse", "sparse", "sparse"],
    ),
    # DSA first, two DSA layers, 6 experts top-3
    "dsa_heavy": dict(
        num_hidden_layers=4,
        n_routed_experts=6,
        num_experts_per_tok=3,
        layer_types=["full_attention", "linear_attention", "full_attention", "linear_attention"],
        mlp_layer_types=["dense", "dense", "sparse", "sparse"],
    ),
    # every dense weight's input a multiple of 64 at TP=1 and TP=2 (DENSE=q4 groups of 64 apply to all of them):
    # hidden 128, 4 MLA heads of v 32, 8 KDA heads of 16 (f_b / g_b, 16 inputs wide, stay as loaded), MLP and expert
    # widths 128; K K D K, one dense MLP. (2 KDA heads of 64 would give b_proj 2 outputs: MKL's product of a
    # [8, 128] block with a [2, 128] weight gives a row other bits at another place in the block.)
    "grouped64": dict(
        num_hidden_layers=4,
        hidden_size=128,
        intermediate_size=128,
        moe_intermediate_size=128,
        num_attention_heads=4,
        num_key_value_heads=4,
        q_lora_rank=64,
        kv_lora_rank=32,
        qk_nope_head_dim=16,
        v_head_dim=32,
        linear_head_dim=16,
        linear_num_heads=8,
        layer_types=["linear_attention", "linear_attention", "full_attention", "linear_attention"],
        mlp_layer_types=["dense", "sparse", "sparse", "sparse"],
    ),
    # 16 experts top-4, larger pool budget, KDA-heavy
    "moe16": dict(
        num_hidden_layers=5,
        n_routed_experts=16,
        num_experts_per_tok=4,
        index_topk=12,
        layer_types=["linear_attention", "linear_attention", "full_attention", "linear_attention", "full_attention"],
        mlp_layer_types=["dense", "sparse", "sparse", "sparse", "sparse"],
    ),
}


def _redraw(model: torch.nn.Module, seed: int, visual: bool = False) -> None:
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "visual" in name and not visual:
                continue
            if name.endswith("A_log"):
                param.copy_(torch.randn(param.shape, generator=gen) * 0.5)
            elif name.endswith("dt_bias") or name.endswith("e_score_correction_bias") or name.endswith("base"):
                param.copy_(torch.randn(param.shape, generator=gen) * 0.5)
            elif name.endswith("scale") and "hc" in name:
                param.copy_(1 + torch.randn(param.shape, generator=gen) * 0.3)
            elif param.dim() == 1:  # norms
                param.copy_(1 + torch.randn(param.shape, generator=gen) * 0.2)
            else:
                fan_in = param.shape[-1]
                param.copy_(torch.randn(param.shape, generator=gen) * (1.5 / math.sqrt(fan_in)))


# image markup ids inside the tiny vocab (the defaults are the real tokenizer's, past 97)
IMAGE_IDS = dict(
    image_token_id=90,
    image_start_token_id=91,
    image_end_token_id=92,
    video_start_token_id=93,
    video_end_token_id=94,
    video_token_id=95,
)


def make_reference(path: Path, name: str, seed: int = 0, vision: dict | None = None, **overrides):
    """Write a checkpoint for CONFIGS[name] (text config `overrides` on top) to `path`; return the transformers model
    (fp32, eval). `vision`: vision config fields on top of the tiny tower's; given, the tower's weights are redrawn
    too and the image markup ids are IMAGE_IDS."""
    from transformers import Glm5NextConfig, Glm5NextForConditionalGeneration

    text = dict(TINY_BASE, **CONFIGS[name]) | overrides
    tower = dict(
        depth=1,
        hidden_size=16,
        num_heads=2,
        intermediate_size=16,
        out_hidden_size=text["hidden_size"],
        projection_intermediate_size=16,
    ) | (vision or {})
    config = Glm5NextConfig(text_config=text, vision_config=tower, **(IMAGE_IDS if vision is not None else {}))
    torch.manual_seed(seed)
    model = Glm5NextForConditionalGeneration(config).eval()
    _redraw(model, seed, visual=vision is not None)
    model.save_pretrained(path)
    model.config._attn_implementation = "eager"
    model.model.language_model.config._attn_implementation = "eager"
    return model
