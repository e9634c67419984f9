"""Routed experts for a few rows at a time (decode), on the GPU, without a host sync.

One Triton program computes a block of outputs for one (row, chosen expert) pair, streaming that expert's weight
rows from memory once; the expert id is read on the device, so the launch shape depends only on the number of pairs
(CUDA-graph friendly). Each pair's result depends on its own row alone, so a row's output never depends on the rest
of the batch. Weights are any float type (bf16 on GPUs); accumulation is fp32.

A decode token's whole MoE is four launches: the router's matmul, `route` (sigmoid, top-k with the correction bias,
renormalised weights, and the shared expert appended as one more pair of weight 1 when it sits in the same bank),
gate‖up for every pair, and down for every pair with the clamped SwiGLU computed on its input and the routing weight
applied to its output; then one sum over a row's pairs.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from engine.ops.triton_dense import _store


@triton.jit
def _pair_gemv(
    x_ptr,
    w_ptr,
    expert_ptr,
    scale_ptr,
    out_ptr,
    rows_per_pair,
    stride_expert,
    limit,
    K: tl.constexpr,
    N: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    SWIGLU: tl.constexpr,
    SCALED: tl.constexpr,
):
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
        if SWIGLU:  # the input is the pair's gate‖up output [2K]: silu(min(gate, limit)) · clamp(up, ±limit)
            gate = tl.minimum(tl.load(x_ptr + row * 2 * K + offs_k, mask=live_k, other=0.0), limit)
            up = tl.load(x_ptr + row * 2 * K + K + offs_k, mask=live_k, other=0.0)
            x = gate * tl.sigmoid(gate) * tl.minimum(tl.maximum(up, -limit), limit)
        else:
            x = tl.load(x_ptr + row * K + offs_k, mask=live_k, other=0.0).to(tl.float32)
        w = tl.load(
            weights + offs_n[:, None].to(tl.int64) * K + offs_k[None, :],
            mask=live_n[:, None] & live_k[None, :],
            other=0.0,
        ).to(tl.float32)
        acc += tl.sum(w * x[None, :], axis=1)
    if SCALED:
        acc = acc * tl.load(scale_ptr + pair)
    tl.store(out_ptr + pair * N + offs_n, acc, mask=live_n)


def pair_gemv(
    x: torch.Tensor,
    weights: torch.Tensor,
    experts: torch.Tensor,
    rows_per_pair: int,
    block_n: int = 32,
    block_k: int = 256,
    swiglu_limit: float | None = None,
    scale: torch.Tensor | None = None,
) -> torch.Tensor:
    """out[p] = weights[experts[p]] @ x[p // rows_per_pair]; x [R, K] fp32, weights [E, N, K], experts [P] -> [P, N].
    With `swiglu_limit`, x [P, 2K] holds each pair's gate‖up and the product is taken with their clamped SwiGLU;
    with `scale` [P], each pair's output is multiplied by its entry."""
    x = x.contiguous()
    pairs, (_, n, k) = experts.numel(), weights.shape
    out = torch.empty(pairs, n, dtype=torch.float32, device=x.device)
    grid = (pairs, triton.cdiv(n, block_n))
    _pair_gemv[grid](
        x,
        weights,
        experts.contiguous(),
        out if scale is None else scale.contiguous(),
        out,
        rows_per_pair,
        weights.stride(0),
        0.0 if swiglu_limit is None else swiglu_limit,
        K=k,
        N=n,
        BLOCK_N=block_n,
        BLOCK_K=block_k,
        SWIGLU=swiglu_limit is not None,
        SCALED=scale is not None,
    )
    return out


def routed_experts(
    x: torch.Tensor,
    chosen: torch.Tensor,
    weights: torch.Tensor,
    gate_up: torch.Tensor,
    down: torch.Tensor,
    limit: float,
) -> torch.Tensor:
    """Sum over each row's chosen experts of weight · down(swiglu(gate_up(x))). x [T, H] fp32; chosen, weights
    [T, k]; gate_up [E, 2I, H]; down [E, H, I]. Returns [T, H] fp32 (this rank's partial sum)."""
    rows, k = chosen.shape
    experts = chosen.reshape(-1).to(torch.int32)
    gate_up_out = pair_gemv(x, gate_up, experts, rows_per_pair=k)
    out = pair_gemv(gate_up_out, down, experts, rows_per_pair=1, swiglu_limit=limit, scale=weights.reshape(-1).float())
    return out.view(rows, k, -1).sum(1)


@triton.jit
def _route(
    logits_ptr,
    bias_ptr,
    chosen_ptr,
    weights_ptr,
    scale,
    shared,
    E: tl.constexpr,
    EP: tl.constexpr,
    TOP: tl.constexpr,
    WIDTH: tl.constexpr,
    WP: tl.constexpr,
    RENORM: tl.constexpr,
):
    token = tl.program_id(0)
    offs = tl.arange(0, EP)
    live = offs < E
    score = tl.sigmoid(tl.load(logits_ptr + token * E + offs, mask=live, other=0.0))
    pick = tl.where(live, score + tl.load(bias_ptr + offs, mask=live, other=0.0), float("-inf"))
    slot = tl.arange(0, WP)
    chosen = tl.zeros([WP], dtype=tl.int32)
    weight = tl.zeros([WP], dtype=tl.float32)
    for i in tl.static_range(TOP):  # the largest biased score, TOP times (a tie goes to the lower expert id)
        best = tl.argmax(pick, axis=0)
        chosen = tl.where(slot == i, best, chosen)
        weight = tl.where(slot == i, tl.sum(tl.where(offs == best, score, 0.0), axis=0), weight)
        pick = tl.where(offs == best, float("-inf"), pick)
    if RENORM:
        weight = weight / (tl.sum(weight, axis=0) + 1e-20)
    weight = weight * scale
    if WIDTH > TOP:  # the shared expert, as one more pair of weight 1
        chosen = tl.where(slot == TOP, shared, chosen)
        weight = tl.where(slot == TOP, 1.0, weight)
    tl.store(chosen_ptr + token * WIDTH + slot, chosen, mask=slot < WIDTH)
    tl.store(weights_ptr + token * WIDTH + slot, weight, mask=slot < WIDTH)


def route(
    logits: torch.Tensor, bias: torch.Tensor, top_k: int, scale: float, renorm: bool, shared: int | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """The router after its matmul, for logits [T, E] fp32: chosen experts [T, k] int32 and their weights [T, k]
    (sigmoid scores, chosen by score + bias, renormalised when `renorm`, times `scale`), as moe.MoE.route; with
    `shared`, a (k+1)-th column: that expert id with weight 1."""
    tokens, experts = logits.shape
    width = top_k + (shared is not None)
    chosen = torch.empty(tokens, width, dtype=torch.int32, device=logits.device)
    weights = torch.empty(tokens, width, dtype=torch.float32, device=logits.device)
    _route[(tokens,)](
        logits.contiguous(),
        bias,
        chosen,
        weights,
        scale,
        -1 if shared is None else shared,
        E=experts,
        EP=triton.next_power_of_2(experts),
        TOP=top_k,
        WIDTH=width,
        WP=triton.next_power_of_2(width),
        RENORM=renorm,
    )
    return chosen, weights


@triton.jit
def _swiglu(gate_ptr, up_ptr, out_ptr, stride_gate, stride_up, limit, WIDTH: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    live = offs < WIDTH
    nan: tl.constexpr = tl.PropagateNan.ALL  # as torch.clamp: a NaN stays NaN
    gate = tl.load(gate_ptr + row * stride_gate + offs, mask=live, other=0.0).to(tl.float32)
    gate = tl.minimum(gate, limit, propagate_nan=nan)
    up = tl.load(up_ptr + row * stride_up + offs, mask=live, other=0.0).to(tl.float32)
    up = tl.minimum(tl.maximum(up, -limit, propagate_nan=nan), limit, propagate_nan=nan)
    # bf16 out: rounded to nearest even, as torch's .to() rounds finite values (in Triton's interpreter too)
    _store(out_ptr + row * WIDTH + offs, gate * tl.sigmoid(gate) * up, live, out_ptr.dtype.element_ty == tl.bfloat16)


def swiglu(gate: torch.Tensor, up: torch.Tensor, limit: float, out_dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """silu(min(gate, limit)) · clamp(up, ±limit) for gate, up [N, I] (rows may be strided: the two halves of one
    gate‖up output) in one launch, where torch takes four (reference.swiglu_clamped; fp32 rounding apart). fp32 or
    bf16 inputs (widened exactly), computed in fp32, written as `out_dtype` (a bf16 result is the fp32 one rounded
    to nearest even, as `.to(torch.bfloat16)` rounds it)."""
    assert out_dtype in (torch.float32, torch.bfloat16), f"written as fp32 or bf16, not {out_dtype}"
    rows, width = gate.shape
    out = torch.empty(rows, width, dtype=out_dtype, device=gate.device)
    block = min(1024, triton.next_power_of_2(width))
    _swiglu[(rows, triton.cdiv(width, block))](
        gate, up, out, gate.stride(0), up.stride(0), float(limit), WIDTH=width, BLOCK=block
    )
    return out


@triton.jit
def _combine_pairs(
    pair_ptr, slot_ptr, weight_ptr, base_ptr, out_ptr, WIDTH: tl.constexpr, TOP: tl.constexpr, BLOCK: tl.constexpr,
    BASE: tl.constexpr,
):  # fmt: skip
    token = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    live = offs < WIDTH
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for k in tl.static_range(TOP):  # the token's pairs in slot order, each output weighted and added in turn
        row = tl.load(slot_ptr + token * TOP + k).to(tl.int64)
        weight = tl.load(weight_ptr + token * TOP + k)
        term = tl.load(pair_ptr + row * WIDTH + offs, mask=live, other=0.0).to(tl.float32) * weight
        acc = term if k == 0 else acc + term
    if BASE:
        acc = tl.load(base_ptr + token * WIDTH + offs, mask=live, other=0.0).to(tl.float32) + acc
    tl.store(out_ptr + token * WIDTH + offs, acc, mask=live)


def combine_pairs(
    pairs: torch.Tensor, order: torch.Tensor, weights: torch.Tensor, base: torch.Tensor | None = None
) -> torch.Tensor:
    """A prompt chunk's routed experts summed back per token: pairs [T·k, W] are the outputs of the (token, slot)
    pairs sorted by expert (`order`, [T·k]: the flat (token, slot) index of each sorted row), weights [T, k] fp32 the
    routing weights; out[t] = base[t] + Σ_slot weights[t, slot] · pairs[row of (t, slot)], the slots summed in order
    (a fixed order: a token's bits do not depend on the others') -> [T, W] fp32. One kernel over the pairs, read
    once as stored (and two small launches inverting `order`), where torch wrote a weighted fp32 copy of them,
    scattered it back to (token, slot) order, summed and added."""
    tokens, top = weights.shape
    width = pairs.shape[1]
    slots = torch.empty_like(order)
    slots[order] = torch.arange(order.numel(), device=order.device, dtype=order.dtype)
    out = torch.empty(tokens, width, dtype=torch.float32, device=pairs.device)
    block = min(1024, triton.next_power_of_2(width))
    _combine_pairs[(tokens, triton.cdiv(width, block))](
        pairs.contiguous(), slots, weights.contiguous(), out if base is None else base.contiguous(), out,
        WIDTH=width, TOP=top, BLOCK=block, BASE=base is not None,
    )  # fmt: skip
    return out
