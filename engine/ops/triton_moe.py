"""Routed experts for a few rows at a time (decode), on the GPU, without a host sync.

One Triton program computes a block of outputs for one (row, chosen expert) pair, streaming that expert's weight
rows from memory once; the expert id is read on the device, so the launch shape depends only on the number of pairs
(CUDA-graph friendly). Each pair's result depends on its own row alone, so a row's output never depends on the rest
of the batch. Weights are any float type (bf16 on GPUs); accumulation is fp32.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _pair_gemv(x_ptr, w_ptr, expert_ptr, out_ptr, rows_per_pair, stride_expert,
               K: tl.constexpr, N: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    pair = tl.program_id(0)
    block = tl.program_id(1)
    expert = tl.load(expert_ptr + pair).to(tl.int64)
    row = pair // rows_per_pair
    offs_n = block * BLOCK_N + tl.arange(0, BLOCK_N)
    live_n = offs_n < N
    acc = tl.zeros([BLOCK_N], dtype=tl.float32)
    weights = w_ptr + expert * stride_expert
    for k0 in range(0, K, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        live_k = offs_k < K
        x = tl.load(x_ptr + row * K + offs_k, mask=live_k, other=0.0).to(tl.float32)
        w = tl.load(weights + offs_n[:, None].to(tl.int64) * K + offs_k[None, :],
                    mask=live_n[:, None] & live_k[None, :], other=0.0).to(tl.float32)
        acc += tl.sum(w * x[None, :], axis=1)
    tl.store(out_ptr + pair * N + offs_n, acc, mask=live_n)


def pair_gemv(x: torch.Tensor, weights: torch.Tensor, experts: torch.Tensor, rows_per_pair: int,
              block_n: int = 32, block_k: int = 256) -> torch.Tensor:
    """out[p] = weights[experts[p]] @ x[p // rows_per_pair]; x [R, K] fp32, weights [E, N, K], experts [P] -> [P, N]."""
    x = x.contiguous()
    pairs, (num_experts, n, k) = experts.numel(), weights.shape
    out = torch.empty(pairs, n, dtype=torch.float32, device=x.device)
    grid = (pairs, triton.cdiv(n, block_n))
    _pair_gemv[grid](x, weights, experts.contiguous(), out, rows_per_pair, weights.stride(0),
                     K=k, N=n, BLOCK_N=block_n, BLOCK_K=block_k)
    return out


def routed_experts(x: torch.Tensor, chosen: torch.Tensor, weights: torch.Tensor, gate_up: torch.Tensor,
                   down: torch.Tensor, limit: float) -> torch.Tensor:
    """Sum over each row's chosen experts of weight · down(swiglu(gate_up(x))). x [T, H] fp32; chosen, weights
    [T, k]; gate_up [E, 2I, H]; down [E, H, I]. Returns [T, H] fp32 (this rank's partial sum)."""
    from engine.ops.reference import swiglu_clamped

    rows, k = chosen.shape
    experts = chosen.reshape(-1).to(torch.int32)
    gate, up = pair_gemv(x, gate_up, experts, rows_per_pair=k).chunk(2, dim=-1)
    hidden = swiglu_clamped(gate, up, limit)
    out = pair_gemv(hidden, down, experts, rows_per_pair=1).view(rows, k, -1)
    return (out * weights.unsqueeze(-1)).sum(1)
