"""EXL3 checkpoints: recognise them, check every EXL3 tensor group, and read a projection for this rank.

An EXL3 checkpoint (ExLlamaV3's converter, e.g. Mia-AiLab/GLM-5.3-Flash-EXL3-4bpw-TensorFold) keeps the original
tensor names; a quantized linear `<prefix>.weight` becomes the group `<prefix>.trellis`, `.suh`/`.su`, `.svh`/`.sv`,
an optional `.mcg`/`.mul1` codebook marker and `.bias` (format: engine/quant/exl3.py). config.json says
`quantization_config: {quant_method: "exl3", bits, head_bits, codebook?, ...}` at the top level or in
`text_config`; `bits` is only the average, each tensor's width is its trellis' last dimension / 16.

This engine reads EXL3 for the MLP projections (routed experts, shared expert, dense MLP: `read_projection`);
anything else in EXL3, a malformed group, a marker that disagrees with the config, or an MLP whose gate/up/down
mix EXL3 and plain weights is refused with a message naming the tensor and what was found.

Tensor parallel keeps whole tiles and Hadamard blocks: a column-parallel projection (gate/up, split by outputs)
takes its rank's 128-wide output blocks (trellis columns and svh, all of suh); a row-parallel one (down, split by
inputs) its 128-wide input blocks (trellis rows and suh, all of svh). The weight is decoded on load (CPU path).
"""

from __future__ import annotations

import json
import re
import struct
import weakref
from dataclasses import dataclass
from typing import Any

import torch
from safetensors import safe_open

from engine.checkpoint.loader import CheckpointError, CheckpointReader
from engine.parallel import shard_range
from engine.quant import exl3

PARTS = ("trellis", "suh", "su", "svh", "sv", "mcg", "mul1", "bias")
_MLP_PROJECTION = re.compile(r"\.mlp\.(experts\.\d+\.|shared_experts\.)?(gate|up|down)_proj$")


def quantization_config(config: dict[str, Any]) -> dict[str, Any]:
    """config.json's quantization_config (top level or in text_config); {} when there is none."""
    return dict(config.get("quantization_config") or (config.get("text_config") or {}).get("quantization_config") or {})


def is_exl3_config(config: dict[str, Any]) -> bool:
    return quantization_config(config).get("quant_method") == "exl3"


@dataclass(frozen=True)
class Exl3Group:
    """One EXL3 linear layer's metadata (from the safetensors headers)."""

    prefix: str  # e.g. model.language_model.layers.3.mlp.experts.7.gate_proj
    bits: float
    codebook: str  # 3inst | mcg | mul1
    in_features: int  # K
    out_features: int  # N
    in_scales: str  # suh | su
    out_scales: str  # svh | sv
    bias: bool


