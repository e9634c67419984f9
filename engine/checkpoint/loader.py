"""Read an HF-layout checkpoint, each rank taking only its own shard of every tensor.

A tensor is either replicated or split along one dimension in units (a head, a channel, a row): `shard_range`
gives each rank a contiguous run of units, uneven when the count does not divide. Reading goes through
`safe_open(...).get_slice`, so a rank never materialises the other ranks' parts.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open

from engine.checkpoint.layout import kept_fp32
from engine.parallel import ParallelGroup, shard_range

SKIPPED_PREFIXES = ("model.visual.", "visual.", "model.vision_tower.")


def load_dtype(name: str, dtype: torch.dtype) -> torch.dtype:
    """The dtype tensor `name` loads in under load dtype `dtype`: that, except the control tensors kept in fp32
    (`layout.kept_fp32`)."""
    return torch.float32 if kept_fp32(name) else dtype


class CheckpointError(RuntimeError):
    """A checkpoint directory this engine cannot load; the message names the file or tensor."""


class CheckpointReader:
    def __init__(
        self,
        path: str | Path,
        group: ParallelGroup,
        dtype: torch.dtype = torch.float32,
        device: str | torch.device = "cpu",
    ) -> None:
        self.path = Path(path)
        self.group = group
        self.dtype = dtype
        self.device = torch.device(device)
        self.file_of = self._index()
        self._handles: dict[str, Any] = {}  # safetensors handles (safe_open)

    def _index(self) -> dict[str, str]:
        index = self.path / "model.safetensors.index.json"
        if index.exists():
            return dict(json.loads(index.read_text())["weight_map"])
        single = self.path / "model.safetensors"
        if not single.exists():
            raise CheckpointError(f"{self.path} has neither model.safetensors.index.json nor model.safetensors")
        with safe_open(str(single), framework="pt") as handle:
            return {name: single.name for name in handle.keys()}

    def names(self) -> list[str]:
        return [n for n in self.file_of if not n.startswith(SKIPPED_PREFIXES)]

    def has(self, name: str) -> bool:
        return name in self.file_of

    def _slice(self, name: str):
        if name not in self.file_of:
            raise CheckpointError(f"tensor {name} is missing from {self.path}")
        fname = self.file_of[name]
        if fname not in self._handles:
            self._handles[fname] = safe_open(str(self.path / fname), framework="pt")
        return self._handles[fname].get_slice(name)

    def shape(self, name: str) -> list[int]:
        return list(self._slice(name).get_shape())

    def get(self, name: str, dim: int | None = None, units: int | None = None) -> torch.Tensor:
        """This rank's part of `name`: whole when `dim` is None, else its share of `units` equal blocks of `dim`."""
        part = self._slice(name)
        shape = part.get_shape()
        if dim is None or self.group.world == 1:
            tensor = part[...]  # `...`, not `:`, so scalars (EXL3 codebook markers) read too
        else:
            units = units or shape[dim]
            if shape[dim] % units:
                raise CheckpointError(f"{name}: dim {dim} of size {shape[dim]} does not split into {units} units")
            width = shape[dim] // units
            start, stop = shard_range(units, self.group.rank, self.group.world)
            index = [slice(None)] * len(shape)
            index[dim] = slice(start * width, stop * width)
            tensor = part[tuple(index)]
        return tensor.to(device=self.device, dtype=self.dtype_of(name)).contiguous()

    def dtype_of(self, name: str) -> torch.dtype:
        return load_dtype(name, self.dtype)

    def close(self) -> None:
        self._handles.clear()
