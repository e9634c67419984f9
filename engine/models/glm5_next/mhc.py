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


class HyperConnection:
    def __init__(self, cfg: TextConfig, reader: CheckpointReader, prefix: str) -> None:
        self.n, self.eps, self.iters, self.norm_eps = cfg.hc_mult, cfg.hc_eps, cfg.hc_sinkhorn_iters, cfg.rms_norm_eps
        fn = reader.get(prefix + "_fn")  # used in fp32 products; bf16 values (a GPU's load) kept as they are
        self.fn = fn if fn.dtype == torch.bfloat16 else fn.float()
        self.base = reader.get(prefix + "_base").float()
        self.scale = reader.get(prefix + "_scale").float()
        # the hyper-connection the new streams go to next in the layer stack (linked by the model at load: a stack
        # cut short later, as bench/gpu_engine.py's per-layer times, still makes the sums for the next one, unused),
        # and the partial sums it may take, made for it by this one's last launch: (the streams they are of,
        # (dots, Gram))
        self.next: HyperConnection | None = None
        self.ahead: tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]] | None = None

    def weights(self, streams: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """streams [N_tok, n, hidden] -> pre [N_tok, n], post [N_tok, n], comb [N_tok, n, n]."""
        return ops.hc_weights(streams, self.fn, self.base, self.scale, self.eps, self.norm_eps, self.iters)

    def around(self, streams: torch.Tensor, sublayer, norm: torch.Tensor, norm_eps: float) -> torch.Tensor:
        """Run `sublayer` on the mixed-down streams, RMS-normalised with weight `norm`, and fold its output back in
        (`ops.hc_around`: fused kernels on a GPU, decode steps and prompt chunks alike). On a GPU step the launch
        that makes the new streams also starts `next`'s sums over them; `next` takes those only for these very
        streams (the tensor it is handed)."""
        ahead, self.ahead = self.ahead, None
        partials = ahead[1] if ahead is not None and ahead[0] is streams else None
        new, made = ops.hc_around(
            streams, sublayer, self.fn, self.base, self.scale, norm, self.eps, self.norm_eps, norm_eps, self.iters,
            partials, None if self.next is None else self.next.fn,
        )  # fmt: skip
        if made is not None and self.next is not None:
            self.next.ahead = (new, made)
        return new
