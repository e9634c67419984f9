"""What a rank holds in memory, by kind: the weights (routed experts, dense, embeddings and head, the MTP layer), the
cache pool, and the lane states — read off the objects themselves (each tensor storage counted once, views and
tied weights included), so /health and the start-up log say what is there, not what a formula expects."""

from __future__ import annotations

from typing import Any

import torch

KINDS = ("routed_experts", "dense", "embeddings_and_head", "mtp")
_SKIP = ("group", "cfg", "reader", "pool")  # not weights (or not this walk's: the pool is counted on its own)


def _storages(obj: Any, depth: int = 0, out: dict[int, int] | None = None) -> dict[int, int]:
    """data pointer -> bytes of every tensor storage reachable from `obj` (attributes, lists, tuples, dicts)."""
    out = {} if out is None else out
    if isinstance(obj, torch.Tensor):
        storage = obj.untyped_storage()
        out.setdefault(storage.data_ptr(), storage.nbytes())
    elif depth < 8 and isinstance(obj, (list, tuple)):
        for item in obj:
            _storages(item, depth + 1, out)
    elif depth < 8 and isinstance(obj, dict):
        for item in obj.values():
            _storages(item, depth + 1, out)
    elif depth < 8 and hasattr(obj, "__dict__") and not isinstance(obj, type):
        for name, item in vars(obj).items():
            if name not in _SKIP:
                _storages(item, depth + 1, out)
    return out


def weight_bytes(model: Any) -> dict[str, int]:
    """Bytes of this rank's weights by kind. Routed experts: the MoE layers' expert banks (EXL3 trellises or dense
    experts; a shared expert stacked into the bank counts there); embeddings and head: the embedding table and the
    lm_head (once when tied); MTP: the next-token-prediction layer; dense: everything else."""
    seen: dict[int, int] = {}
    kinds = dict.fromkeys(KINDS, 0)

    def claim(kind: str, obj: Any) -> None:
        for ptr, size in _storages(obj).items():
            if ptr not in seen:
                seen[ptr] = size
                kinds[kind] += size

    claim("embeddings_and_head", [getattr(model, "embed", None), getattr(model, "lm_head", None)])
    claim("mtp", getattr(model, "mtp", None))
    for layer in getattr(model, "layers", []):
        mlp = getattr(layer, "mlp", None)
        claim("routed_experts", [getattr(mlp, name, None) for name in ("stacked", "exl3", "experts")])
    claim("dense", model)
    return kinds


def held_bytes(obj: Any) -> int:
    """Bytes of every tensor storage reachable from `obj` (each once): e.g. a LaneState's states and slot table."""
    return sum(_storages(obj).values())


def _dtype_name(tensor: Any) -> str:
    name = str(getattr(tensor, "dtype", "unknown")).removeprefix("torch.")
    return name.replace("float32", "fp32").replace("bfloat16", "bf16")


def dense_dtype(model: Any) -> str:
    """What the dense weights are held in, as /health and the banner say it: q4 or fp8 when quantised at load
    (DENSE), else the element type they loaded in (fp32, bf16)."""
    mode = getattr(model, "dense_mode", "bf16")
    return mode if mode != "bf16" else _dtype_name(getattr(model, "embed", None))


def head_dtype(model: Any) -> str:
    """What the LM head is held in (q4 / fp8 when quantised, else its element type)."""
    head = getattr(model, "lm_head", None)
    mode = getattr(head, "mode", None)
    return mode if isinstance(mode, str) else _dtype_name(head)


def report(model: Any, pool: Any, lane_bytes: int, vision_bytes: int = 0) -> dict[str, Any]:
    """/health's `memory`: the weights by kind and in all, the pool (its rows and fp8 scales) and the lane states, in
    bytes, with the element types they are held in. `vision_bytes`: the vision tower's (rank 0 holds it)."""
    weights = weight_bytes(model)
    if vision_bytes:
        weights["vision"] = vision_bytes
    pool_bytes = pool.rows.numel() * pool.rows.element_size()
    if pool.scales is not None:
        pool_bytes += pool.scales.numel() * pool.scales.element_size()
    return {
        "weights_bytes": {**weights, "total": sum(weights.values())},
        "dense_dtype": dense_dtype(model),
        "head_dtype": head_dtype(model),
        "pool_bytes": pool_bytes,
        "pool_rows": pool.kv,
        "lane_state_bytes": lane_bytes,
    }