def parse_group(prefix: str, parts: dict[str, tuple[str, list[int]]]) -> Exl3Group:
    """An EXL3 group from its parts' (dtype, shape); Exl3FormatError naming the tensor for anything malformed."""
    if "trellis" not in parts:
        raise exl3.Exl3FormatError(f"{prefix}: has {', '.join('.' + p for p in sorted(parts))} but no .trellis")
    dtype, shape = parts["trellis"]
    if dtype != "I16" or len(shape) != 3:
        raise exl3.Exl3FormatError(f"{prefix}.trellis: expected I16 [K/16, N/16, 16*bits], found {dtype} {shape}")
    bits = exl3.width_of(shape[2])
    if not bits:
        raise exl3.Exl3FormatError(
            f"{prefix}.trellis: last dimension {shape[2]} is {shape[2] / 16:g} bits a weight; "
            f"EXL3 widths are {', '.join(f'{w:g}' for w in exl3.WIDTHS)}"
        )
    markers = [m for m in ("mcg", "mul1") if m in parts]
    if len(markers) > 1:
        raise exl3.Exl3FormatError(f"{prefix}: both .mcg and .mul1 codebook markers")
    codebook = markers[0] if markers else "3inst"
    if not float(bits).is_integer() and codebook != "mul1":
        raise exl3.Exl3FormatError(f"{prefix}.trellis: {bits:g}-bit tiles need the mul1 codebook, found {codebook}")
    k, n = 16 * shape[0], 16 * shape[1]
    if k % exl3.HADAMARD_BLOCK or n % exl3.HADAMARD_BLOCK:
        raise exl3.Exl3FormatError(f"{prefix}.trellis: K={k} and N={n} must be multiples of {exl3.HADAMARD_BLOCK}")
    scales = []
    for scaled, packed, size in (("suh", "su", k), ("svh", "sv", n)):
        name, want = (scaled, ("F16", [size])) if scaled in parts else (packed, ("I16", [size // 16]))
        if name not in parts:
            raise exl3.Exl3FormatError(f"{prefix}: neither .{scaled} nor .{packed} (the {scaled[1]} scales)")
        if tuple(parts[name]) != want:
            raise exl3.Exl3FormatError(
                f"{prefix}.{name}: expected {want[0]} {want[1]}, found {parts[name][0]} {parts[name][1]}"
            )
        scales.append(name)
    return Exl3Group(prefix, bits, codebook, k, n, scales[0], scales[1], "bias" in parts)


def _headers(reader: CheckpointReader) -> dict[str, tuple[str, list[int]]]:
    """(dtype, shape) of every tensor, from the safetensors headers only."""
    out: dict[str, tuple[str, list[int]]] = {}
    for fname in sorted(set(reader.file_of.values())):
        with safe_open(str(reader.path / fname), framework="pt") as handle:
            for name in handle.keys():
                part = handle.get_slice(name)
                out[name] = (part.get_dtype(), list(part.get_shape()))
    return out


def _marker_value(reader: CheckpointReader, name: str) -> int:
    """A scalar int32 marker's stored bits as an unsigned integer."""
    path = reader.path / reader.file_of[name]
    with open(path, "rb") as f:
        size = struct.unpack("<Q", f.read(8))[0]
        entry = json.loads(f.read(size))[name]
        f.seek(8 + size + entry["data_offsets"][0])
        return struct.unpack("<I", f.read(4))[0]


class Exl3Index:
    """Every EXL3 group of a checkpoint, checked once (`of(reader)` caches it per reader)."""

    _cache: weakref.WeakKeyDictionary[CheckpointReader, Exl3Index] = weakref.WeakKeyDictionary()

    def __init__(self, reader: CheckpointReader) -> None:
        config_path = reader.path / "config.json"
        self.config = quantization_config(json.loads(config_path.read_text())) if config_path.exists() else {}
        headers = _headers(reader)
        by_prefix: dict[str, dict[str, tuple[str, list[int]]]] = {}
        for name, meta in headers.items():
            prefix, _, part = name.rpartition(".")
            if part in PARTS and (prefix + ".trellis" in headers or part == "trellis"):
                by_prefix.setdefault(prefix, {})[part] = meta
        self.groups = {prefix: parse_group(prefix, parts) for prefix, parts in sorted(by_prefix.items())}
        self._check(reader, headers)

    @classmethod
    def of(cls, reader: CheckpointReader) -> Exl3Index:
        if reader not in cls._cache:
            cls._cache[reader] = cls(reader)
        return cls._cache[reader]

    def _check(self, reader: CheckpointReader, headers: dict[str, Any]) -> None:
        stated = self.config.get("quant_method")
        if stated == "exl3" and not self.groups:
            raise CheckpointError(f"{reader.path}/config.json says quant_method exl3 but no tensor ends in .trellis")
        want = self.config.get("codebook")
        for group in self.groups.values():
            if not _MLP_PROJECTION.search(group.prefix):
                raise CheckpointError(
                    f"{group.prefix}.trellis: this engine reads EXL3 only for MLP projections "
                    f"(gate/up/down_proj); found a {group.bits:g}-bit {group.codebook} group here"
                )
            if want and group.codebook != want:
                raise CheckpointError(
                    f"{group.prefix}.trellis: quantization_config says codebook {want}, but the "
                    f"group has {'.' + group.codebook if group.codebook != '3inst' else 'no'} "
                    f"marker ({group.codebook})"
                )
            if group.codebook != "3inst":
                marker = f"{group.prefix}.{group.codebook}"
                value = _marker_value(reader, marker)
                if value != exl3.MARKERS[group.codebook]:
                    raise CheckpointError(
                        f"{marker}: holds {value:#010x}, the {group.codebook} marker is "
                        f"{exl3.MARKERS[group.codebook]:#010x}"
                    )
            mlp = group.prefix.rsplit(".", 1)[0]
            for sibling in ("gate_proj", "up_proj", "down_proj"):
                if f"{mlp}.{sibling}.weight" in headers:
                    raise CheckpointError(
                        f"{mlp}: {group.prefix.rsplit('.', 1)[1]} is EXL3 but {sibling}.weight is "
                        f"plain; one MLP's projections must share a format (they split alike)"
                    )

    def load(self, reader: CheckpointReader, prefix: str, split_dim: int | None) -> exl3.Exl3Linear:
        """This rank's part of group `prefix`: whole 128-blocks of outputs (split_dim 0) or inputs (split_dim 1)."""
        group = self.groups[prefix]
        get = _raw_reader(reader)
        trellis, suh, svh = (
            get(prefix + ".trellis"),
            get(f"{prefix}.{group.in_scales}"),
            get(f"{prefix}.{group.out_scales}"),
        )
        suh = suh if group.in_scales == "suh" else exl3.unpack_signs(suh)
        svh = svh if group.out_scales == "svh" else exl3.unpack_signs(svh)
        bias = get(prefix + ".bias") if group.bias else None
        if split_dim is not None and reader.group.world > 1:
            size = group.out_features if split_dim == 0 else group.in_features
            start, stop = shard_range(size // exl3.HADAMARD_BLOCK, reader.group.rank, reader.group.world)
            lo, hi = start * exl3.HADAMARD_BLOCK, stop * exl3.HADAMARD_BLOCK
            tiles = slice(lo // exl3.TILE, hi // exl3.TILE)
            if split_dim == 0:
                trellis, svh = trellis[:, tiles], svh[lo:hi]
                bias = None if bias is None else bias[lo:hi]
            else:
                trellis, suh = trellis[tiles], suh[lo:hi]
                bias = None if bias is None or reader.group.rank else bias  # a row-parallel bias is added once
        return exl3.Exl3Linear(trellis.contiguous(), suh.contiguous(), svh.contiguous(), group.codebook, bias)


def _raw_reader(reader: CheckpointReader):
    """Tensors exactly as stored (int16 trellis bits, fp16 scales), bypassing the reader's dtype conversion."""

    def get(name: str) -> torch.Tensor:
        if name not in reader.file_of:
            raise CheckpointError(f"tensor {name} is missing from {reader.path}")
        with safe_open(str(reader.path / reader.file_of[name]), framework="pt") as handle:
            return handle.get_tensor(name)

    return get


def read_projection(reader: CheckpointReader, prefix: str, dim: int | None) -> torch.Tensor:
    """This rank's weight [out, in] of projection `prefix` (e.g. `...experts.3.gate_proj`), split along `dim`
    (0: outputs, 1: inputs): the plain `.weight` when there is one, else the EXL3 group decoded."""
    if reader.has(prefix + ".weight"):
        return reader.get(prefix + ".weight", dim=dim)
    index = Exl3Index.of(reader)
    if prefix not in index.groups:
        raise CheckpointError(f"{reader.path}: neither {prefix}.weight nor an EXL3 group {prefix}.trellis")
    linear = index.load(reader, prefix, dim)
    if linear.bias is not None:
        raise CheckpointError(f"{prefix}.bias: the MLP projections of this model have no bias; found one")
    weight = linear.dequantize(torch.float32).t()  # [K, N] -> [out, in]
    return weight.to(device=reader.device, dtype=reader.dtype).contiguous()


def read_expert_banks(
    reader: CheckpointReader, prefix: str, experts: int
) -> tuple[exl3.Exl3Bank, exl3.Exl3Bank] | None:
    """A MoE layer's routed experts as two `Exl3Bank`s kept in EXL3 form (gate/up: expert e's gate is matrix 2e,
    its up 2e+1; down: expert e), this rank's whole-block TP parts — what `ops.Exl3Experts` computes with.
    `prefix` e.g. `model.language_model.layers.3.mlp.`; None when the routed experts are not EXL3 (plain weights),
    or not one width and codebook per bank: those load through `read_projection` (decoded)."""
    names = {
        proj: [f"{prefix}experts.{e}.{proj}" for e in range(experts)] for proj in ("gate_proj", "up_proj", "down_proj")
    }
    if reader.has(names["gate_proj"][0] + ".weight"):
        return None
    index = Exl3Index.of(reader)
    for proj in ("gate_proj", "down_proj"):
        wanted = names[proj] + names["up_proj"] if proj == "gate_proj" else names[proj]
        bank = [index.groups[n] for n in wanted if n in index.groups]
        if len(bank) != len(wanted) or len({(g.bits, g.codebook, g.in_features, g.out_features) for g in bank}) != 1:
            return None
    gate_up = _bank(reader, index, [n for pair in zip(names["gate_proj"], names["up_proj"]) for n in pair], 0)
    return gate_up, _bank(reader, index, names["down_proj"], 1)


def _bank(reader: CheckpointReader, index: Exl3Index, prefixes: list[str], split_dim: int) -> exl3.Exl3Bank:
    """The groups `prefixes` (one shape and format) read for this rank and stacked on the reader's device."""

    def stack(t: torch.Tensor) -> torch.Tensor:
        return torch.empty(len(prefixes), *t.shape, dtype=t.dtype, device=reader.device)

    first = index.load(reader, prefixes[0], split_dim)
    trellis, suh, svh = stack(first.trellis), stack(first.suh), stack(first.svh)
    for i, prefix in enumerate(prefixes):
        linear = first if i == 0 else index.load(reader, prefix, split_dim)
        if linear.bias is not None:
            raise CheckpointError(f"{prefix}.bias: the MLP projections of this model have no bias; found one")
        trellis[i].copy_(linear.trellis)
        suh[i].copy_(linear.suh)
        svh[i].copy_(linear.svh)
    return exl3.Exl3Bank(trellis, suh, svh, index.groups[prefixes[0]].codebook)
