"""The backend choice, one dispatch per op that has a fused CUDA form.

Model files call these (through `engine.ops`) and never import Triton: each function picks the Triton kernel on a
CUDA tensor where its form applies, and the torch reference otherwise, importing the Triton module only on first
use. Where the fused form covers a whole step of a layer (the KDA decode token, the small-batch MoE, the EXL3
experts), `*_applies` says whether it does, so the layer keeps one branch with the reason written here.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch

from engine.ops import reference
from engine.quant.dense import QuantWeight

MOE_FUSED_MAX_PAIRS = 576  # (token, expert) pairs the small-batch MoE kernels take: 64 rows (8 lanes × a verify
# window of 8) at top-8 plus the shared expert; each pair reads its expert once, so prompt chunks go per expert


def linear(x: torch.Tensor, weight: Any) -> torch.Tensor:
    """x [N, in] times a dense weight [out, in] -> fp32 [N, out] (`reference.linear` says how a tensor weight runs).
    A reduced weight (engine/quant/dense.py `QuantWeight`): on CUDA, up to ROW_INVARIANT_ROWS rows (decode, verify
    windows) through engine/ops/triton_dense.py — the weight read once in its stored bits, a row's result
    independent of the others — and larger prompt chunks as a tensor-core matmul with the weight dequantised to bf16
    for the call (in one launch: `dequantized`); on the CPU the reference: dequantised to fp32, then
    `reference.linear`. An fp32 weight's few CUDA rows, drafts or not: engine/ops/triton_rows.py, row-invariant
    without padding (the MoE routers, fp32 on every device: `layout.kept_fp32`; at 2–16 rows cuBLAS's fp32 product
    took 1.7–4× the kernel's time, docs/BENCHMARKS.md session 17)."""
    if not isinstance(weight, QuantWeight):
        if weight.dtype == torch.float32 and x.dim() == 2 and _rows_kernel(x, (1, *weight.shape), "linear", True):
            from engine.ops.triton_rows import rows_product

            return rows_product(x[:, None], weight[None])[:, 0]
        return reference.linear(x, weight)
    if not x.is_cuda:
        return reference.linear(x, weight.dequantize(torch.float32))
    if x.dim() == 2 and x.shape[0] <= reference.ROW_INVARIANT_ROWS:
        from engine.ops.triton_dense import dense_rows

        return dense_rows(x, weight)
    from engine.ops.triton_dense import dequantized

    return reference.linear(x, dequantized(weight))


def _rows_kernel(x: torch.Tensor, shape: tuple[int, ...], kind: str, always: bool = False) -> bool:
    """Whether a product of x's rows with P weights of `shape` (P, out, in) runs through engine/ops/triton_rows.py: a
    CUDA decode step or verify window (at most ROW_INVARIANT_ROWS rows) that must be row-invariant
    (`reference.pads_on_cuda`), or `always` (drafts or not: an fp32 weight's rows, or a bf16-kept weight of fp32
    products, DSA's kv_b, which the kernel reads as it is), with a launch grid the weight fits (`triton_rows.fits`)."""
    if not (x.is_cuda and x.shape[0] <= reference.ROW_INVARIANT_ROWS and (always or reference.pads_on_cuda(kind))):
        return False
    from engine.ops.triton_rows import fits

    return fits(*shape)


def head_products(
    x: torch.Tensor, weight: torch.Tensor, torch_form: Callable[[torch.Tensor], torch.Tensor]
) -> torch.Tensor:
    """x [N, P, K] fp32 times P weights [P, O, K] (a strided view; fp32, or bf16 values kept as bf16) -> [N, P, O]
    fp32, head by head (DSA's absorbed kv_b); `torch_form(rows)` computes the same with torch. Row-invariant: in a
    CUDA step that may verify drafts through engine/ops/triton_rows.py, else `torch_form` in `row_blocks` (kind
    dsa_heads); a bf16 weight's few CUDA rows take the kernel either way (it reads the bf16 as they are, where
    `torch_form` would first make an fp32 copy)."""
    bf16 = weight.dtype == torch.bfloat16
    if x.dim() == 3 and _rows_kernel(x, tuple(weight.shape), "dsa_heads", always=bf16):
        from engine.ops.triton_rows import rows_product

        return rows_product(x, weight)
    return reference.row_blocks(torch_form, x, kind="dsa_heads")


def linear_pairs(x: torch.Tensor, weight: Any) -> tuple[torch.Tensor, ...]:
    """P products x [P, N, in] times weight [P, out, in] -> P results [N, out] fp32: one batched matmul over stacked
    tensor weights (`reference.linear_pairs`, its results as views), or one `linear` each for a tuple of reduced
    weights (not stacked: a KDA layer unpacks f and the gate, so a stack would only copy them, one launch a decode
    layer)."""
    if isinstance(weight, torch.Tensor):
        return reference.linear_pairs(x, weight).unbind(0)
    return tuple(linear(x[i], w) for i, w in enumerate(weight))


def sinkhorn(comb: torch.Tensor, iters: int, eps: float) -> torch.Tensor:
    """comb [T, n, n] fp32 (softmax + eps applied) -> doubly stochastic."""
    if comb.is_cuda:
        from engine.ops.triton_mhc import sinkhorn as fused

        return fused(comb, iters, eps)
    return reference.sinkhorn(comb, iters, eps)


@functools.cache
def beside_stream(device: torch.device) -> torch.cuda.Stream:
    """The device's second stream (made once): work a step forks off its own stream and joins later, captured into
    the step's graph as a branch (a hyper-connection's post and comb, `hc_around`; the MoE's shared expert)."""
    return torch.cuda.Stream(device)


def hc_around(
    streams: torch.Tensor,
    sublayer: Callable[[torch.Tensor], torch.Tensor],
    fn: torch.Tensor,
    base: torch.Tensor,
    scale: torch.Tensor,
    norm: torch.Tensor,
    hc_eps: float,
    hc_norm_eps: float,
    norm_eps: float,
    iters: int,
    partials: tuple[torch.Tensor, torch.Tensor] | None = None,
    next_fn: torch.Tensor | None = None,
) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor] | None]:
    """A hyper-connection around `sublayer` (engine/models/glm5_next/mhc.py says what it computes): on a GPU with a
    power-of-two stream count, fused kernels, for decode steps and prompt chunks alike (prompt chunks measured on
    the H200: docs/BENCHMARKS.md, session 16); else torch ops. Gives the new streams, and on a GPU in a step's form
    with `next_fn` (the next hyper-connection's map) that one's first partial sums, which it takes as `partials`
    (`triton_mhc.hc_post`); else None. In a step's form post and comb are made on the device's second stream beside
    the sublayer (`triton_mhc.GATES_BESIDE`) and joined before the new streams are made."""
    n = streams.shape[1]
    if streams.is_cuda and n & (n - 1) == 0:
        from engine.ops import triton_mhc

        here = torch.cuda.current_stream(streams.device)
        beside = triton_mhc.GATES_BESIDE and triton_mhc.decode_form(streams.shape[0])
        side = beside_stream(streams.device) if beside else None
        x, post, comb = triton_mhc.hc_pre(
            streams, fn, base, scale, norm, hc_eps, hc_norm_eps, norm_eps, iters, partials, side
        )
        out = sublayer(x)
        if side is not None:  # post and comb made beside the sublayer (a step's form)
            here.wait_stream(side)
        return triton_mhc.hc_post(streams, out, post, comb, next_fn)
    pre, post, comb = hc_weights(streams, fn, base, scale, hc_eps, hc_norm_eps, iters)
    out = sublayer(reference.rms_norm((pre.unsqueeze(-1) * streams).sum(1), norm, norm_eps))
    return post.unsqueeze(-1) * out.unsqueeze(1) + comb.transpose(-1, -2) @ streams, None


