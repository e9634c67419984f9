"""Per-stream state and the shared token pool.

Every DSA layer keeps, for every token a stream has seen, one cache row: the normalised MLA latent, the indexer's
key and the indexer's pooling gate score. Those rows live in ONE pool shared by all streams (`KVPool`), so admission
is a question of free tokens, not of per-stream reservations. The KDA layers' state is fixed-size per stream (the
delta-rule state and the short-conv windows) and lives on the `Sequence`.

Sequences served through lanes (`LaneState`, the static decode step of `engine/runner/lanes.py`) keep
that state in preallocated per-lane tensors instead, and their pool slots in a per-lane slot table, so a decode step
reads and writes everything by lane index with shapes that never change (what a CUDA graph needs).

Rows are stored in fp32 (the CPU reference), bf16, or fp8 e4m3 with one fp32 scale per row (`kv="fp8"`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

KV_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp8": torch.float8_e4m3fn}
_FP8_MAX = 448.0


class PoolExhausted(RuntimeError):
    """The pool has fewer free token rows than a chunk needs; the scheduler should have waited."""


class KVPool:
    """`num_tokens` rows of width `row_width` for each of `num_layers` DSA layers, handed out by slot index."""

    def __init__(
        self, num_layers: int, num_tokens: int, row_width: int, kv: str = "fp32", device: str | torch.device = "cpu"
    ) -> None:
        if kv not in KV_DTYPES:
            raise ValueError(f"kv={kv!r}; choose one of {', '.join(KV_DTYPES)}")
        self.kv = kv
        self.num_tokens = num_tokens
        self.row_width = row_width
        # one row more than handed out: `scratch_slot`, written by graph warm-ups and read by padded table entries
        self.rows = torch.zeros(num_layers, num_tokens + 1, row_width, dtype=KV_DTYPES[kv], device=device)
        self.scales = (
            torch.ones(num_layers, num_tokens + 1, dtype=torch.float32, device=device) if kv == "fp8" else None
        )
        self.scratch_slot = num_tokens
        self._free = list(range(num_tokens - 1, -1, -1))  # pop() hands out low slots first
        # holders of each slot: the sequence that took it, and those sharing it (kept prompt states, engine/reuse.py,
        # and the sequences resumed from them); a slot is free again when its last holder lets it go
        self._refs = [0] * num_tokens

    @staticmethod
    def bytes_per_token(num_layers: int, row_width: int, kv: str) -> int:
        item = torch.empty((), dtype=KV_DTYPES[kv]).element_size()
        return num_layers * (row_width * item + (4 if kv == "fp8" else 0))

    @property
    def token_bytes(self) -> int:
        """Bytes one token's rows take in this pool (every DSA layer)."""
        return self.bytes_per_token(self.rows.shape[0], self.row_width, self.kv)

    @property
    def free_tokens(self) -> int:
        return len(self._free)

    def take(self, n: int) -> list[int]:
        """Hand out `n` free slots (host-side only)."""
        if n > len(self._free):
            raise PoolExhausted(f"the cache pool has {len(self._free)} free token rows, {n} needed")
        out = [self._free.pop() for _ in range(n)]
        for s in out:
            self._refs[s] = 1
        return out

    def share(self, slots: list[int]) -> None:
        """One more holder for each of `slots` (held already): their rows stay until every holder releases them."""
        for s in slots:
            if self._refs[s] < 1:
                raise ValueError(f"slot {s} is not held; only held rows can be shared")
            self._refs[s] += 1

    def allocate(self, n: int) -> torch.Tensor:
        return torch.tensor(self.take(n), dtype=torch.long, device=self.rows.device)

    def release(self, slots: torch.Tensor | list[int]) -> None:
        slots = slots.tolist() if isinstance(slots, torch.Tensor) else slots
        for s in reversed(slots):
            if self._refs[s] < 1:
                raise ValueError(f"slot {s} is released more often than it was taken or shared")
            self._refs[s] -= 1
            if self._refs[s] == 0:
                self._free.append(int(s))

    def write(self, layer: int, slots: torch.Tensor, rows: torch.Tensor) -> None:
        """rows: [n, row_width] fp32."""
        if self.scales is not None:
            scale = rows.abs().amax(dim=-1).clamp_min(1e-12) / _FP8_MAX
            self.scales[layer, slots] = scale
            rows = rows / scale[:, None]
        self.rows[layer, slots] = rows.to(self.rows.dtype)

    def read(self, layer: int, slots: torch.Tensor, columns: slice = slice(None)) -> torch.Tensor:
        """slots [...] -> rows [..., row_width] fp32 (`columns`: only those of each row are read)."""
        rows = self.rows[layer][:, columns][slots].to(torch.float32)
        if self.scales is not None:
            rows = rows * self.scales[layer, slots][..., None]
        return rows


