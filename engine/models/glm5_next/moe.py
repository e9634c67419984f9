"""Feed-forward blocks: the dense SwiGLU MLP of the first layers and the routed mixture of experts.

Router: sigmoid scores in fp32; the correction bias joins the scores only to choose the top-k experts; the chosen
experts' unbiased scores are renormalised to sum to one and multiplied by the routed scaling factor. One shared
expert always runs. Every SwiGLU clamps (gate ≤ limit, |up| ≤ limit).

Tensor parallel: every expert (and the dense MLP) is split along its intermediate width: gate/up column-wise, down
row-wise. The routed and shared outputs of a rank are one partial sum, reduced once per layer.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable

import torch

from engine import ops
from engine.checkpoint.exl3 import read_expert_banks, read_projection
from engine.checkpoint.loader import CheckpointReader
from engine.models.glm5_next.config import TextConfig
from engine.parallel import ParallelGroup
from engine.quant.dense import Store, Weight, keep

# prompt chunks of bf16 experts on a GPU run as two grouped GEMMs (`MoE._grouped`; fp32 weights, the exact GPU mode,
# keep the loop); False: the loop over experts (bench/gpu_engine.py --moe-loop times the two against each other)
GROUPED_GEMM = True
# a few tokens' MoE on a GPU with the shared expert outside the routed experts' bank (EXL3 experts, or a reduced
# shared expert beside bf16 ones): the shared expert's products run on a second stream beside the router and the
# routed experts — a fork and a join, captured into the step's graph as two branches — so its launches' fixed costs
# overlap theirs; the same kernels on the same inputs, so the same bits. False: one stream (bench/gpu_engine.py
# --shared-inline times the two)
SHARED_BESIDE = True


def _no_grouped_gemm(exc: Exception) -> None:
    global GROUPED_GEMM
    GROUPED_GEMM = False
    logging.getLogger("engine.moe").warning("grouped GEMMs failed (%s); prompt MoE runs a loop over experts", exc)


def _tensor(weight: Weight) -> torch.Tensor:
    """A bank member's weight: a plain tensor (routed experts are never reduced; a reduced shared expert stays out)."""
    if not isinstance(weight, torch.Tensor):
        raise TypeError(f"a {type(weight).__name__} cannot join the stacked expert bank")
    return weight


