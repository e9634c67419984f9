"""Per-stream state and the shared token pool.

Every DSA layer keeps, for every token a stream has seen, one cache row: the normalised MLA latent, the indexer's
key and the indexer's pooling gate score. Those rows live in ONE pool shared by all streams (`KVPool`), so admission
is a question of free tokens, not of per-stream reservations. The KDA layers' state is fixed-size per stream (the
delta-rule state and the short-conv windows) and lives on the `Sequence`.

Rows are stored in fp32 (the CPU reference), bf16, or fp8 e4m3 with one fp32 scale per row (`kv="fp8"`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

KV_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp8": torch.float8_e4m3fn}
_FP8_MAX = 448.0


class PoolExhausted(RuntimeError):
    """The pool has fewer free token rows than a chunk needs; the scheduler should have waited."""


class KVPool:
    """`num_tokens` rows of width `row_width` for each of `num_layers` DSA layers, handed out by slot index."""

    def __init__(self, num_layers: int, num_tokens: int, row_width: int, kv: str = "fp32",
                 device: str | torch.device = "cpu") -> None:
        if kv not in KV_DTYPES:
            raise ValueError(f"kv={kv!r}; choose one of {', '.join(KV_DTYPES)}")
        self.kv = kv
        self.num_tokens = num_tokens
        self.row_width = row_width
        self.rows = torch.zeros(num_layers, num_tokens, row_width, dtype=KV_DTYPES[kv], device=device)
        self.scales = torch.ones(num_layers, num_tokens, dtype=torch.float32, device=device) if kv == "fp8" else None
        self._free = list(range(num_tokens - 1, -1, -1))  # pop() hands out low slots first

    @staticmethod
    def bytes_per_token(num_layers: int, row_width: int, kv: str) -> int:
        item = torch.empty((), dtype=KV_DTYPES[kv]).element_size()
        return num_layers * (row_width * item + (4 if kv == "fp8" else 0))

    @property
    def free_tokens(self) -> int:
        return len(self._free)

    def allocate(self, n: int) -> torch.Tensor:
        if n > len(self._free):
            raise PoolExhausted(f"the cache pool has {len(self._free)} free token rows, {n} needed")
        slots = [self._free.pop() for _ in range(n)]
        return torch.tensor(slots, dtype=torch.long, device=self.rows.device)

    def release(self, slots: torch.Tensor) -> None:
        self._free.extend(int(s) for s in reversed(slots.tolist()))

    def write(self, layer: int, slots: torch.Tensor, rows: torch.Tensor) -> None:
        """rows: [n, row_width] fp32."""
        if self.scales is not None:
            scale = rows.abs().amax(dim=-1).clamp_min(1e-12) / _FP8_MAX
            self.scales[layer, slots] = scale
            rows = rows / scale[:, None]
        self.rows[layer, slots] = rows.to(self.rows.dtype)

    def read(self, layer: int, slots: torch.Tensor) -> torch.Tensor:
        """[n, row_width] fp32."""
        rows = self.rows[layer, slots].to(torch.float32)
        if self.scales is not None:
            rows = rows * self.scales[layer, slots][:, None]
        return rows


@dataclass
class Sequence:
    """One stream's state. `length` counts the tokens the model has consumed."""

    pool: KVPool
    kda_state: dict[int, torch.Tensor] = field(default_factory=dict)   # layer -> [heads, d_k, d_v] fp32
    conv_state: dict[int, torch.Tensor] = field(default_factory=dict)  # layer -> [channels, kernel - 1]
    slots: torch.Tensor = field(default=None)  # type: ignore[assignment]
    length: int = 0
    released: bool = False

    def __post_init__(self) -> None:
        if self.slots is None:
            self.slots = torch.zeros(0, dtype=torch.long, device=self.pool.rows.device)

    def grow(self, n: int) -> torch.Tensor:
        """Allocate rows for the next `n` tokens and return their slots."""
        new = self.pool.allocate(n)
        self.slots = torch.cat([self.slots, new])
        return new

    def release(self) -> None:
        if not self.released:
            self.pool.release(self.slots)
            self.slots = self.slots[:0]
            self.released = True