@dataclass
class Sequence:
    """One stream's state. `length` counts the tokens the model has consumed; `slot_ids` are its pool slots in
    token order (host-side). A lane-bound sequence (`lane` set) keeps its KDA state as views into `LaneState`'s
    tensors and its slots in the lane's row of the slot table (`table`)."""

    pool: KVPool
    kda_state: dict[int, torch.Tensor] = field(default_factory=dict)  # layer -> [heads, d_k, d_v] fp32
    conv_state: dict[int, torch.Tensor] = field(default_factory=dict)  # layer -> [channels, kernel - 1]
    length: int = 0
    released: bool = False
    lane: int | None = None
    table: torch.Tensor | None = None  # [max_tokens] long: the lane's row of the slot table
    slot_ids: list[int] = field(default_factory=list)
    # with an MTP layer (engine/models/glm5_next/mtp.py): the main model's final hidden rows its next MTP rows
    # follow — row 0 the last prompt row after a prefill chunk, rows 0..W-1 a verify window's (the lane's view)
    hidden: torch.Tensor | None = None

    def __post_init__(self) -> None:
        self._slots = torch.zeros(0, dtype=torch.long, device=self.pool.rows.device)

    @property
    def slots(self) -> torch.Tensor:
        """Pool slots by position (device tensor; for a lane-bound sequence, the whole table row)."""
        return self._slots if self.table is None else self.table

    @property
    def num_slots(self) -> int:
        return len(self.slot_ids)

    def grow(self, n: int) -> torch.Tensor:
        """Allocate rows for the next `n` tokens and return their slots."""
        ids = self.pool.take(n)
        try:
            new = torch.tensor(ids, dtype=torch.long, device=self.pool.rows.device)
            if self.table is None:
                self._slots = torch.cat([self._slots, new])
            else:
                self.table[len(self.slot_ids) : len(self.slot_ids) + n] = new
        except BaseException:  # (the GPU out of memory, a step that fails alone): the rows go back to the pool
            self.pool.release(ids)
            raise
        self.slot_ids += ids
        return new

    def take_over(self, slots: list[int]) -> None:
        """Positions 0..n-1 read the rows of `slots` from now on (rows of a kept prompt state, already shared for
        this sequence; the same bits as its own there, if it had any); the rows it held there are released. A fresh
        sequence goes on from position n."""
        n = len(slots)
        own = self.slot_ids[:n]
        try:
            new = torch.tensor(slots, dtype=torch.long, device=self.pool.rows.device)
            if self.table is None:
                self._slots = torch.cat([new, self._slots[n:]])
            else:
                self.table[:n] = new
        except BaseException:  # the holder the caller added for this sequence goes back; it holds what it held
            self.pool.release(slots)
            raise
        self.slot_ids[:n] = slots
        self.length = max(self.length, n)
        self.pool.release(own)

    def next_slot(self) -> int:
        """The slot of the token at `length`, taken from the pool if not held yet; host-side only (the static decode
        step writes it into the slot table on the device)."""
        if len(self.slot_ids) <= self.length:
            self.slot_ids += self.pool.take(1)
        return self.slot_ids[self.length]

    def slot_at(self, position: int) -> int:
        """The slot of the token at `position` (≥ length), taking slots from the pool up to it if not held yet
        (a verify window's rows; rows of rejected drafts stay held and are written again by the next step)."""
        if len(self.slot_ids) <= position:
            self.slot_ids += self.pool.take(position + 1 - len(self.slot_ids))
        return self.slot_ids[position]

    def store_state(self, layer: int, kda: torch.Tensor, conv: torch.Tensor) -> None:
        """Set a KDA layer's state (in place for a lane-bound sequence, whose state is a view of the lane's)."""
        if self.lane is None:
            self.kda_state[layer], self.conv_state[layer] = kda, conv
        else:
            self.kda_state[layer].copy_(kda)
            self.conv_state[layer].copy_(conv)

    def release(self) -> None:
        if not self.released:
            self.pool.release(self.slot_ids)
            self.slot_ids = []
            self._slots = self._slots[:0]
            self.released = True