class SwiGLU:
    """gate/up [I_local, hidden], down [hidden, I_local]; returns this rank's partial sum."""

    def __init__(self, reader: CheckpointReader, prefix: str, limit: float, store: Store = keep) -> None:
        # plain .weight or an EXL3 group decoded on load (engine/checkpoint/exl3.py); `store` keeps a dense MLP's and
        # the shared expert's weights in the dense mode (routed experts are not dense weights: kept as loaded)
        self.gate_up = store(
            torch.cat(
                [
                    read_projection(reader, prefix + "gate_proj", dim=0),
                    read_projection(reader, prefix + "up_proj", dim=0),
                ]
            )
        )
        self.down = store(read_projection(reader, prefix + "down_proj", dim=1))
        self.limit = limit

    def partial(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = ops.linear(x, self.gate_up).chunk(2, dim=-1)
        return ops.linear(ops.swiglu_clamped(gate, up, self.limit), self.down)


class DenseMLP:
    def __init__(
        self, cfg: TextConfig, reader: CheckpointReader, prefix: str, group: ParallelGroup, store: Store = keep
    ) -> None:
        self.mlp, self.group = SwiGLU(reader, prefix + "mlp.", cfg.swiglu_limit, store), group

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return self.group.sum_partials(self.mlp.partial(x))


class MoE:
    def __init__(
        self, cfg: TextConfig, reader: CheckpointReader, prefix: str, group: ParallelGroup, store: Store = keep
    ) -> None:
        p = prefix + "mlp."
        self.group = group
        self.top_k, self.scale, self.renorm = cfg.num_experts_per_tok, cfg.routed_scaling_factor, cfg.norm_topk_prob
        # fp32 on every device, as stored and as the reference keeps them (`layout.kept_fp32`): a bias rounded to bf16
        # can change which experts a token picks
        self.router = reader.get(p + "gate.weight")
        self.bias = reader.get(p + "gate.e_score_correction_bias")
        # on CUDA, EXL3 routed experts stay EXL3 (engine/checkpoint/exl3.py); elsewhere they are decoded on load
        banks = read_expert_banks(reader, p, cfg.n_routed_experts) if self.router.is_cuda else None
        self.exl3 = ops.Exl3Experts(*banks) if banks is not None else None
        self.experts = (
            []
            if self.exl3 is not None
            else [SwiGLU(reader, f"{p}experts.{e}.", cfg.swiglu_limit) for e in range(cfg.n_routed_experts)]
        )
        self.shared = SwiGLU(reader, p + "shared_experts.", cfg.swiglu_limit, store)
        self.limit = cfg.swiglu_limit
        self.num_routed = cfg.n_routed_experts
        # the shared expert joins the routed experts' bank (as expert E) when it has their shape and type: one more
        # pair (kept in a reduced dense mode, it runs on its own)
        self.shared_in_bank = (
            self.exl3 is None
            and isinstance(self.shared.gate_up, torch.Tensor)
            and self.experts[0].gate_up.shape == self.shared.gate_up.shape
            and self.experts[0].down.shape == self.shared.down.shape
        )
        self.stacked = self._stack() if self.router.is_cuda and self.exl3 is None else None

    def _stack(self) -> tuple[torch.Tensor, torch.Tensor]:
        """All experts' weights (the shared one last, when `shared_in_bank`) as [E, 2I, H] and [E, H, I] for the GPU
        kernels; the per-expert tensors become views into them, so nothing is held twice."""
        members = self.experts + ([self.shared] if self.shared_in_bank else [])
        gate_up = torch.stack([_tensor(e.gate_up) for e in members])
        down = torch.stack([_tensor(e.down) for e in members])
        for i, expert in enumerate(members):
            expert.gate_up, expert.down = gate_up[i], down[i]
        return gate_up, down

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Chosen experts [N, k] and their weights [N, k] for tokens x [N, hidden]."""
        scores = ops.sigmoid(ops.linear(x.float(), self.router))  # the router runs in fp32
        chosen = torch.topk(scores + self.bias, self.top_k, dim=-1).indices
        weights = scores.gather(-1, chosen)
        if self.renorm:
            weights = weights / (weights.sum(-1, keepdim=True) + 1e-20)
        return chosen, weights * self.scale

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if ops.moe_decode_applies(x, self.top_k, self.stacked if self.exl3 is None else self.exl3):
            return self.group.sum_partials(self._decode(x))
        chosen, weights = self.route(x)
        out = self.shared.partial(x)
        if self.exl3 is not None:
            return self.group.sum_partials(self.exl3(x, chosen, weights, self.limit, add=out))
        if self.stacked is not None and GROUPED_GEMM and self.stacked[0].dtype == torch.bfloat16:
            try:
                return self.group.sum_partials(self._grouped(x, chosen, weights, out))
            except RuntimeError as exc:  # a GPU or torch without grouped GEMMs: the loop from now on
                _no_grouped_gemm(exc)
        for expert in chosen.unique().tolist():
            token, slot = (chosen == expert).nonzero(as_tuple=True)
            out.index_add_(0, token, self.experts[expert].partial(x[token]) * weights[token, slot, None])
        return self.group.sum_partials(out)

    def _grouped(
        self, x: torch.Tensor, chosen: torch.Tensor, weights: torch.Tensor, base: torch.Tensor | None = None
    ) -> torch.Tensor:
        """A prompt chunk's routed experts on a GPU: the (token, expert) pairs sorted by expert once, then gate‖up and
        down as two grouped GEMMs over the stacked bank (torch's `_grouped_mm`: one launch each, tensor cores, no host
        read), the pairs' outputs weighted and summed back per token in a fixed order onto `base` (the shared
        expert's output, if given): bf16 between the products, each step reading the last one's output as stored."""
        if self.stacked is None:
            raise RuntimeError("the grouped MoE runs over the stacked experts, which this layer does not hold")
        gate_up, down = self.stacked
        flat = chosen.flatten()
        order = torch.argsort(flat, stable=True)
        token = order // self.top_k
        ends = torch.cumsum(torch.bincount(flat, minlength=gate_up.shape[0]), 0).to(torch.int32)
        # x rounded once per token, then gathered per pair (the same bits as rounding each gathered row)
        hidden = torch._grouped_mm(x.to(gate_up.dtype)[token], gate_up.transpose(1, 2), offs=ends)
        gate, up = hidden.chunk(2, dim=-1)  # read as they are: widened inside the kernel, not copied to fp32
        act = ops.swiglu_clamped(gate, up, self.limit, out_dtype=down.dtype)
        routed = torch._grouped_mm(act, down.transpose(1, 2), offs=ends)
        # each token's k pairs weighted and summed in slot order onto the shared expert's output (an index_add_
        # over the sorted pairs adds a token's rows by atomics, in no fixed order: measured on the H200, the same
        # prompt's logits 0.012 apart between two prefills)
        return ops.combine_pairs(routed, order, weights, base)

    def _decode(self, x: torch.Tensor) -> torch.Tensor:
        """A few tokens on a GPU (engine/ops/triton_moe.py): the router's matmul, then routing in one kernel (the
        torch form, `route`, is ten launches), gate‖up and down as sync-free kernels, each chosen expert read once, the
        shared expert one more pair when it is in the bank; EXL3 experts through their decode-GEMV
        (engine/ops/triton_exl3.py), the shared expert beside them (SHARED_BESIDE: on the device's second stream),
        joined just before the routed sum's launch, which adds it (the bits of `shared + routed`)."""
        beside = SHARED_BESIDE and (self.exl3 is not None or not self.shared_in_bank)
        shared = self._shared_beside(x) if beside else functools.partial(self.shared.partial, x)
        chosen, weights = ops.moe_route(
            ops.linear(x, self.router),
            self.bias,
            self.top_k,
            self.scale,
            self.renorm,
            self.num_routed if self.shared_in_bank else None,
        )
        if self.exl3 is not None:  # the shared expert joined and added in the routed sum's launch
            return self.exl3(x, chosen, weights, self.limit, add=shared)
        if self.stacked is None:
            raise RuntimeError("the fused MoE runs over the stacked experts, which this layer does not hold")
        gate_up, down = self.stacked
        out = ops.moe_experts(x, chosen, weights, gate_up, down, self.limit)
        return out if self.shared_in_bank else out + shared()

    def _shared_beside(self, x: torch.Tensor) -> Callable[[], torch.Tensor]:
        """The shared expert's output begun on the device's second stream; the call returned joins it onto this one.
        Its dense products may split their inputs, and triton_dense's slice counters allow one such launch at a time
        on a device: what runs meanwhile here (the router, the routing, the EXL3 kernels) launches none."""
        here, side = torch.cuda.current_stream(x.device), ops.beside_stream(x.device)
        side.wait_stream(here)
        with torch.cuda.stream(side):
            out = self.shared.partial(x)

        def join() -> torch.Tensor:
            here.wait_stream(side)
            out.record_stream(here)  # made on the side stream, read (and freed) on this one
            return out

        return join
