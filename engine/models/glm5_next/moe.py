"""Feed-forward blocks: the dense SwiGLU MLP of the first layers and the routed mixture of experts.

Router: sigmoid scores in fp32; the correction bias joins the scores only to choose the top-k experts; the chosen
experts' unbiased scores are renormalised to sum to one and multiplied by the routed scaling factor. One shared
expert always runs. Every SwiGLU clamps (gate ≤ limit, |up| ≤ limit).

Tensor parallel: every expert (and the dense MLP) is split along its intermediate width: gate/up column-wise, down
row-wise. The routed and shared outputs of a rank are one partial sum, reduced once per layer.
"""

from __future__ import annotations

import torch

from engine import ops
from engine.checkpoint.loader import CheckpointReader
from engine.models.glm5_next.config import TextConfig
from engine.parallel import ParallelGroup


class SwiGLU:
    """gate/up [I_local, hidden], down [hidden, I_local]; returns this rank's partial sum."""

    def __init__(self, reader: CheckpointReader, prefix: str, limit: float) -> None:
        self.gate_up = torch.cat([reader.get(prefix + "gate_proj.weight", dim=0),
                                  reader.get(prefix + "up_proj.weight", dim=0)])
        self.down = reader.get(prefix + "down_proj.weight", dim=1)
        self.limit = limit

    def partial(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = (x @ self.gate_up.t()).chunk(2, dim=-1)
        return ops.swiglu_clamped(gate, up, self.limit) @ self.down.t()


class DenseMLP:
    def __init__(self, cfg: TextConfig, reader: CheckpointReader, prefix: str, group: ParallelGroup) -> None:
        self.mlp, self.group = SwiGLU(reader, prefix + "mlp.", cfg.swiglu_limit), group

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return self.group.sum_partials(self.mlp.partial(x))


class MoE:
    def __init__(self, cfg: TextConfig, reader: CheckpointReader, prefix: str, group: ParallelGroup) -> None:
        p = prefix + "mlp."
        self.group = group
        self.top_k, self.scale, self.renorm = cfg.num_experts_per_tok, cfg.routed_scaling_factor, cfg.norm_topk_prob
        self.router = reader.get(p + "gate.weight")
        self.bias = reader.get(p + "gate.e_score_correction_bias")
        self.experts = [SwiGLU(reader, f"{p}experts.{e}.", cfg.swiglu_limit) for e in range(cfg.n_routed_experts)]
        self.shared = SwiGLU(reader, p + "shared_experts.", cfg.swiglu_limit)

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Chosen experts [N, k] and their weights [N, k] for tokens x [N, hidden]."""
        scores = torch.sigmoid(x.float() @ self.router.t())
        chosen = torch.topk(scores + self.bias, self.top_k, dim=-1).indices
        weights = scores.gather(-1, chosen)
        if self.renorm:
            weights = weights / (weights.sum(-1, keepdim=True) + 1e-20)
        return chosen, weights * self.scale

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        chosen, weights = self.route(x)
        out = self.shared.partial(x)
        for expert in chosen.unique().tolist():
            token, slot = (chosen == expert).nonzero(as_tuple=True)
            out.index_add_(0, token, self.experts[expert].partial(x[token]) * weights[token, slot, None])
        return self.group.sum_partials(out)