def lane_state_bytes(
    kda_shapes: dict[int, tuple[tuple[int, ...], tuple[int, ...]]], num_lanes: int, window: int = 1, hidden: int = 0
) -> tuple[int, int]:
    """What a `LaneState` for `num_lanes` lanes will take: (fixed bytes, bytes per pool token). Fixed: the fp32 KDA
    state and conv window of every lane and the scratch lane, with verify windows (`window` > 1) those after
    every row of a window too, and with an MTP layer (`hidden`: its width) a window of fp32 hidden rows; per pool
    token: the slot table's entry on each lane (int64). Pool sizing subtracts it, so a Spark's memory is not
    promised twice."""
    rows = 1 + (window if window > 1 else 0)
    fixed = kda_state_bytes(kda_shapes) * rows + window * hidden * 4
    return (num_lanes + 1) * fixed, (num_lanes + 1) * 8


def kda_state_bytes(kda_shapes: dict[int, tuple[tuple[int, ...], tuple[int, ...]]]) -> int:
    """One stream's fp32 KDA state and conv window over every KDA layer: a lane's, or a kept prompt state's."""
    return sum(math.prod(state) + math.prod(conv) for state, conv in kda_shapes.values()) * 4


class LaneState:
    """Preallocated decode state for `num_lanes` lanes (plus one scratch lane, index `num_lanes`, used by graph
    warm-ups and a verify step's padding rows): per KDA layer the delta-rule state [lanes, heads, d_k, d_v] and conv
    window [lanes, C, K-1], and the slot table [lanes, max_tokens] (entries past a sequence's length point at the
    pool's scratch row).

    With `window` > 1 (drafts: a verify step feeds a lane up to `window` tokens) each KDA layer also keeps the state
    and conv window after every row of the window (`kda_rows`, `conv_rows`: [lanes, window, ...]); the step leaves
    the lane's own state untouched, and `commit(lane, n)` makes the state after row n-1 the lane's. A rejected draft
    so never touches the state a lane goes on from: nothing is rolled back, it is never adopted."""

    def __init__(
        self,
        pool: KVPool,
        num_lanes: int,
        kda_shapes: dict[int, tuple[tuple[int, ...], tuple[int, ...]]],
        max_tokens: int | None = None,
        window: int = 1,
        hidden: int = 0,
    ) -> None:
        dev = pool.rows.device
        self.pool, self.num_lanes, self.window = pool, num_lanes, window
        self.scratch_lane = num_lanes
        self.kda = {layer: torch.zeros(num_lanes + 1, *state, device=dev) for layer, (state, _) in kda_shapes.items()}
        self.conv = {layer: torch.zeros(num_lanes + 1, *conv, device=dev) for layer, (_, conv) in kda_shapes.items()}
        rows = window if window > 1 else 0
        self.kda_rows = {
            layer: torch.zeros(num_lanes + 1, rows, *state, device=dev) for layer, (state, _) in kda_shapes.items()
        }
        self.conv_rows = {
            layer: torch.zeros(num_lanes + 1, rows, *conv, device=dev) for layer, (_, conv) in kda_shapes.items()
        }
        width = max_tokens or pool.num_tokens
        self.slots = torch.full((num_lanes + 1, width), pool.scratch_slot, dtype=torch.long, device=dev)
        # with an MTP layer (`hidden`: its width): each lane's last main hidden rows, one per window row
        self.hidden = torch.zeros(num_lanes + 1, window, hidden, device=dev) if hidden else None

    def commit(self, lane: int, rows: int) -> None:
        """After a verify step: the lane goes on from the state after its first `rows` rows (every KDA layer's state
        and window in one multi-tensor copy: on a GPU a launch or two, not two a layer)."""
        layers = list(self.kda_rows)
        if not layers:
            return
        kept = [self.kda_rows[layer][lane, rows - 1] for layer in layers]
        kept += [self.conv_rows[layer][lane, rows - 1] for layer in layers]
        torch._foreach_copy_(
            [self.kda[layer][lane] for layer in layers] + [self.conv[layer][lane] for layer in layers], kept
        )

    def reset(self, lane: int) -> None:
        for buf in (*self.kda.values(), *self.conv.values(), *([self.hidden] if self.hidden is not None else [])):
            buf[lane].zero_()
        self.slots[lane].fill_(self.pool.scratch_slot)

    def bind(self, lane: int) -> Sequence:
        """A fresh sequence on `lane` (zero state, empty slot row)."""
        if not 0 <= lane < self.num_lanes:
            raise ValueError(f"lane {lane} is outside 0..{self.num_lanes - 1}")
        self.reset(lane)
        return Sequence(
            self.pool,
            {layer: buf[lane] for layer, buf in self.kda.items()},
            {layer: buf[lane] for layer, buf in self.conv.items()},
            lane=lane,
            table=self.slots[lane],
            hidden=self.hidden[lane] if self.hidden is not None else None,
        )
