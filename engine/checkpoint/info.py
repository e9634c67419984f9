"""`python -m engine info DIR [--tp N] [--config-only] [--dense D] [--kv K]`: a checkpoint's architecture, parameter
count, bytes on disk by dtype, bytes per rank under tensor parallelism, and what its caches take per sequence and per
token with the cache row type K.

Everything comes from config.json and the safetensors headers (the JSON at the front of each file): no weight is
read. With `--config-only`, or when DIR holds only a config.json (or DIR is a .json file), the tensor list is
derived from the config (`layout.text_tensors`) and every tensor is counted as bf16 — that is how the figures for
the released GLM-5.3-Flash config (glm53_flash_config.json in this package) are produced.

Per-rank bytes follow the engine's TP plan (`layout.split_of`); replicated tensors count on every rank, so the
ranks' sum is at least the text tower's total. The vision tower is not split: rank 0 alone holds it, whole, when
the engine serves with --vision 1 (shown with rank 0's kinds).

The cache figures are the engine's own: the pool's bytes per token come from `cache_bytes_per_token` (what `engine
fit` and serve's pool sizing use), the KDA state's from `engine.cache.kda_state_bytes`. How many tokens a machine
holds depends on its memory, so info gives tokens per free GiB and leaves the window to `engine fit`.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engine.checkpoint.layout import kept_fp32, split_of, text_config, text_tensors, vision_tensors
from engine.config import DENSE_MODES, KV_MODES, KV_ROW_TYPES
from engine.parallel import shard_range

DTYPE_BYTES = {
    "F64": 8,
    "I64": 8,
    "U64": 8,
    "F32": 4,
    "I32": 4,
    "U32": 4,
    "F16": 2,
    "BF16": 2,
    "I16": 2,
    "U16": 2,
    "F8_E4M3": 1,
    "F8_E5M2": 1,
    "F8_E8M0": 1,
    "I8": 1,
    "U8": 1,
    "BOOL": 1,
    "F4": 0.5,
}
_LAYER = re.compile(r"\.layers\.(\d+)\.")
_EXPERT = re.compile(r"\.mlp\.experts\.\d+\.")


@dataclass(frozen=True)
class Tensor:
    name: str
    shape: tuple[int, ...]
    dtype: str  # safetensors dtype code: BF16, F32, ...

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return int(self.numel * DTYPE_BYTES.get(self.dtype, 2))


@dataclass
class CheckpointInfo:
    config: dict[str, Any]
    source: str  # "safetensors headers" or "config only (bf16 assumed)"
    tp: int
    params: dict[str, int] = field(default_factory=dict)  # text, mtp, vision, active
    bytes_by_dtype: dict[str, int] = field(default_factory=dict)
    rank_bytes: list[int] = field(default_factory=list)
    text_bytes: int = 0
    # rank 0's bytes by kind — routed experts, dense, embeddings and head, MTP (footprint.py's kinds) — as stored, or
    # as kept with DENSE=`dense` (q4 / fp8)
    rank0_kinds: dict[str, int] = field(default_factory=dict)
    dense: str = "bf16"
    kv: str = "bf16"  # the cache row type the cache lines count

    @property
    def total_params(self) -> int:
        return self.params["text"] + self.params["mtp"] + self.params["vision"]


def read_header(path: Path) -> dict[str, Any]:
    """The JSON header of one safetensors file (name -> dtype, shape, offsets); the weights are never read."""
    with path.open("rb") as handle:
        (length,) = struct.unpack("<Q", handle.read(8))
        return json.loads(handle.read(length))


def checkpoint_tensors(directory: Path) -> list[Tensor] | None:
    """Every tensor named in the checkpoint's safetensors headers, or None when there are no weight files."""
    index = directory / "model.safetensors.index.json"
    if index.exists():
        files = sorted(set(json.loads(index.read_text())["weight_map"].values()))
    else:
        files = sorted(p.name for p in directory.glob("*.safetensors"))
    if not files:
        return None
    out = []
    for name in files:
        for key, meta in read_header(directory / name).items():
            if key != "__metadata__":
                out.append(Tensor(key, tuple(meta["shape"]), meta["dtype"]))
    return out


