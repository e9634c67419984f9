"""GLM-5.3-Flash's vision tower (`model.visual.*`): image patches in, one LM embedding row per 2×2 patches out.

The forward, as transformers' `glm5_next` defines it (the numerical reference; the tests compare the two):
- patch embedding: a linear map of each flattened patch (channels × temporal patch × patch²; the checkpoint stores it
  as a Conv3d whose stride equals its kernel, which is that product);
- `depth` pre-norm blocks: RMSNorm, attention (one qkv product with bias, per-head RMSNorm of q and k, an axial 2-D
  rotary — a patch's row angles on the first half of each rotated half, its column angles on the second — then full
  bidirectional attention among the patches of one frame), RMSNorm, a clamped SwiGLU MLP with biases;
- a final RMSNorm; each 2×2 block of patches (patches come block-major from the processor) mapped to one row by the
  `downsample` convolution (kernel = stride = 2, i.e. a linear map of the block's four rows);
- the merger: a linear map, LayerNorm, exact GELU, a clamped SwiGLU MLP: the rows the text model takes in place of the
  `<|image|>` tokens' embeddings.

A video is frames in pairs (the temporal patch); each pair is attended to alone, as an image is. The tower runs on
rank 0 only (engine/serve.py): its rows travel to every rank with the prompt chunk they belong to.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from engine.checkpoint.loader import CheckpointReader
from engine.parallel import ParallelGroup

PREFIX = "model.visual."


@dataclass(frozen=True)
class VisionConfig:
    depth: int
    hidden_size: int
    num_heads: int
    intermediate_size: int
    out_hidden_size: int
    projection_intermediate_size: int
    patch_size: int
    temporal_patch_size: int
    spatial_merge_size: int
    in_channels: int = 3
    rms_norm_eps: float = 1e-5
    swiglu_limit: float = 10.0
    rope_theta: float = 10000.0

    @classmethod
    def from_dict(cls, v: dict[str, Any]) -> VisionConfig:
        rope = v.get("rope_parameters") or {}
        return cls(
            depth=int(v["depth"]),
            hidden_size=int(v["hidden_size"]),
            num_heads=int(v["num_heads"]),
            intermediate_size=int(v["intermediate_size"]),
            out_hidden_size=int(v["out_hidden_size"]),
            projection_intermediate_size=int(v["projection_intermediate_size"]),
            patch_size=int(v.get("patch_size", 14)),
            temporal_patch_size=int(v.get("temporal_patch_size", 2)),
            spatial_merge_size=int(v.get("spatial_merge_size", 2)),
            in_channels=int(v.get("in_channels", 3)),
            rms_norm_eps=float(v.get("rms_norm_eps", 1e-5)),
            swiglu_limit=float(v.get("swiglu_limit", 10.0)),
            rope_theta=float(rope.get("rope_theta", 10000.0)),
        )

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def patch_width(self) -> int:
        """Values in one flattened patch (the processor's rows)."""
        return self.in_channels * self.temporal_patch_size * self.patch_size**2


@dataclass(frozen=True)
class ImageTokens:
    """Where one image's rows go: the token ids of the image markup (for the tokenizer side)."""

    image: int
    begin: int
    end: int
    video_begin: int
    video_end: int
    video: int  # the template's one placeholder per video, replaced by its frames' markup

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> ImageTokens:
        return cls(
            image=int(config["image_token_id"]),
            begin=int(config["image_start_token_id"]),
            end=int(config["image_end_token_id"]),
            video_begin=int(config["video_start_token_id"]),
            video_end=int(config["video_end_token_id"]),
            video=int(config["video_token_id"]),
        )


def read_config(path: str | Path) -> dict[str, Any]:
    return dict(json.loads((Path(path) / "config.json").read_text()))


def has_tower(path: str | Path) -> bool:
    """Whether a checkpoint carries a vision tower (its config and weights)."""
    config = read_config(path)
    if not config.get("vision_config") or "image_token_id" not in config:
        return False
    return CheckpointReader(path, ParallelGroup.single()).has(PREFIX + "patch_embed.proj.weight")


def _rms(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm as the reference does it: statistics in fp32, the weight applied in the input's dtype."""
    dtype = x.dtype
    x32 = x.float()
    return weight * (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)).to(dtype)


def _swiglu(x: torch.Tensor, gate: Linear, up: Linear, down: Linear, limit: float) -> torch.Tensor:
    g = F.linear(x, *gate).clamp(max=limit)
    u = F.linear(x, *up).clamp(-limit, limit)
    return F.linear(F.silu(g) * u, *down)


ATTEND_ELEMENTS = 2**27  # the CPU's attention scores at most this many at once (0.5 GiB in fp32): query blocks


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Bidirectional attention within one frame: q, k, v [n, heads, dim] -> [n, heads * dim]. On CUDA one fused
    kernel (4-D contiguous operands, so torch picks flash or memory-efficient attention, never the [heads, n, n]
    scores); on the CPU the scores in query blocks, so a 4K image (~32k patches) never holds all of them at once."""
    n, heads, _ = q.shape
    q, k, v = (t.transpose(0, 1).unsqueeze(0).contiguous() for t in (q, k, v))
    if q.is_cuda:
        out = F.scaled_dot_product_attention(q, k, v)
    else:
        block = max(1, ATTEND_ELEMENTS // (heads * n))
        out = torch.cat([F.scaled_dot_product_attention(q[:, :, s : s + block], k, v) for s in range(0, n, block)], 2)
    return out[0].transpose(0, 1).reshape(n, -1)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    turned = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + turned * sin


Linear = tuple[torch.Tensor, torch.Tensor | None]  # weight, bias


@dataclass(frozen=True)
class _Block:
    norm1: torch.Tensor
    norm2: torch.Tensor
    qkv: Linear
    q_norm: torch.Tensor
    k_norm: torch.Tensor
    proj: Linear
    gate: Linear
    up: Linear
    down: Linear

    def tensors(self) -> list[torch.Tensor]:
        out = [self.norm1, self.norm2, self.q_norm, self.k_norm]
        for weight, bias in (self.qkv, self.proj, self.gate, self.up, self.down):
            out += [weight] if bias is None else [weight, bias]
        return out


class VisionTower:
    """The tower's weights (whole, on one device) and its forward."""

    def __init__(self, cfg: VisionConfig, reader: CheckpointReader) -> None:
        self.cfg = cfg

        def get(name: str) -> torch.Tensor:
            return reader.get(PREFIX + name)

        def lin(name: str, bias: bool = True) -> Linear:
            return get(name + ".weight"), get(name + ".bias") if bias else None

        conv = get("patch_embed.proj.weight")
        self.patch = (conv.reshape(conv.shape[0], -1).contiguous(), get("patch_embed.proj.bias"))
        self.blocks = [
            _Block(
                norm1=get(f"blocks.{b}.norm1.weight"),
                norm2=get(f"blocks.{b}.norm2.weight"),
                qkv=lin(f"blocks.{b}.attn.qkv"),
                q_norm=get(f"blocks.{b}.attn.q_norm.weight"),
                k_norm=get(f"blocks.{b}.attn.k_norm.weight"),
                proj=lin(f"blocks.{b}.attn.proj"),
                gate=lin(f"blocks.{b}.mlp.gate_proj"),
                up=lin(f"blocks.{b}.mlp.up_proj"),
                down=lin(f"blocks.{b}.mlp.down_proj"),
            )
            for b in range(cfg.depth)
        ]
        self.post_norm = get("post_layernorm.weight")
        down = get("downsample.weight")  # [out, hidden, m, m] -> a linear map of a block's m*m rows, row-major
        self.downsample = (down.permute(0, 2, 3, 1).reshape(down.shape[0], -1).contiguous(), get("downsample.bias"))
        self.merge_proj = lin("merger.proj", bias=False)
        self.merge_norm = (get("merger.post_projection_norm.weight"), get("merger.post_projection_norm.bias"))
        self.merge_gate = lin("merger.gate_proj", bias=False)
        self.merge_up = lin("merger.up_proj", bias=False)
        self.merge_down = lin("merger.down_proj", bias=False)
        spatial = cfg.head_dim // 2
        self.inv_freq = 1.0 / (
            cfg.rope_theta ** (torch.arange(0, spatial, 2, dtype=torch.float32, device=conv.device) / spatial)
        )
        self.dtype, self.device = conv.dtype, conv.device

    @classmethod
    def load(cls, path: str | Path, device: torch.device, dtype: torch.dtype | None = None) -> VisionTower:
        """The tower of the checkpoint at `path`, whole, on `device` (fp32 on the CPU, bf16 on CUDA by default)."""
        config = read_config(path)
        dtype = dtype or (torch.bfloat16 if device.type == "cuda" else torch.float32)
        reader = CheckpointReader(path, ParallelGroup.single(), dtype=dtype, device=device)
        try:
            return cls(VisionConfig.from_dict(config["vision_config"]), reader)
        finally:
            reader.close()

    @property
    def nbytes(self) -> int:
        tensors: list[torch.Tensor] = [*self.patch, self.post_norm, *self.downsample, *self.merge_norm]
        for pair in (self.merge_proj, self.merge_gate, self.merge_up, self.merge_down):
            tensors += [t for t in pair if t is not None]
        for block in self.blocks:
            tensors += block.tensors()
        return sum(t.numel() * t.element_size() for t in tensors)

    def _rotary(self, grids: list[tuple[int, int, int]]) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin [patches, head_dim] for the patches of every grid, in the processor's block-major order."""
        m = self.cfg.spatial_merge_size
        positions = []
        for t, h, w in grids:
            rows = torch.arange(h, device=self.device).view(h // m, m, 1, 1).expand(h // m, m, w // m, m)
            cols = torch.arange(w, device=self.device).view(1, 1, w // m, m).expand(h // m, m, w // m, m)
            block_major = torch.stack([rows.transpose(1, 2).flatten(), cols.transpose(1, 2).flatten()], dim=-1)
            positions.append(block_major.repeat(t, 1))
        angles = torch.cat(positions).float()[..., None] * self.inv_freq  # [N, 2, head_dim / 4]
        both = torch.cat([angles[:, 0], angles[:, 1]], dim=-1)
        both = torch.cat([both, both], dim=-1)
        return both.cos(), both.sin()

    @torch.no_grad()
    def forward(self, patches: torch.Tensor, grids: list[tuple[int, int, int]]) -> torch.Tensor:
        """patches [N, patch_width] (float, any device) of images / videos with `grids` (t, h, w in patches, t in
        temporal patches) -> [N / merge², out_hidden_size] fp32 rows, in the order of the grids."""
        cfg = self.cfg
        if patches.dim() != 2 or patches.shape[1] != cfg.patch_width:
            raise ValueError(f"patches must be [N, {cfg.patch_width}], not {list(patches.shape)}")
        if sum(t * h * w for t, h, w in grids) != patches.shape[0]:
            raise ValueError(f"grids {grids} do not cover {patches.shape[0]} patches")
        x = F.linear(patches.to(self.device, self.dtype), *self.patch)
        cos, sin = self._rotary(grids)
        cos, sin = cos[:, None, :], sin[:, None, :]
        frames = [h * w for t, h, w in grids for _ in range(t)]
        heads, dim = cfg.num_heads, cfg.head_dim
        for block in self.blocks:
            h = _rms(x, block.norm1, cfg.rms_norm_eps)
            q, k, v = F.linear(h, *block.qkv).view(-1, 3, heads, dim).unbind(1)
            q = _rotate(_rms(q, block.q_norm, cfg.rms_norm_eps).float(), cos, sin).to(x.dtype)
            k = _rotate(_rms(k, block.k_norm, cfg.rms_norm_eps).float(), cos, sin).to(x.dtype)
            out = [_attend(*frame) for frame in zip(q.split(frames), k.split(frames), v.split(frames))]
            x = x + F.linear(torch.cat(out), *block.proj)
            h = _rms(x, block.norm2, cfg.rms_norm_eps)
            x = x + _swiglu(h, block.gate, block.up, block.down, cfg.swiglu_limit)
        x = _rms(x, self.post_norm, cfg.rms_norm_eps)
        x = F.linear(x.reshape(-1, cfg.spatial_merge_size**2 * cfg.hidden_size), *self.downsample)
        x = F.linear(x, *self.merge_proj)
        x = F.gelu(F.layer_norm(x, (x.shape[-1],), *self.merge_norm, eps=1e-5))
        x = _swiglu(x, self.merge_gate, self.merge_up, self.merge_down, cfg.swiglu_limit)
        return x.float()
