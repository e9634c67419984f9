"""Plain-torch kernels: the numerical definition every faster backend is checked against."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

ROW_INVARIANT_ROWS = 64  # CPU products of up to this many rows are row-invariant (decode steps, verify windows)
ROW_BLOCK = 8  # ... computed as products of exactly this many rows (zero-padded)


def linear(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """x [N, in] (fp32 activations) times weight [out, in] stored in any float dtype; fp32 result.
    The product runs in the weight's dtype (bf16 on GPUs, accumulating in fp32); on the CPU everything is fp32.

    Row invariance on the CPU: MKL blocks a product of N rows differently for different N (a row's result moves in
    the last bits with the batch), so up to ROW_INVARIANT_ROWS rows run through `rows_product`; a row's bits are
    then the same whatever shares the step (drafted ≡ serial rests on it, tests/engine/test_drafts.py)."""
    if weight.dtype == x.dtype:
        if not x.is_cuda and x.dim() == 2 and x.shape[0] <= ROW_INVARIANT_ROWS:
            return rows_product(x, weight.t())
        return x @ weight.t()
    return _fp32_product(x.to(weight.dtype), weight.t())


def _padded(x: torch.Tensor, dim: int) -> torch.Tensor:
    pad = -x.shape[dim] % ROW_BLOCK
    if not pad:
        return x
    shape = list(x.shape)
    shape[dim] = pad
    return torch.cat([x, x.new_zeros(shape)], dim=dim)


def rows_product(x: torch.Tensor, matrix: torch.Tensor) -> torch.Tensor:
    """x [N, in] @ matrix [in, out] in products of exactly ROW_BLOCK rows (x zero-padded): every block is the same
    GEMM, and measured on MKL a row's result does not depend on its place in a block or on the block's other rows
    (one [N, in] product does: tests/engine/test_drafts.py checks the invariance)."""
    n = x.shape[0]
    padded = _padded(x, 0)
    return torch.cat([padded[i : i + ROW_BLOCK] @ matrix for i in range(0, padded.shape[0], ROW_BLOCK)])[:n]


def row_blocks(fn: Callable[..., Any], *xs: torch.Tensor) -> Any:
    """fn(*xs) for a row-wise fn (row i of each result depends on row i of each x alone; it returns a tensor or a
    tuple of them), run on blocks of exactly ROW_BLOCK rows on the CPU (zero-padded), so a row's bits do not depend
    on how many rows share the call: torch's batched CPU products (bmm, einsum) choose their blocking by the batch
    size, as `linear` explains."""
    n = xs[0].shape[0]
    if xs[0].is_cuda or n > ROW_INVARIANT_ROWS:
        return fn(*xs)
    padded = [_padded(x, 0) for x in xs]
    parts = [fn(*(x[i : i + ROW_BLOCK] for x in padded)) for i in range(0, padded[0].shape[0], ROW_BLOCK)]
    if isinstance(parts[0], tuple):
        return tuple(torch.cat(column)[:n] for column in zip(*parts))
    return torch.cat(parts)[:n]


def heads_product(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """x [N, H, a] times per-head weight [H, a, b] -> [N, H, b] (the einsum 'nha,hab->nhb'), row-invariant on the
    CPU as `rows_product` is: per head, products of exactly ROW_BLOCK rows."""
    if x.is_cuda or x.shape[0] > ROW_INVARIANT_ROWS:
        return torch.einsum("nha,hab->nhb", x, weight)
    n = x.shape[0]
    per_head = _padded(x.transpose(0, 1), 1)  # [H, N', a]
    blocks = [torch.bmm(per_head[:, i : i + ROW_BLOCK], weight) for i in range(0, per_head.shape[1], ROW_BLOCK)]
    return torch.cat(blocks, dim=1)[:, :n].transpose(0, 1)


def linear_pairs(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """P independent products in one batched matmul: x [P, N, in] times weight [P, out, in] -> [P, N, out] fp32."""
    if weight.dtype == x.dtype:
        return x @ weight.transpose(1, 2)
    return _fp32_product(x.to(weight.dtype), weight.transpose(1, 2))


_FP32_OUT = [True]  # cleared when this torch cannot write a bf16 product straight to fp32 on the GPU


def _fp32_product(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a @ b of low-precision (2-D or batched 3-D) operands, as fp32. On CUDA the matmul writes fp32 itself
    (`out_dtype`, torch >= 2.8): one launch instead of two, the accumulator is not rounded to bf16, and on an H200 it
    is faster at every shape timed (2048 × 4096 × 24896: 543 against 704 µs; 1 × 4096 × 24896: 65 against 70 µs)."""
    if a.is_cuda and _FP32_OUT[0] and a.dim() in (2, 3):
        try:
            return (torch.mm if a.dim() == 2 else torch.bmm)(a, b, out_dtype=torch.float32)
        except (RuntimeError, TypeError):
            _FP32_OUT[0] = False
    return (a @ b).float()


# Elementwise functions whose vectorised CPU kernels differ from their scalar tail (measured: sigmoid, silu,
# softplus on AVX512), so an element's bits would depend on its place in the tensor; composed here from functions
# that do not (exp, log1p and IEEE arithmetic). On CUDA every element runs the same code: torch's own.


def sigmoid(x: torch.Tensor) -> torch.Tensor:
    return torch.sigmoid(x) if x.is_cuda else 1.0 / (1.0 + torch.exp(-x))


def silu(x: torch.Tensor) -> torch.Tensor:
    return F.silu(x) if x.is_cuda else x / (1.0 + torch.exp(-x))


