"""Manifold-constrained hyper-connections: `hc_mult` residual streams around every sublayer.

From the streams (flattened, RMS-normalised without weight) one fp32 linear map gives 2N + N² logits: `pre` mixes the
N streams into the sublayer's input, `post` spreads the sublayer's output back over the streams, and `comb` (made
doubly stochastic by Sinkhorn iterations) mixes the old streams into the new ones:
    streams' = post ⊗ f(pre · streams) + combᵀ · streams.
All of it runs in fp32: the Sinkhorn floor (1e-6) is below bf16's resolution near one.
"""

from __future__ import annotations

import torch

from engine import ops
from engine.checkpoint.loader import CheckpointReader
from engine.models.glm5_next.config import TextConfig

FUSED_MAX_TOKENS = 64   # up to this many tokens (decode, verify windows) the fused kernels; beyond, torch ops


class HyperConnection:
    def __init__(self, cfg: TextConfig, reader: CheckpointReader, prefix: str) -> None:
        self.n, self.eps, self.iters, self.norm_eps = cfg.hc_mult, cfg.hc_eps, cfg.hc_sinkhorn_iters, cfg.rms_norm_eps
        self.fn = reader.get(prefix + "_fn").float()
        self.base = reader.get(prefix + "_base").float()
        self.scale = reader.get(prefix + "_scale").float()

    def weights(self, streams: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """streams [N_tok, n, hidden] -> pre [N_tok, n], post [N_tok, n], comb [N_tok, n, n]."""
        n = self.n
        flat = ops.rms_norm(streams.flatten(1), None, self.norm_eps)
        logits = ops.linear(flat, self.fn)
        pre_l, post_l, comb_l = logits.split([n, n, n * n], dim=-1)
        pre_b, post_b, comb_b = self.base.split([n, n, n * n])
        pre = torch.sigmoid(pre_l * self.scale[0] + pre_b) + self.eps
        post = 2 * torch.sigmoid(post_l * self.scale[1] + post_b)
        comb = torch.softmax((comb_l * self.scale[2] + comb_b).view(-1, n, n), dim=-1) + self.eps
        if comb.is_cuda:
            from engine.ops.triton_mhc import sinkhorn

            return pre, post, sinkhorn(comb, self.iters, self.eps)
        comb = comb / (comb.sum(-2, keepdim=True) + self.eps)
        for _ in range(self.iters - 1):
            comb = comb / (comb.sum(-1, keepdim=True) + self.eps)
            comb = comb / (comb.sum(-2, keepdim=True) + self.eps)
        return pre, post, comb

    def around(self, streams: torch.Tensor, sublayer, norm: torch.Tensor, norm_eps: float) -> torch.Tensor:
        """Run `sublayer` on the mixed-down streams, RMS-normalised with weight `norm`, and fold its output back in.
        A few tokens on a GPU (decode): three fused kernels around the sublayer (engine/ops/triton_mhc.py)."""
        if streams.is_cuda and streams.shape[0] <= FUSED_MAX_TOKENS and self.n & (self.n - 1) == 0:
            from engine.ops.triton_mhc import hc_post, hc_pre

            x, post, comb = hc_pre(streams, self.fn, self.base, self.scale, norm, self.eps, self.norm_eps, norm_eps,
                                   self.iters)
            return hc_post(streams, sublayer(x), post, comb)
        pre, post, comb = self.weights(streams)
        out = sublayer(ops.rms_norm((pre.unsqueeze(-1) * streams).sum(1), norm, norm_eps))
        return post.unsqueeze(-1) * out.unsqueeze(1) + comb.transpose(-1, -2) @ streams
