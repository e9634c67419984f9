"""The text tower's architecture, read from a checkpoint's config.json (flat or under `text_config`)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

KDA = "linear_attention"
DSA = "indexed_attention"
_DSA_ALIASES = {"full_attention", "deepseek_sparse_attention", "indexed_attention"}


class ConfigError(ValueError):
    """A config.json this engine cannot serve; the message names the field."""


@dataclass(frozen=True)
class TextConfig:
    vocab_size: int = 154880
    hidden_size: int = 4096
    intermediate_size: int = 12288
    moe_intermediate_size: int = 2048
    num_hidden_layers: int = 45
    num_attention_heads: int = 64
    n_shared_experts: int = 1
    n_routed_experts: int = 288
    num_experts_per_tok: int = 8
    routed_scaling_factor: float = 2.5
    norm_topk_prob: bool = True
    n_group: int = 1
    topk_group: int = 1
    kv_lora_rank: int = 512
    q_lora_rank: int = 1536
    qk_rope_head_dim: int = 0
    qk_nope_head_dim: int = 256
    v_head_dim: int = 256
    rms_norm_eps: float = 1e-5
    swiglu_limit: float = 10.0
    index_topk: int = 2048
    index_head_dim: int = 128
    index_n_heads: int = 32
    index_kpool: int = 16
    index_kpool_always_select_tail: bool = True
    linear_head_dim: int = 128
    linear_num_heads: int = 64
    linear_conv_kernel_dim: int = 4
    linear_lower_bound: float | None = -5.0
    hc_mult: int = 4
    hc_eps: float = 1e-6
    hc_sinkhorn_iters: int = 20
    num_nextn_predict_layers: int = 0
    tie_word_embeddings: bool = False
    max_position_embeddings: int = 1048576
    eos_token_id: tuple[int, ...] = ()
    layer_types: tuple[str, ...] = field(default=())
    mlp_layer_types: tuple[str, ...] = field(default=())
    indexer_types: tuple[str, ...] = field(default=())

    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim

    @property
    def kda_dim(self) -> int:
        return self.linear_num_heads * self.linear_head_dim

    @property
    def dsa_layers(self) -> tuple[int, ...]:
        return tuple(i for i, t in enumerate(self.layer_types) if t == DSA)

    @property
    def kda_layers(self) -> tuple[int, ...]:
        return tuple(i for i, t in enumerate(self.layer_types) if t == KDA)

    @property
    def pool_row_width(self) -> int:
        """Elements of one cache-pool row (a DSA layer's token): MLA latent ‖ index key ‖ pool gate score; 1 (an
        unused pool) without DSA layers."""
        return self.kv_lora_rank + 2 * self.index_head_dim if self.dsa_layers else 1

    @property
    def pool_layers(self) -> int:
        """Layers the pool keeps rows for (at least one, so an all-KDA model still has a pool to hand out)."""
        return max(len(self.dsa_layers), 1)

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> TextConfig:
        text = dict(raw.get("text_config") or raw)
        known = {f.name for f in fields(cls)}
        linear = text.get("linear_attn_config") or {}
        for src, dst in (
            ("head_dim", "linear_head_dim"),
            ("num_heads", "linear_num_heads"),
            ("short_conv_kernel_size", "linear_conv_kernel_dim"),
            ("gate_lower_bound", "linear_lower_bound"),
        ):
            if src in linear and dst not in text:
                text[dst] = linear[src]
        kwargs = {k: v for k, v in text.items() if k in known}
        n = int(kwargs.get("num_hidden_layers", cls.num_hidden_layers))
        layer_types = kwargs.get("layer_types") or [KDA if i % 4 != 3 else DSA for i in range(n)]
        layer_types = [DSA if t in _DSA_ALIASES else t for t in layer_types]
        mlp_types = kwargs.get("mlp_layer_types")
        if not mlp_types:
            k = int(text.get("first_k_dense_replace", 3))
            mlp_types = ["dense"] * min(k, n) + ["sparse"] * max(n - k, 0)
        indexer_types = kwargs.get("indexer_types") or ["full"] * n
        eos = kwargs.get("eos_token_id")
        eos = () if eos is None else tuple(eos) if isinstance(eos, (list, tuple)) else (int(eos),)
        kwargs.update(
            layer_types=tuple(layer_types[:n]),
            mlp_layer_types=tuple(mlp_types[:n]),
            indexer_types=tuple(indexer_types[:n]),
            eos_token_id=eos,
        )
        cfg = cls(**kwargs)
        cfg.validate()
        return cfg

    @classmethod
    def from_file(cls, path: str | Path) -> TextConfig:
        path = Path(path)
        if path.is_dir():
            path = path / "config.json"
        return cls.from_dict(json.loads(path.read_text()))

    def validate(self) -> None:
        n = self.num_hidden_layers
        for name in ("layer_types", "mlp_layer_types", "indexer_types"):
            if len(getattr(self, name)) != n:
                raise ConfigError(f"{name} has {len(getattr(self, name))} entries, num_hidden_layers is {n}")
        bad = sorted(set(self.layer_types) - {KDA, DSA})
        if bad:
            raise ConfigError(f"layer_types holds {bad}; this engine serves linear_attention and indexed_attention")
        if set(self.mlp_layer_types) - {"dense", "sparse"}:
            raise ConfigError(f"mlp_layer_types holds {sorted(set(self.mlp_layer_types))}; expected dense / sparse")
        if self.qk_rope_head_dim != 0:
            raise ConfigError(f"qk_rope_head_dim is {self.qk_rope_head_dim}; GLM-5.3-Flash's MLA has no RoPE (0)")
        if self.n_group != 1 or self.topk_group != 1:
            raise ConfigError(f"n_group={self.n_group}, topk_group={self.topk_group}: only 1 / 1 is served")
        if self.index_topk % self.index_kpool:
            raise ConfigError(f"index_topk {self.index_topk} is not a multiple of index_kpool {self.index_kpool}")
        for i, kind in enumerate(self.indexer_types):
            if (
                kind == "shared"
                and self.layer_types[i] == DSA
                and not any(self.indexer_types[j] == "full" and self.layer_types[j] == DSA for j in range(i))
            ):
                raise ConfigError(f"indexer_types[{i}] is shared but no earlier DSA layer runs a full indexer")