def hc_weights(
    streams: torch.Tensor,
    fn: torch.Tensor,
    base: torch.Tensor,
    scale: torch.Tensor,
    hc_eps: float,
    hc_norm_eps: float,
    iters: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """streams [T, n, hidden] -> pre [T, n], post [T, n], comb [T, n, n] (Sinkhorn through `sinkhorn`)."""
    n = streams.shape[1]
    logits = reference.linear(reference.rms_norm(streams.flatten(1), None, hc_norm_eps), reference.widened(fn))
    pre_l, post_l, comb_l = logits.split([n, n, n * n], dim=-1)
    pre_b, post_b, comb_b = base.split([n, n, n * n])
    pre = reference.sigmoid(pre_l * scale[0] + pre_b) + hc_eps
    post = 2 * reference.sigmoid(post_l * scale[1] + post_b)
    comb = torch.softmax((comb_l * scale[2] + comb_b).view(-1, n, n), dim=-1) + hc_eps
    return pre, post, sinkhorn(comb, iters, hc_eps)


def kda_decode_applies(x: torch.Tensor) -> bool:
    """The KDA decode token as one kernel over lane state (conv, gates, delta rule, gated norm, in place)."""
    return x.is_cuda


def kda_decode(*args: Any) -> torch.Tensor:
    """engine/ops/triton_kda.py `kda_decode` (see there for the arguments)."""
    from engine.ops.triton_kda import kda_decode as fused

    return fused(*args)


def rms_norm(x: torch.Tensor, weight: torch.Tensor | None, eps: float) -> torch.Tensor:
    """RMS norm over the last dim (`reference.rms_norm`); a CUDA step's rows (at most ROW_INVARIANT_ROWS, 2-D, unit
    column stride) through engine/ops/triton_rows.py `rms_norm_rows`: row-invariant, one launch."""
    if x.is_cuda and x.dim() == 2 and x.shape[0] <= reference.ROW_INVARIANT_ROWS and x.stride(-1) == 1:
        from engine.ops.triton_rows import NORM_WIDTH, rms_norm_rows

        if x.shape[1] <= NORM_WIDTH and (weight is None or weight.dtype == torch.float32):
            return rms_norm_rows(x, weight, eps)
    return reference.rms_norm(x, weight, eps)


def gated_norm(
    core: torch.Tensor, gate: torch.Tensor, weight: torch.Tensor, eps: float, out: Any, prompt: bool = False
) -> torch.Tensor:
    """KDA's output before o_proj: each head of core [T, H, d] RMS-normalised (· weight [d]) and gated by
    sigmoid(gate) ([T, H, d] or [T, H·d]) -> [T, H·d], as the product with o_proj (`out`, a dense weight) takes it.
    A CUDA `prompt` chunk of more rows than ROW_INVARIANT_ROWS (d a power of two) in one launch written in the
    product's operand type (engine/ops/triton_kda.py `gated_norm`: bf16 for a bf16 or reduced weight, no cast before
    the product); otherwise, decode steps of any width included, fp32 torch ops (`reference.rms_norm`,
    `reference.sigmoid`)."""
    t, heads, d = core.shape
    gate = gate.reshape(t, heads * d)
    if (
        prompt
        and core.is_cuda
        and t > reference.ROW_INVARIANT_ROWS
        and d & (d - 1) == 0
        and core.stride(2) == 1
        and core.stride(1) == d
        and gate.stride(1) == 1
        and core.dtype == gate.dtype == weight.dtype == torch.float32
    ):
        from engine.ops.triton_kda import gated_norm as fused

        dtype = torch.bfloat16 if isinstance(out, QuantWeight) else out.dtype
        return fused(core, gate, weight, eps, dtype)
    return (rms_norm(core, weight, eps) * reference.sigmoid(gate.view(t, heads, d))).flatten(1)


def lane_attention(
    q_abs: torch.Tensor,
    latents: torch.Tensor | reference.PoolColumns,
    counts: torch.Tensor,
    scaling: float,
    torch_form: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor],
) -> torch.Tensor:
    """DSA's attention of a step's rows over their selected latents (q_abs [B, H, R], latents [B, N, R] or left in
    the cache pool, `PoolColumns` by slot [B, N]; counts [B, N] -> [B, H, R]): on CUDA, up to ROW_INVARIANT_ROWS
    rows, engine/ops/triton_dsa.py (two launches, each row alone; a pool's latents read there by slot, fp8 rows
    where the GPU has the type); otherwise `torch_form` through `row_blocks` (a row at a time where a verify step
    may come) over the latents as KVPool.read gives them — the same values either way."""
    rank, heads = q_abs.shape[-1], q_abs.shape[1]
    if (
        q_abs.is_cuda
        and q_abs.shape[0] <= reference.ROW_INVARIANT_ROWS
        and rank >= 16
        and rank & (rank - 1) == 0
        and heads <= 64
    ):
        from engine.ops import triton_dsa

        fp8 = isinstance(latents, reference.PoolColumns) and latents.pool.scales is not None
        if not fp8 or triton_dsa.fp8_rows_apply(q_abs.device):
            return triton_dsa.lane_attention(q_abs, latents, counts, scaling)
    if isinstance(latents, reference.PoolColumns):
        latents = latents.read()
    return reference.row_blocks(torch_form, q_abs, latents, counts, kind="dsa_attend")