def softplus(x: torch.Tensor, threshold: float = 20.0) -> torch.Tensor:
    if x.is_cuda:
        return F.softplus(x, threshold=threshold)
    return torch.where(x > threshold, x, torch.log1p(torch.exp(x)))


def rms_norm(x: torch.Tensor, weight: torch.Tensor | None, eps: float) -> torch.Tensor:
    x = x.float()
    x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return x if weight is None else x * weight


def layer_norm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float) -> torch.Tensor:
    return F.layer_norm(x.float(), (x.shape[-1],), weight, bias, eps)


def l2norm(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    # eps is added under the root (not clamped), as the KDA kernels define it
    return x / torch.sqrt((x * x).sum(-1, keepdim=True) + eps)


def swiglu_clamped(gate: torch.Tensor, up: torch.Tensor, limit: float) -> torch.Tensor:
    """SwiGLU with GLM's limits: the gate is capped above, the up projection clamped both ways."""
    return silu(gate.clamp(max=limit)) * up.clamp(-limit, limit)


def causal_conv(x: torch.Tensor, window: torch.Tensor, weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Depthwise causal conv + SiLU over one stream.

    x: [T, C] new inputs; window: [C, K-1] the previous K-1 inputs (zeros at the start); weight: [C, K].
    Returns the outputs [T, C] and the new window.
    """
    seq = torch.cat([window, x.t()], dim=1)  # [C, K-1+T]
    kernel = weight.shape[1]
    out = F.conv1d(seq.unsqueeze(0), weight.unsqueeze(1), groups=weight.shape[0])[0]  # [C, T]
    return silu(out.t()), seq[:, seq.shape[1] - (kernel - 1) :].clone()


def kda_step(
    state: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """One token of the delta rule for a batch of streams.

    state: [B, H, dk, dv]; q, k: [B, H, dk] (normalised, q pre-scaled); v: [B, H, dv]; g: [B, H, dk] log-decay;
    beta: [B, H]. Returns the output [B, H, dv] and the new state. A stream's bits do not depend on the others
    (`row_blocks`).
    """
    return row_blocks(_kda_step, state, q, k, v, g, beta)


def _kda_step(
    state: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    state = state * g.exp().unsqueeze(-1)
    remembered = torch.einsum("bhkv,bhk->bhv", state, k)
    delta = (v - remembered) * beta.unsqueeze(-1)
    state = state + k.unsqueeze(-1) * delta.unsqueeze(-2)
    return torch.einsum("bhkv,bhk->bhv", state, q), state


def kda_chunked(
    state: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    chunk: int = 64,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The delta rule over T tokens of one stream, a chunk at a time (same result as T calls of `kda_step`).

    state: [H, dk, dv]; q, k: [T, H, dk]; v: [T, H, dv]; g: [T, H, dk]; beta: [T, H].
    Inside a chunk with cumulative log-decay G, the corrections δ solve the unit lower-triangular system
    (I + A) δ = β (v - (k·e^G) S0) with A[t,s] = β_t Σ_i k_t,i k_s,i e^(G_t,i - G_s,i) for s < t; then
    o_t = (q_t·e^G_t) S0 + Σ_{s≤t} (Σ_i q_t,i k_s,i e^(G_t,i - G_s,i)) δ_s and S = e^G_last S0 + Σ_s (k_s e^(G_last - G_s)) δ_s.
    """
    outputs = []
    for start in range(0, q.shape[0], chunk):
        sl = slice(start, start + chunk)
        qc, kc, vc, bc = (x[sl].transpose(0, 1) for x in (q, k, v, beta))  # [H, C, ...]
        gc = g[sl].transpose(0, 1).cumsum(dim=1)  # [H, C, dk]
        n = qc.shape[1]
        causal = torch.ones(n, n, dtype=torch.bool, device=q.device).tril()
        gap = gc.unsqueeze(2) - gc.unsqueeze(1)  # [H, C(t), C(s), dk]
        decay = gap.masked_fill(~causal[None, :, :, None], float("-inf")).exp()
        kk = torch.einsum("htk,hsk,htsk->hts", kc, kc, decay)
        a = (kk * bc.unsqueeze(-1)).masked_fill(~causal.tril(-1), 0.0)
        rhs = bc.unsqueeze(-1) * (vc - torch.einsum("htk,hkv->htv", kc * gc.exp(), state))
        eye = torch.eye(n, dtype=q.dtype, device=q.device)
        delta = torch.linalg.solve_triangular(eye + a, rhs, upper=False, unitriangular=True)
        qk = torch.einsum("htk,hsk,htsk->hts", qc, kc, decay)
        out = torch.einsum("htk,hkv->htv", qc * gc.exp(), state) + qk @ delta
        last = gc[:, -1:, :]  # [H, 1, dk]
        state = last.transpose(1, 2).exp() * state + torch.einsum("hsk,hsv->hkv", kc * (last - gc).exp(), delta)
        outputs.append(out.transpose(0, 1))
    return torch.cat(outputs, dim=0), state


def sinkhorn(comb: torch.Tensor, iters: int, eps: float) -> torch.Tensor:
    """comb [T, n, n] (softmax + eps applied) -> doubly stochastic: columns, then rows and columns iters - 1 times."""
    comb = comb / (comb.sum(-2, keepdim=True) + eps)
    for _ in range(iters - 1):
        comb = comb / (comb.sum(-1, keepdim=True) + eps)
        comb = comb / (comb.sum(-2, keepdim=True) + eps)
    return comb
