"""The checkpoint's tensors, named as transformers 5.24 saves them, and how tensor parallelism splits each one.

`text_tensors(cfg)` lists every text-tower tensor (MTP layers included) with its shape and whether it is one of
the small control tensors kept in fp32; the demo writer and `info --config-only` both build on it. `split_of`
gives the TP plan for a tensor name, so `info` applies the same plan to any checkpoint's safetensors headers:

- column-parallel (dim 0): KDA q/k/v_proj, their conv1d, f_b_proj, dt_bias, g_b_proj (in heads of
  linear_head_dim rows), A_log and b_proj (one row per head); MLA q_b_proj and kv_b_proj (in heads); dense, expert
  and shared-expert gate/up (in rows);
- row-parallel (dim 1): o_proj (KDA and MLA, in heads) and every down_proj (in channels);
- vocab-parallel (dim 0): embed_tokens and lm_head;
- replicated: norms, hc_*, the router, the indexer, f_a/g_a, q_a, kv_a, the MTP glue.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

PREFIX = "model.language_model."
_LAYER = re.compile(r"^model\.language_model\.layers\.(\d+)\.(.+)$")
KDA_TYPES = {"linear_attention"}


@dataclass(frozen=True)
class TensorSpec:
    name: str
    shape: tuple[int, ...]
    fp32: bool = False  # a small control tensor the real checkpoint stores in fp32
    dtype: str | None = None  # another stored dtype (EXL3 parts: int16, float16, int32); None: bf16 / fp32

    @property
    def nbytes(self) -> int:
        return self.numel * {"int16": 2, "float16": 2, "int32": 4}.get(self.dtype or "", 4 if self.fp32 else 2)

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


@dataclass(frozen=True)
class Split:
    """How one tensor is divided: along `dim` in `shape[dim] // unit` units (None: replicated)."""

    dim: int | None
    unit: int = 1
    kind: str = "replicated"  # column | row | vocab | replicated


REPLICATED = Split(None)

# The small control tensors the released checkpoint stores in fp32 (the specs marked `fp32` below), which
# transformers keeps in fp32 whatever the load dtype (`_keep_in_fp32_modules_strict`): the routers and their
# correction bias, KDA's conv taps, dt_bias and A_log, the hyper-connections' base and scale.
_KEPT_FP32 = re.compile(
    r"\.(mlp\.gate\.(weight|e_score_correction_bias)|self_attn\.([qkv]_conv1d\.weight|dt_bias|A_log)"
    r"|hc_(attn|ffn)_(base|scale))$"
)


def kept_fp32(name: str) -> bool:
    """Whether tensor `name` loads as fp32 on every device (a bf16 load would round the values the reference uses:
    a router's correction bias rounded to bf16 can change which experts a token picks)."""
    return _KEPT_FP32.search(name) is not None


def text_config(raw: dict[str, Any]) -> dict[str, Any]:
    """The text tower's fields (nested `text_config` or a flat config), `linear_attn_config` folded in."""
    text = dict(raw.get("text_config") or raw)
    linear = text.get("linear_attn_config") or {}
    for src, dst in (
        ("head_dim", "linear_head_dim"),
        ("num_heads", "linear_num_heads"),
        ("short_conv_kernel_size", "linear_conv_kernel_dim"),
    ):
        if src in linear:
            text.setdefault(dst, linear[src])
    return text


def _layer_type(cfg: dict[str, Any], index: int) -> str:
    types = cfg.get("layer_types") or []
    if index < len(types) and index < cfg["num_hidden_layers"]:
        return types[index]
    return "mtp" if index >= cfg["num_hidden_layers"] else ("linear_attention" if index % 4 != 3 else "dsa")


def _mlp_type(cfg: dict[str, Any], index: int) -> str:
    types = cfg.get("mlp_layer_types") or []
    if index < len(types) and index < cfg["num_hidden_layers"]:
        return types[index]
    if index >= cfg["num_hidden_layers"]:
        return "sparse"
    return "dense" if index < cfg.get("first_k_dense_replace", 3) else "sparse"


def _kda(cfg: dict[str, Any]) -> list[TensorSpec]:
    h, d, k, hidden = cfg["linear_num_heads"], cfg["linear_head_dim"], cfg["linear_conv_kernel_dim"], cfg["hidden_size"]
    out = [TensorSpec(f"self_attn.{p}_proj.weight", (h * d, hidden)) for p in "qkv"]
    out += [TensorSpec(f"self_attn.{p}_conv1d.weight", (h * d, 1, k), fp32=True) for p in "qkv"]
    return out + [
        TensorSpec("self_attn.f_a_proj.weight", (d, hidden)),
        TensorSpec("self_attn.f_b_proj.weight", (h * d, d)),
        TensorSpec("self_attn.dt_bias", (h * d,), fp32=True),
        TensorSpec("self_attn.A_log", (h,), fp32=True),
        TensorSpec("self_attn.b_proj.weight", (h, hidden)),
        TensorSpec("self_attn.g_a_proj.weight", (d, hidden)),
        TensorSpec("self_attn.g_b_proj.weight", (h * d, d)),
        TensorSpec("self_attn.o_norm.weight", (d,)),
        TensorSpec("self_attn.o_proj.weight", (hidden, h * d)),
    ]


def _mla(cfg: dict[str, Any]) -> list[TensorSpec]:
    hidden, heads, ql, kvl = cfg["hidden_size"], cfg["num_attention_heads"], cfg["q_lora_rank"], cfg["kv_lora_rank"]
    nope, v = cfg["qk_nope_head_dim"] + cfg.get("qk_rope_head_dim", 0), cfg["v_head_dim"]
    ih, idim, pool = cfg["index_n_heads"], cfg["index_head_dim"], cfg["index_kpool"]
    a = "self_attn."
    return [
        TensorSpec(a + "q_a_proj.weight", (ql, hidden)),
        TensorSpec(a + "q_a_layernorm.weight", (ql,)),
        TensorSpec(a + "q_b_proj.weight", (heads * nope, ql)),
        TensorSpec(a + "kv_a_proj_with_mqa.weight", (kvl, hidden)),
        TensorSpec(a + "kv_a_layernorm.weight", (kvl,)),
        TensorSpec(a + "kv_b_proj.weight", (heads * (nope + v), kvl)),
        TensorSpec(a + "o_proj.weight", (hidden, heads * v)),
        TensorSpec(a + "indexer.wq_b.weight", (ih * idim, ql)),
        TensorSpec(a + "indexer.wk.weight", (idim, hidden)),
        TensorSpec(a + "indexer.k_norm.weight", (idim,)),
        TensorSpec(a + "indexer.k_norm.bias", (idim,)),
        TensorSpec(a + "indexer.weights_proj.weight", (ih, hidden)),
        TensorSpec(a + "indexer.index_kpool_compress_ape", (pool, idim)),
        TensorSpec(a + "indexer.index_kpool_compress_gate", (idim, hidden)),
    ]


def _swiglu(prefix: str, width: int, hidden: int) -> list[TensorSpec]:
    return [
        TensorSpec(prefix + "gate_proj.weight", (width, hidden)),
        TensorSpec(prefix + "up_proj.weight", (width, hidden)),
        TensorSpec(prefix + "down_proj.weight", (hidden, width)),
    ]


def _mlp(cfg: dict[str, Any], kind: str) -> list[TensorSpec]:
    hidden = cfg["hidden_size"]
    if kind == "dense":
        return _swiglu("mlp.", cfg["intermediate_size"], hidden)
    experts, width = cfg["n_routed_experts"], cfg["moe_intermediate_size"]
    out = [
        TensorSpec("mlp.gate.weight", (experts, hidden), fp32=True),
        TensorSpec("mlp.gate.e_score_correction_bias", (experts,), fp32=True),
    ]
    for e in range(experts):
        out += _swiglu(f"mlp.experts.{e}.", width, hidden)
    return out + _swiglu("mlp.shared_experts.", width * cfg.get("n_shared_experts", 1), hidden)


def _hc(cfg: dict[str, Any]) -> list[TensorSpec]:
    hc, hidden = cfg.get("hc_mult", 4), cfg["hidden_size"]
    out = []
    for part in ("attn", "ffn"):
        out += [
            TensorSpec(f"hc_{part}_fn", ((2 + hc) * hc, hc * hidden)),
            TensorSpec(f"hc_{part}_base", ((2 + hc) * hc,), fp32=True),
            TensorSpec(f"hc_{part}_scale", (3,), fp32=True),
        ]
    return out


def layer_tensors(cfg: dict[str, Any], index: int) -> list[TensorSpec]:
    hidden, kind = cfg["hidden_size"], _layer_type(cfg, index)
    norms = [TensorSpec("input_layernorm.weight", (hidden,)), TensorSpec("post_attention_layernorm.weight", (hidden,))]
    if kind == "mtp":  # DeepSeek-V3-style draft layer: no hyper-connections, MLA + MoE, shared embedding and head
        glue = [
            TensorSpec("enorm.weight", (hidden,)),
            TensorSpec("hnorm.weight", (hidden,)),
            TensorSpec("eh_proj.weight", (hidden, 2 * hidden)),
            TensorSpec("shared_head.norm.weight", (hidden,)),
        ]
        body = glue + norms + _mla(cfg) + _mlp(cfg, "sparse")
    else:
        attention = _kda(cfg) if kind in KDA_TYPES else _mla(cfg)
        body = norms + _hc(cfg) + attention + _mlp(cfg, _mlp_type(cfg, index))
    return [TensorSpec(f"{PREFIX}layers.{index}.{t.name}", t.shape, t.fp32) for t in body]


def text_tensors(raw: dict[str, Any]) -> list[TensorSpec]:
    """Every text-tower tensor in checkpoint order: embeddings, layers (MTP last), final norm, LM head."""
    cfg = text_config(raw)
    vocab, hidden = cfg["vocab_size"], cfg["hidden_size"]
    layers = cfg["num_hidden_layers"] + int(cfg.get("num_nextn_predict_layers", 0))
    out = [TensorSpec(PREFIX + "embed_tokens.weight", (vocab, hidden))]
    for i in range(layers):
        out += layer_tensors(cfg, i)
    return out + [TensorSpec(PREFIX + "norm.weight", (hidden,)), TensorSpec("lm_head.weight", (vocab, hidden))]


_ROUTED_PROJECTION = re.compile(r"\.mlp\.experts\.\d+\.(gate|up|down)_proj\.weight$")


def exl3_experts(specs: list[TensorSpec], bits: int = 4) -> list[TensorSpec]:
    """`specs` with every routed expert's projection as an EXL3 group, the way the served checkpoint stores them
    (4-bit mcg routed experts, everything else bf16): weight [out, in] -> trellis int16 [in/16, out/16, 16*bits],
    suh fp16 [in], svh fp16 [out], mcg int32 [] (engine/quant/exl3.py)."""
    out = []
    for spec in specs:
        if not _ROUTED_PROJECTION.search(spec.name):
            out.append(spec)
            continue
        prefix, (n, k) = spec.name[: -len(".weight")], spec.shape
        out += [
            TensorSpec(prefix + ".trellis", (k // 16, n // 16, 16 * bits), dtype="int16"),
            TensorSpec(prefix + ".suh", (k,), dtype="float16"),
            TensorSpec(prefix + ".svh", (n,), dtype="float16"),
            TensorSpec(prefix + ".mcg", (), dtype="int32"),
        ]
    return out


def split_of(name: str, raw: dict[str, Any]) -> Split:
    """The TP plan for one tensor name (see the module docstring)."""
    cfg = text_config(raw)
    if name in (PREFIX + "embed_tokens.weight", "lm_head.weight"):
        return Split(0, 1, "vocab")
    match = _LAYER.match(name)
    if not match:
        return REPLICATED
    rest, kda = match.group(2), _layer_type(cfg, int(match.group(1))) in KDA_TYPES
    d = cfg.get("linear_head_dim", 128)
    exl3 = re.fullmatch(r"mlp\..*(gate|up|down)_proj\.(trellis|suh|svh)", rest)
    if exl3:  # whole 128-wide Hadamard blocks: 8 tiles of 16 in the trellis (engine/checkpoint/exl3.py)
        column, part = exl3.group(1) != "down", exl3.group(2)
        if part == "trellis":
            return Split(1 if column else 0, 8, "column" if column else "row")
        if part == ("svh" if column else "suh"):
            return Split(0, 128, "column" if column else "row")
        return REPLICATED
    if rest.startswith("mlp.") and rest.endswith(("gate_proj.weight", "up_proj.weight")):
        return Split(0, 1, "column")
    if rest.startswith("mlp.") and rest.endswith("down_proj.weight"):
        return Split(1, 1, "row")
    if kda:
        if re.fullmatch(r"self_attn\.([qkv]_proj|[qkv]_conv1d|f_b_proj|g_b_proj)\.weight|self_attn\.dt_bias", rest):
            return Split(0, d, "column")
        if rest in ("self_attn.A_log", "self_attn.b_proj.weight"):
            return Split(0, 1, "column")
        if rest == "self_attn.o_proj.weight":
            return Split(1, d, "row")
        return REPLICATED
    qk = cfg.get("qk_nope_head_dim", 256) + cfg.get("qk_rope_head_dim", 0)
    if rest == "self_attn.q_b_proj.weight":
        return Split(0, qk, "column")
    if rest == "self_attn.kv_b_proj.weight":
        return Split(0, qk + cfg.get("v_head_dim", 256), "column")
    if rest == "self_attn.o_proj.weight":
        return Split(1, cfg.get("v_head_dim", 256), "row")
    return REPLICATED


def vision_tensors(config: dict[str, Any]) -> list[TensorSpec]:
    """The vision tower's tensors (`model.visual.*`) from `vision_config`; empty when the config has none."""
    if not config.get("vision_config"):
        return []
    v, out = config["vision_config"], config["vision_config"]["out_hidden_size"]
    h, inter, head = v["hidden_size"], v["intermediate_size"], v["hidden_size"] // v["num_heads"]
    pi, p, t, m = v["projection_intermediate_size"], v["patch_size"], v["temporal_patch_size"], v["spatial_merge_size"]
    specs = [("patch_embed.proj.weight", (h, v["in_channels"], t, p, p)), ("patch_embed.proj.bias", (h,))]
    for b in range(v["depth"]):
        specs += [
            (f"blocks.{b}.{n}", s)
            for n, s in (
                ("norm1.weight", (h,)),
                ("norm2.weight", (h,)),
                ("attn.qkv.weight", (3 * h, h)),
                ("attn.qkv.bias", (3 * h,)),
                ("attn.q_norm.weight", (head,)),
                ("attn.k_norm.weight", (head,)),
                ("attn.proj.weight", (h, h)),
                ("attn.proj.bias", (h,)),
                ("mlp.gate_proj.weight", (inter, h)),
                ("mlp.gate_proj.bias", (inter,)),
                ("mlp.up_proj.weight", (inter, h)),
                ("mlp.up_proj.bias", (inter,)),
                ("mlp.down_proj.weight", (h, inter)),
                ("mlp.down_proj.bias", (h,)),
            )
        ]
    specs += [
        ("post_layernorm.weight", (h,)),
        ("downsample.weight", (out, h, m, m)),
        ("downsample.bias", (out,)),
        ("merger.proj.weight", (out, out)),
        ("merger.post_projection_norm.weight", (out,)),
        ("merger.post_projection_norm.bias", (out,)),
        ("merger.gate_proj.weight", (pi, out)),
        ("merger.up_proj.weight", (pi, out)),
        ("merger.down_proj.weight", (out, pi)),
    ]
    return [TensorSpec("model.visual." + n, s) for n, s in specs]