def causal_conv(x: torch.Tensor, window: torch.Tensor, weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """KDA's depthwise causal conv + SiLU over a prompt chunk (`reference.causal_conv`): on CUDA one launch
    (engine/ops/triton_kda.py `causal_conv`), the same sums to fp32 rounding."""
    channels, kernel = weight.shape
    if (
        x.is_cuda
        and x.dim() == 2
        and x.shape[1] == channels
        and window.shape == (channels, kernel - 1)
        and x.dtype == weight.dtype == window.dtype == torch.float32
        and x.stride(1) == 1 == weight.stride(1)
    ):
        from engine.ops.triton_kda import causal_conv as fused

        return fused(x, window, weight)
    return reference.causal_conv(x, window, weight)


def conv_qkv(
    x: torch.Tensor, window: torch.Tensor, weight: torch.Tensor, head_dim: int, eps: float = 1e-6
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """A KDA prompt chunk's q, k, v from its q|k|v projection x [T, 3·W]: the causal conv + SiLU (`causal_conv`),
    split in three [T, W / head_dim, head_dim], q's and k's heads L2-normalised (eps under the root) and q scaled by
    head_dim^-1/2 (`reference.split_qkv`); and the new window. On CUDA one kernel, and the window's copy
    (engine/ops/triton_kda.py `conv_qkv`: q, k, v contiguous; the norms' sums in another order, so fp32 rounding
    apart)."""
    channels, kernel = weight.shape
    if (
        x.is_cuda
        and x.dim() == 2
        and x.shape[1] == channels
        and channels % (3 * head_dim) == 0
        and 16 <= head_dim <= 256
        and head_dim & (head_dim - 1) == 0
        and window.shape == (channels, kernel - 1)
        and x.dtype == weight.dtype == window.dtype == torch.float32
        and x.stride(1) == 1 == weight.stride(1)
    ):
        from engine.ops.triton_kda import conv_qkv as fused

        return fused(x, window, weight, head_dim, eps)
    mixed, new_window = causal_conv(x, window, weight)
    return (*reference.split_qkv(mixed, head_dim, eps), new_window)


def index_scores(
    q: torch.Tensor,
    keys: torch.Tensor | reference.PoolKeys,
    head_w: torch.Tensor,
    positions: torch.Tensor,
    kpool: int,
    scale: float,
    alone: bool = False,
) -> torch.Tensor:
    """DSA's indexer scores (`reference.index_scores`): on CUDA, where its shapes apply, in one launch, each query's
    scores computed alone (engine/ops/triton_dsa.py `index_scores`: the same bits in a prompt chunk, a decode step or
    a verify window; the torch form wrote [T, h, P] fp32 and read it back three times, and multiplied a [h, d] by
    [d, P] product per query in cuBLAS's batched fp32 kernel). `alone` asks the CPU's form for that property (on
    CUDA, outside the kernel's shapes, the batched torch form runs as before)."""
    if q.is_cuda:
        from engine.ops import triton_dsa

        if triton_dsa.index_applies(q, keys):
            return triton_dsa.index_scores(q, keys, head_w, positions, kpool, scale)
    return reference.index_scores(q, keys, head_w, positions, kpool, scale, alone and not q.is_cuda)


def top_pools(index: torch.Tensor, k: int) -> torch.Tensor:
    """Each query's k best pools in position order (`reference.top_pools`: the first k of a stable descending sort):
    on CUDA by engine/ops/triton_dsa.py's `top_pools` (a radix select in a few launches, the same pools), else the
    torch form."""
    if index.is_cuda:
        from engine.ops import triton_dsa

        if triton_dsa.top_pools_applies(index):
            return triton_dsa.top_pools(index, k)
    return reference.top_pools(index, k)


def pool_tokens(
    chosen: torch.Tensor | None,
    positions: torch.Tensor,
    kpool: int,
    pools: int,
    n_pools: int,
    tail_cap: int | None,
    table: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """DSA's selected tokens (or their slots, from `table`) and counts from each query's chosen pools
    (`reference.pool_tokens`): on CUDA one launch of engine/ops/triton_dsa.py's `pool_tokens` (integer arithmetic:
    the same values), else the torch form."""
    if positions.is_cuda:
        from engine.ops import triton_dsa

        if triton_dsa.pool_tokens_applies(positions):
            return triton_dsa.pool_tokens(chosen, positions, kpool, pools, n_pools, tail_cap, table)
    return reference.pool_tokens(chosen, positions, kpool, pools, n_pools, tail_cap, table)


def index_scores_form(
    q: torch.Tensor, keys: torch.Tensor | reference.PoolKeys
) -> tuple[torch.Tensor | reference.PoolKeys, int]:
    """How `index_scores` takes q [T, h, d] against keys [., P, d], for a caller that scores blocks of queries: the
    keys to pass it — `PoolKeys` left in the pool where the CUDA kernel reads them there, else read here once, not
    once a block — and the fp32 values it holds at once for each query (its P scores in the kernel, its h × P
    products in the torch form)."""
    if q.is_cuda:
        from engine.ops import triton_dsa

        if triton_dsa.index_applies(q, keys):
            return keys, keys.shape[-2]
    return keys.read() if isinstance(keys, reference.PoolKeys) else keys, q.shape[1] * keys.shape[-2]


def complete_pools_applies(rows: torch.Tensor, dim: int, fp8: bool) -> bool:
    """Whether DSA's pool keys are made in engine/ops/triton_dsa.py's one launch (`complete_pools`; CUDA, index keys
    a power of two wide, `fp8` cache rows where the GPU has the type) rather than the torch form of
    engine/models/glm5_next/dsa.py."""
    if not rows.is_cuda:
        return False
    from engine.ops.triton_dsa import pool_keys_apply

    return pool_keys_apply(rows, dim, fp8)


def complete_pools(*args: Any) -> None:
    """engine/ops/triton_dsa.py `complete_pools` (see there for the arguments)."""
    from engine.ops.triton_dsa import complete_pools as fused

    fused(*args)


def selected_attention_applies(q: torch.Tensor, heads: int, rank: int) -> bool:
    """Whether a prompt chunk's DSA attention over selected tokens (queries q) runs as engine/ops/triton_dsa.py's
    `selected_attention` (CUDA with bf16 tensor cores and ~100 KB of shared memory a block - compute capability 8.0
    or later -, its shapes) rather than gathered blocks of split products."""
    if not q.is_cuda or torch.cuda.get_device_capability(q.device) < (8, 0):
        return False
    from engine.ops.triton_dsa import prompt_applies

    return prompt_applies(heads, rank)


def selected_attention(
    q_abs: torch.Tensor,
    latents: reference.Split | reference.PoolLatents,
    tokens: torch.Tensor,
    counts: torch.Tensor,
    scale: float = 1.0,
    split_out: bool = False,
) -> torch.Tensor | reference.Split:
    """q_abs [H, T, R] fp32 times `scale` over each query's selected latents (`latents` [L, R] split, or left in the
    cache pool: `PoolLatents.by_row`; tokens and counts [T, N]) -> context [H, T, R] fp32 (`split_out`: as its
    split bf16 pair, for a split product), in one launch (engine/ops/triton_dsa.py `selected_attention`) after
    q_abs · scale is split in one more (`split_scaled`: the bits of `reference.split_bf16(q_abs * scale)`)."""
    from engine.ops import triton_dsa

    q_split = triton_dsa.split_scaled(q_abs, scale)
    scales = None
    if isinstance(latents, reference.PoolLatents):
        copy = triton_dsa.prompt_launch(torch.cuda.get_device_capability(q_abs.device))["fp8_copy"]
        latents, tokens, scales = latents.by_row(tokens, fp8=triton_dsa.fp8_rows_apply(q_abs.device), copy=copy)
    return triton_dsa.selected_attention(q_split, latents, tokens, counts, scales, split_out)


def swiglu_clamped(
    gate: torch.Tensor, up: torch.Tensor, limit: float, out_dtype: torch.dtype | None = None
) -> torch.Tensor:
    """SwiGLU with GLM's limits (`reference.swiglu_clamped`), in the inputs' type, or (`out_dtype`) computed in fp32
    and returned as that; fp32 or bf16 rows on CUDA in one kernel (engine/ops/triton_moe.py `swiglu`, fp32 or bf16
    out: bf16 halves of a gate‖up output are read as they are, not widened into a copy first)."""
    out = out_dtype if out_dtype is not None else gate.dtype
    if (
        gate.is_cuda
        and gate.dim() == 2
        and gate.dtype == up.dtype
        and gate.dtype in (torch.float32, torch.bfloat16)
        and out in (torch.float32, torch.bfloat16)
        and (gate.dtype == torch.float32 or out_dtype is not None)  # bf16 in, bf16 out: only when asked
        and gate.stride(1) == 1 == up.stride(1)
    ):
        from engine.ops.triton_moe import swiglu

        return swiglu(gate, up, limit, out)
    if out_dtype is None:
        return reference.swiglu_clamped(gate, up, limit)
    return reference.swiglu_clamped(gate.float(), up.float(), limit).to(out_dtype)


def combine_pairs(
    pairs: torch.Tensor, order: torch.Tensor, weights: torch.Tensor, base: torch.Tensor | None = None
) -> torch.Tensor:
    """A prompt chunk's expert outputs, sorted by expert (`order`: each sorted row's flat (token, slot) index), back
    to their tokens: base + Σ_slot weights[t, slot] · pairs[row of (t, slot)] in slot order -> [T, W] fp32; on CUDA
    one kernel over the pairs (engine/ops/triton_moe.py `combine_pairs`)."""
    if pairs.is_cuda:
        from engine.ops.triton_moe import combine_pairs as fused

        return fused(pairs, order, weights, base)
    return reference.combine_pairs(pairs, order, weights, base)


def moe_decode_applies(x: torch.Tensor, top_k: int, stacked: Any) -> bool:
    """The MoE of a few tokens as sync-free kernels (routing on the device) over `stacked`: the stacked bf16 experts,
    or the EXL3 experts (`Exl3Experts`: their decode-GEMV takes as many pairs)."""
    return stacked is not None and x.is_cuda and x.shape[0] * top_k <= MOE_FUSED_MAX_PAIRS


def moe_route(*args: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """engine/ops/triton_moe.py `route`."""
    from engine.ops.triton_moe import route

    return route(*args)


def moe_experts(*args: Any) -> torch.Tensor:
    """engine/ops/triton_moe.py `routed_experts` (stacked bf16 experts)."""
    from engine.ops.triton_moe import routed_experts

    return routed_experts(*args)


class Exl3Experts:
    """A MoE layer's routed experts kept in EXL3 form on the GPU (never decoded to dense matrices): `gate_up` holds
    expert e's gate as matrix 2e and its up as matrix 2e+1, `down` expert e as matrix e (`Exl3Bank`s that
    engine/checkpoint/exl3.py `read_expert_banks` builds, this rank's whole-block TP parts). Calling it gives the
    routed partial sum (engine/ops/triton_exl3.py `routed_experts`: sync-free decode-GEMV for <= PAIRS_MAX (row, expert)
    pairs, experts decoded per chunk for prompt chunks); `add` (the shared expert's output [T, H], or a call giving
    it) is added in the last launch, with the bits of `add + routed`."""

    def __init__(self, gate_up: Any, down: Any) -> None:
        self.gate_up, self.down = gate_up, down

    def __call__(
        self,
        x: torch.Tensor,
        chosen: torch.Tensor,
        weights: torch.Tensor,
        limit: float,
        add: torch.Tensor | Callable[[], torch.Tensor] | None = None,
    ) -> torch.Tensor:
        from engine.ops.triton_exl3 import routed_experts

        return routed_experts(x, chosen, weights, self.gate_up, self.down, limit, add)