def rank_share(tensor: Tensor, config: dict[str, Any], rank: int, world: int) -> int:
    """Bytes of `tensor` that `rank` holds under the TP plan."""
    split = split_of(tensor.name, config)
    if split.dim is None or world == 1:  # REPLICATED: every rank holds it whole
        return tensor.nbytes
    size = tensor.shape[split.dim]
    unit = split.unit if size % split.unit == 0 else 1
    start, stop = shard_range(size // unit, rank, world)
    return tensor.nbytes * (stop - start) * unit // size


def is_vision(name: str) -> bool:
    """Whether a checkpoint tensor is the vision tower's (rank 0 alone loads it, with --vision 1)."""
    return ".visual." in name or name.startswith(("visual.", "model.visual"))


def kept_share(
    tensor: Tensor, config: dict[str, Any], rank: int, world: int, dense: str, loaded: float | None = None
) -> int:
    """`rank_share` once loaded: at DENSE=`dense`'s bytes per value where that mode reduces the tensor
    (engine/quant/dense.py `kept_bytes`), as stored for the control tensors kept in fp32 (`layout.kept_fp32`), else
    at `loaded` bytes per value (None: as stored); never more than stored."""
    from engine.quant.dense import kept_bytes

    share = rank_share(tensor, config, rank, world)
    kept = kept_bytes(tensor.name, tensor.shape, dense)
    item = None if kept is None and kept_fp32(tensor.name) else loaded if kept is None else kept
    return share if item is None else int(share * min(1.0, item / DTYPE_BYTES.get(tensor.dtype, 2)))


def describe(
    path: str | Path, tp: int = 1, config_only: bool = False, dense: str = "bf16", kv: str = "bf16"
) -> CheckpointInfo:
    path = Path(path)
    config_file = path if path.suffix == ".json" else path / "config.json"
    config = json.loads(config_file.read_text())
    tensors = None if config_only or path.suffix == ".json" else checkpoint_tensors(path)
    source = "safetensors headers"
    if tensors is None:
        specs = text_tensors(config) + vision_tensors(config)
        tensors = [Tensor(s.name, s.shape, "F32" if s.fp32 else "BF16") for s in specs]
        source = "config only (every tensor counted as the released checkpoint stores it: bf16, control tensors fp32)"
    text = text_config(config)
    layers, experts = text["num_hidden_layers"], text.get("n_routed_experts", 1)
    info = CheckpointInfo(config, source, tp, dict(text=0, mtp=0, vision=0, active=0), {}, [0] * tp, dense=dense, kv=kv)
    for t in tensors:
        info.bytes_by_dtype[t.dtype] = info.bytes_by_dtype.get(t.dtype, 0) + t.nbytes
        if is_vision(t.name):
            info.params["vision"] += t.numel
            info.rank0_kinds["vision"] = info.rank0_kinds.get("vision", 0) + t.nbytes
            continue
        layer = _LAYER.search(t.name)
        routed = _EXPERT.search(t.name) is not None
        if layer and int(layer.group(1)) >= layers:
            info.params["mtp"] += t.numel
            kind = "mtp"
        else:
            info.params["text"] += t.numel
            info.params["active"] += t.numel * text.get("num_experts_per_tok", 1) // experts if routed else t.numel
            head = "embed_tokens" in t.name or "lm_head" in t.name
            kind = "routed_experts" if routed else "embeddings_and_head" if head else "dense"
        info.text_bytes += t.nbytes
        for rank in range(tp):
            info.rank_bytes[rank] += rank_share(t, config, rank, tp)
        info.rank0_kinds[kind] = info.rank0_kinds.get(kind, 0) + kept_share(t, config, 0, tp, dense)
    return info


def _size(n: float) -> str:
    return f"{n / 1e9:.2f} GB" if n >= 1e9 else f"{n / 1e6:.2f} MB"


def _count(n: int) -> str:
    return f"{n / 1e9:.2f} B" if n >= 1e9 else f"{n / 1e6:.2f} M"


@dataclass(frozen=True)
class CacheSizes:
    """What serving the config keeps besides its weights, as the engine allocates it (no rank split: each rank holds
    every DSA layer's pool row of a token; the KDA state is split by heads)."""

    kda_state_bytes: int  # one sequence's KDA delta-rule states and conv windows, fp32 whatever the row type
    pool_token_bytes: int  # one token's rows in the pool, every DSA layer, in the row type
    pool_token_bytes_mtp: int  # the same when the MTP layer drafts (its own pool row too)


def cache_sizes(config: dict[str, Any], kv: str) -> CacheSizes:
    from engine.cache import kda_state_bytes
    from engine.models.glm5_next.config import TextConfig
    from engine.models.glm5_next.kda import state_shapes
    from engine.models.glm5_next.model import cache_bytes_per_token

    cfg = TextConfig.from_dict(config)
    one = state_shapes(cfg.linear_num_heads, cfg.linear_head_dim, cfg.linear_conv_kernel_dim)  # all ranks' heads
    shapes = {layer: one for layer in cfg.kda_layers}
    return CacheSizes(kda_state_bytes(shapes), cache_bytes_per_token(cfg, kv), cache_bytes_per_token(cfg, kv, mtp=True))


def architecture_lines(config: dict[str, Any], kv: str = "bf16") -> list[str]:
    t = text_config(config)
    n = t["num_hidden_layers"]
    kinds = ["K" if k == "linear_attention" else "D" for k in t.get("layer_types") or []]
    mlp = t.get("mlp_layer_types") or []
    dense = sum(1 for m in mlp if m == "dense")
    kda_heads, kda_dim, topk, pool = t["linear_num_heads"], t["linear_head_dim"], t["index_topk"], t["index_kpool"]
    sizes = cache_sizes(config, kv)
    row = t["kv_lora_rank"] + 2 * t["index_head_dim"]
    return [
        f"model: {config.get('model_type', '?')} / {t.get('model_type', '?')}, hidden {t['hidden_size']}, "
        f"vocab {t['vocab_size']}, {t.get('hc_mult', 4)} mHC streams ({t.get('hc_sinkhorn_iters', 20)} Sinkhorn steps)",
        f"layers: {n} ({kinds.count('K')} KDA, {kinds.count('D')} DSA; {''.join(kinds)}) "
        f"+ {t.get('num_nextn_predict_layers', 0)} MTP",
        f"KDA: {kda_heads} heads x {kda_dim}, conv {t['linear_conv_kernel_dim']}, gate lower bound "
        f"{t.get('linear_lower_bound', -5.0)}; recurrent state {sizes.kda_state_bytes / 2**20:.2f} MiB per sequence "
        "across the ranks (delta-rule states and conv windows, fp32 with every KV)",
        f"DSA: MLA without RoPE, {t['num_attention_heads']} heads, q_lora {t['q_lora_rank']}, kv_lora "
        f"{t['kv_lora_rank']}, qk {t['qk_nope_head_dim']}, v {t['v_head_dim']}; indexer {t['index_n_heads']} x "
        f"{t['index_head_dim']}, top {topk} tokens in pools of {pool}",
        f"window: every key attended within {topk + pool - 1} tokens (index_topk + kpool - 1), sparse beyond",
        f"DSA cache, KV={kv}: {sizes.pool_token_bytes} B per token on every rank ({kinds.count('D')} layers x "
        f"{row} values: latent + index key + pool gate, {KV_ROW_TYPES[kv]}); {sizes.pool_token_bytes_mtp} B with "
        "the MTP drafter",
        f"MLP: {dense} dense ({t['intermediate_size']} wide) + {n - dense} MoE ({t['n_routed_experts']} experts, "
        f"top-{t['num_experts_per_tok']}, {t.get('n_shared_experts', 1)} shared, width {t['moe_intermediate_size']})",
    ]


def pool_line(info: CheckpointInfo) -> str:
    """Tokens of pool a GiB holds, and the command that sizes the pool for a machine (its memory, the reserve)."""
    sizes = cache_sizes(info.config, info.kv)
    mtp = text_config(info.config).get("num_nextn_predict_layers", 0) > 0
    with_mtp = f"; {2**30 // sizes.pool_token_bytes_mtp:,} with the MTP drafter's row" if mtp else ""
    return (
        f"pool: {2**30 // sizes.pool_token_bytes:,} tokens per GiB a rank has free after its weights (KV={info.kv}"
        f"{with_mtp}); "
        f"`python -m engine fit CHECKPOINT --tp {info.tp} --kv {info.kv} --dense {info.dense}` gives the window "
        "a machine holds"
    )


def render(info: CheckpointInfo) -> str:
    p = info.params
    lines = architecture_lines(info.config, info.kv) + [
        f"source: {info.source}",
        f"parameters: {_count(info.total_params)} total = text {_count(p['text'])} + MTP {_count(p['mtp'])} + "
        f"vision {_count(p['vision'])}; active per token {_count(p['active'])} (text tower, top-k of the routed experts)",
        "bytes on disk: "
        + ", ".join(f"{k} {_size(v)}" for k, v in sorted(info.bytes_by_dtype.items()))
        + f"; total {_size(sum(info.bytes_by_dtype.values()))}",
        f"bytes per rank at TP={info.tp} (text tower + MTP; the vision tower is rank 0's alone, below): "
        + ", ".join(f"rank {r} {_size(b)}" for r, b in enumerate(info.rank_bytes))
        + f" (sum {_size(sum(info.rank_bytes))} vs {_size(info.text_bytes)} unsplit)",
        f"rank 0 by kind, {'as stored' if info.dense == 'bf16' else f'kept with DENSE={info.dense}'}: "
        + ", ".join(
            f"{name} {_size(info.rank0_kinds.get(kind, 0))}"
            for kind, name in (
                ("routed_experts", "routed experts"),
                ("dense", "dense"),
                ("embeddings_and_head", "embeddings and head"),
                ("mtp", "MTP"),
                ("vision", "vision tower (with VISION=1)"),
            )
        ),
        pool_line(info),
    ]
    return "\n".join(lines)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("directory", type=Path, help="a checkpoint directory, or a config.json")
    parser.add_argument("--tp", type=int, default=1, help="tensor-parallel world size for the per-rank figures")
    parser.add_argument(
        "--config-only",
        action="store_true",
        help="derive the tensors from config.json (bf16) instead of the safetensors headers",
    )
    parser.add_argument(
        "--dense",
        choices=DENSE_MODES,
        default="bf16",
        help="rank 0's bytes by kind as kept with this DENSE mode (default: as stored)",
    )
    parser.add_argument(
        "--kv",
        choices=KV_MODES,
        default="bf16",
        help="as serve's and fit's: the cache row type the DSA cache and pool lines count",
    )


def run(args: argparse.Namespace) -> int:
    target = args.directory
    config = target if target.suffix == ".json" else target / "config.json"
    if not config.exists():
        print(f"error: {config} does not exist\nfix: pass a checkpoint directory holding config.json, or a config file")
        return 2
    if args.tp < 1:
        print(f"error: --tp {args.tp} is not a world size\nfix: pass --tp 1 or more")
        return 2
    print(render(describe(target, tp=args.tp, config_only=args.config_only, dense=args.dense, kv=args.kv)))
    return 0
