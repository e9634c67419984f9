"""The tensor-parallel group: one process per rank, world = TP.

Collectives are written so every rank ends up with identical bits: a row-parallel partial sum is gathered from every
rank and added up in rank order (never a backend all-reduce, whose summation order is not specified), and the
vocab-parallel logits are gathered in rank order.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import os
import socket
import sys
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

# one gather into one flat buffer: `all_gather_single` from torch 2.13 (`all_gather_into_tensor` there is deprecated)
_ALL_GATHER_SINGLE = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


def shard_range(units: int, rank: int, world: int) -> tuple[int, int]:
    """[start, stop) of `rank`'s share of `units` (heads, channels, rows); the first `units % world` ranks get one
    more, so 64 heads over 3 ranks split 22 / 21 / 21."""
    base, extra = divmod(units, world)
    start = rank * base + min(rank, extra)
    return start, start + base + (1 if rank < extra else 0)


@dataclass
class ParallelGroup:
    rank: int = 0
    world: int = 1
    device: torch.device = torch.device("cpu")

    @property
    def is_distributed(self) -> bool:
        return self.world > 1

    @classmethod
    def single(cls, device: str | torch.device = "cpu") -> ParallelGroup:
        return cls(0, 1, torch.device(device))

    @classmethod
    def init(
        cls,
        world: int,
        rank: int,
        master_addr: str,
        master_port: int,
        device: str | torch.device = "cpu",
        timeout_s: float = 600.0,
    ) -> ParallelGroup:
        """Join (or create, on rank 0) the process group over TCP. NCCL on CUDA, gloo on the CPU. Rank 0's
        rendezvous store listens on `master_addr` only (loopback in the embedded default, the link address on
        Sparks), never on every interface: its keys steer the group and it has no authentication."""
        device = torch.device(device)
        if world == 1:
            return cls(0, 1, device)
        if _is_loopback(master_addr):  # local ranks: gloo's own listeners on loopback too, whatever the hostname
            os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
        timeout = datetime.timedelta(seconds=timeout_s)
        store = _rendezvous_store(master_addr, master_port, world, rank, timeout)
        backend = "nccl" if device.type == "cuda" else "gloo"
        dist.init_process_group(backend, store=store, world_size=world, rank=rank, timeout=timeout)
        return cls(rank, world, device)

    # -- collectives ------------------------------------------------------------------------------------------
    def sum_partials(self, partial: torch.Tensor) -> torch.Tensor:
        """Row-parallel reduction: every rank's partial sum, added in rank order -> identical bits everywhere.
        Fixed shapes and no host read, so it can sit inside a captured CUDA graph (NCCL)."""
        if not self.is_distributed:
            return partial
        parts = self._gather_flat(partial)
        total = parts[0]
        for rank in range(1, self.world):
            total = total + parts[rank]
        return total

    def gather_last_dim(self, shard: torch.Tensor, widths: tuple[int, ...]) -> torch.Tensor:
        """Concatenate uneven last-dim shards (vocab-parallel logits) in rank order. `widths` is every rank's shard
        width, known at load (`shard_range`), so nothing is read back from the device (graph-safe)."""
        if not self.is_distributed:
            return shard
        if len(widths) != self.world or shard.shape[-1] != widths[self.rank]:
            raise ValueError(
                f"rank {self.rank}: shard width {shard.shape[-1]} does not match the widths {widths} "
                f"of a {self.world}-rank group"
            )
        width = max(widths)
        parts = self._gather_flat(torch.nn.functional.pad(shard, (0, width - shard.shape[-1])))
        return torch.cat([parts[rank][..., :w] for rank, w in enumerate(widths)], dim=-1)

    def _gather_flat(self, tensor: torch.Tensor) -> torch.Tensor:
        """Every rank's `tensor` (same shape everywhere) as [world, *shape], gathered into one buffer (gloo and
        NCCL both take a flat output)."""
        flat = tensor.contiguous().reshape(-1)
        out = flat.new_empty(self.world * flat.numel())
        _ALL_GATHER_SINGLE(out, flat)
        return out.view(self.world, *tensor.shape)

    def all_agree(self, ok: bool) -> bool:
        """True on every rank when `ok` is true on every rank (one small collective; never inside a capture).
        Used so that ranks take the same branch, e.g. all fall back from CUDA graphs when one rank's capture fails."""
        if not self.is_distributed:
            return ok
        flag = torch.tensor([1 if ok else 0], dtype=torch.int32, device=self.device)
        dist.all_reduce(flag, op=dist.ReduceOp.MIN)
        return bool(flag.item())

    def broadcast_object(self, obj: Any = None) -> Any:
        """Rank 0's object on every rank (step plans, small control messages)."""
        if not self.is_distributed:
            return obj
        box = [obj if self.rank == 0 else None]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def all_gather_object(self, obj: Any) -> list[Any]:
        if not self.is_distributed:
            return [obj]
        out: list[Any] = [None] * self.world
        dist.all_gather_object(out, obj)
        return out

    def check_same_settings(self, settings: dict[str, Any]) -> None:
        """Refuse to run when ranks were started with different settings; the error names every differing key."""
        mine = {k: settings[k] for k in sorted(settings)}
        everyone = self.all_gather_object(mine)
        differing = sorted({k for other in everyone for k in set(other) | set(mine) if other.get(k) != mine.get(k)})
        if differing:
            detail = "; ".join(
                f"{k}: " + ", ".join(f"rank {r}={o.get(k)!r}" for r, o in enumerate(everyone)) for k in differing
            )
            raise RuntimeError(
                f"ranks were started with different settings ({detail}); restart every rank with the same values"
            )


_LISTENERS: list[socket.socket] = []  # rank 0's bound rendezvous socket, kept open for the store's lifetime


def _is_loopback(addr: str) -> bool:
    return addr in ("localhost", "::1") or addr.startswith("127.")


def _rendezvous_store(addr: str, port: int, world: int, rank: int, timeout: datetime.timedelta) -> dist.TCPStore:
    """The group's TCP store. Rank 0 binds the listening socket itself, to `addr`, and hands it to the store
    (torch's own server would listen on every interface); the others connect (retrying until `timeout`)."""
    if rank != 0:
        return dist.TCPStore(addr, port, world, False, timeout)
    family, kind, proto, _, where = socket.getaddrinfo(addr, port, type=socket.SOCK_STREAM)[0]
    listener = socket.socket(family, kind, proto)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        listener.bind(where)
    except OSError as exc:
        listener.close()
        raise OSError(exc.errno, f"the rendezvous cannot listen on {addr}:{port}: {exc.strerror}") from None
    listener.listen(128)
    _LISTENERS.append(listener)
    return dist.TCPStore(addr, port, world, True, timeout, wait_for_workers=False, master_listen_fd=listener.fileno())


def settings_fingerprint(settings: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(settings, sort_keys=True, default=str).encode()).hexdigest()[:16]


def exit_process(code: int) -> None:
    """End a process that joined a torch.distributed group without the interpreter's teardown (returns only when it
    joined none). Tearing the backend down can abort the process after a peer has gone or refused ("terminate
    called…", SIGABRT, which turns a clean exit code into a crash) and hangs for an NCCL group whose collectives a
    CUDA graph captured (PyTorch issue 115388; both ranks, 2 runs of 2 of tests/gpu/tp2_repeat.py on two H200s).
    A gloo group is not destroyed either: `destroy_process_group` on rank 0 after its peers had gone aborted a CI run
    (tp3, rank 0 SIGABRT). Nothing is left to clean up at this point."""
    if dist.is_available() and dist.is_initialized():
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
