"""The hyper-connections (engine/models/glm5_next/mhc.py) on the GPU: three kernels for decode steps and verify
windows, a cuBLAS product and two kernels for prompt chunks.

Done with torch ops, one sublayer's hyper-connection is ~30 small launches (the RMS norm, the 2n + n² logits, three
gate functions, a softmax, 20 Sinkhorn iterations, the pre-mix, the sublayer's own RMS norm, the post/comb mix); in a
decode step of a few tokens each is a launch of a few microseconds doing next to nothing, and in a prompt chunk each
reads or writes the streams again (on the H200 the kernels made a 4-layer prompt 4–7 % faster: docs/BENCHMARKS.md,
session 16). Here:

- `_hc_dots` (token × hidden chunk): each program's share of the logits' dot products (streams · fn) and of the
  streams' n × n Gram matrix, over one chunk of the hidden width of all n streams — fn (2n + n² rows of n·hidden,
  fp32, or the bf16 a GPU load keeps: fp32 products either way) is read once per token, spread over many SMs; a
  prompt chunk (more than DECODE_TOKENS tokens) takes the dot products as one fp32 matrix product instead (cuBLAS, [T, n·hidden] · fnᵀ: fn read once per tile of tokens; per
  token it was ~3 GB of L2 reads for a 2,048-token chunk, 0.46 ms on the H200) and the Gram matrix in `_hc_mix`;
- `_hc_mix` (token × hidden chunk; a prompt chunk: a token): the partial sums added, the norm applied
  (rms_norm(s) · fn = rsqrt(mean s²) · (s · fn), Σ s² the Gram matrix's trace), pre / post / comb gates, softmax and
  Sinkhorn in registers, then this chunk of the pre-mix h = Σ pre_n s_n with the sublayer's RMS norm and weight
  (|h|² = preᵀ · Gram · pre, so no program needs another's chunk): the sublayer's input; for a prompt chunk one
  program a token covers the whole width, PROMPT_CHUNK columns a step — the Gram matrix from a first pass over the
  token's streams, the gates once a token, not once per (token, chunk);
- `_hc_post` (token × hidden chunk): streams' = post ⊗ out + combᵀ · streams; in a step (a decode step, a verify
  window) also the next hyper-connection's `_hc_dots` share over the same chunk of the new streams, so a step runs
  two launches a hyper-connection where it ran three (`hc_post(..., next_fn)`, `hc_pre(..., partials=)`).

Everything is fp32, as the reference. Sums run in another order than the torch ops (the norm is applied after the
dot products, the hidden width is cut in chunks), so results agree to fp32 rounding, not bit for bit. A token's
result depends on the other tokens' values in neither form; in a prompt chunk it may depend on their number (which
algorithm cuBLAS picks for T rows), and the two forms (up to DECODE_TOKENS tokens and more) differ in the last bits.
The prompt form's product is fp32 only while torch's float32 matmul precision is "highest" (its default: no TF32);
under another setting prompt chunks take the decode form's kernels. Also `sinkhorn`, the Sinkhorn iterations alone
(`fused.hc_weights`: the gates without the mix, and a stream count that is not a power of two).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from engine.ops.reference import ROW_INVARIANT_ROWS, widened

CHUNK = 128  # hidden columns a `_hc_dots` / `_hc_mix` / `_hc_post` program covers
DOTS_WARPS, MIX_WARPS = 4, 1  # warps a `_hc_dots` / `_hc_mix` program (bench/hc_bench.py: one warp saves `_hc_mix` its
# cross-warp reductions, 10.4 -> 7.8 µs a `hc_pre` of one token on the H200) ...
DECODE_TOKENS = ROW_INVARIANT_ROWS  # ... for up to this many tokens (a step's rows: decode, verify windows)
# a step's `hc_post` makes the next map's sums (False: three launches, `bench/gpu_engine.py --hc-unchained`)
CHAIN = True
# a step's post and comb (the Sinkhorn iterations, ~2 µs of a one-token `hc_pre` on the H200, session 24) made by
# `_hc_gates` on a second stream beside `_hc_mix` and the sublayer, which need only pre; `hc_post` reads them after
# `fused.hc_around` joins it (H100, the served cut, four alternating runs: a KDA + MoE layer 0.134-0.135 -> 0.126-0.127
# ms at one row, docs/BENCHMARKS.md session 51). False: `_hc_mix`'s first program makes them, on the step's stream
# (`bench/gpu_engine.py --hc-gates-inline`)
GATES_BESIDE = True
PROMPT_CHUNK, PROMPT_WARPS = 512, 4  # a prompt chunk's `_hc_mix`: hidden columns a step of its one program a token
# (32 steps of 128 took 374 µs a call of 2,048 tokens on the H200), warps


@triton.jit
def _sinkhorn_rows_cols(m, eps, ITERS: tl.constexpr):
    """Column normalisation, then ITERS - 1 rounds of rows then columns (the reference's order)."""
    m = m / (tl.sum(m, axis=0)[None, :] + eps)
    for _ in range(ITERS - 1):
        m = m / (tl.sum(m, axis=1)[:, None] + eps)
        m = m / (tl.sum(m, axis=0)[None, :] + eps)
    return m


@triton.jit
def _sinkhorn(comb_ptr, out_ptr, eps, N: tl.constexpr, ITERS: tl.constexpr):
    token = tl.program_id(0).to(tl.int64)  # a long chunk's offsets pass 2^31
    rows = tl.arange(0, N)[:, None]
    cols = tl.arange(0, N)[None, :]
    offsets = token * N * N + rows * N + cols
    tl.store(out_ptr + offsets, _sinkhorn_rows_cols(tl.load(comb_ptr + offsets), eps, ITERS))


def sinkhorn(comb: torch.Tensor, iters: int, eps: float) -> torch.Tensor:
    """comb [T, n, n] fp32 (softmax + eps already applied) -> doubly stochastic [T, n, n]."""
    comb = comb.contiguous()
    out = torch.empty_like(comb)
    _sinkhorn[(comb.shape[0],)](comb, out, eps, N=comb.shape[-1], ITERS=iters)
    return out


@triton.jit
def _dots_of(
    streams_ptr,
    fn_ptr,
    dots_ptr,
    gram_ptr,
    token,
    chunk,
    HIDDEN: tl.constexpr,
    N: tl.constexpr,
    R: tl.constexpr,
    R_PAD: tl.constexpr,
    CHUNKS: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """One (token, hidden chunk)'s share of the logits' dot products (streams · fn) and of the streams' Gram
    matrix: `_hc_dots`, and the tail of `_hc_post` when it works them out for the next hyper-connection."""
    cols = chunk * BLOCK + tl.arange(0, BLOCK)
    live = cols < HIDDEN
    n_idx = tl.arange(0, N)
    rows = tl.arange(0, R_PAD)
    s = tl.load(streams_ptr + (token * N + n_idx[:, None]) * HIDDEN + cols[None, :], mask=live[None, :], other=0.0)
    gram = tl.sum(s[:, None, :] * s[None, :, :], axis=2)  # [N, N]: the streams' dot products
    dots = tl.zeros([R_PAD], dtype=tl.float32)
    for n in tl.static_range(N):
        x = tl.load(streams_ptr + (token * N + n) * HIDDEN + cols, mask=live, other=0.0)
        w = tl.load(
            fn_ptr + rows[:, None] * (N * HIDDEN) + n * HIDDEN + cols[None, :],
            mask=(rows[:, None] < R) & live[None, :],
            other=0.0,
        )
        dots += tl.sum(w * x[None, :], axis=1)
    part = token * CHUNKS + chunk
    tl.store(dots_ptr + part * R_PAD + rows, dots)
    tl.store(gram_ptr + part * N * N + n_idx[:, None] * N + n_idx[None, :], gram)


@triton.jit
def _hc_dots(
    streams_ptr,
    fn_ptr,
    dots_ptr,
    gram_ptr,
    HIDDEN: tl.constexpr,
    N: tl.constexpr,
    R: tl.constexpr,
    R_PAD: tl.constexpr,
    CHUNKS: tl.constexpr,
    BLOCK: tl.constexpr,
):
    token = tl.program_id(0).to(tl.int64)  # a long chunk's offsets pass 2^31
    chunk = tl.program_id(1)
    _dots_of(streams_ptr, fn_ptr, dots_ptr, gram_ptr, token, chunk, HIDDEN, N, R, R_PAD, CHUNKS, BLOCK)


@triton.jit
def _gram_of_parts(gram_ptr, first, N: tl.constexpr, CHUNKS: tl.constexpr, CHUNKS_PAD: tl.constexpr):
    """The streams' Gram matrix [N, N] of one token: its CHUNKS partial sums from `first` on, added."""
    parts = tl.arange(0, CHUNKS_PAD)
    n_idx = tl.arange(0, N)
    square = n_idx[:, None] * N + n_idx[None, :]
    return tl.sum(
        tl.load(
            gram_ptr + (first + parts)[:, None, None] * N * N + square[None, :, :],
            mask=(parts < CHUNKS)[:, None, None],
            other=0.0,
        ),
        axis=0,
    )


@triton.jit
def _gate_logits(
    dots_ptr,
    gram,
    first,
    norm_eps,
    HIDDEN: tl.constexpr,
    N: tl.constexpr,
    R_PAD: tl.constexpr,
    CHUNKS: tl.constexpr,
    CHUNKS_PAD: tl.constexpr,
):
    """One token's pre / post / comb logits [N], [N], [N, N]: each summed over the CHUNKS partial sums from `first`
    on, then normalised by the streams' RMS (Σ s², the Gram matrix's trace)."""
    parts = tl.arange(0, CHUNKS_PAD)
    part_live = parts < CHUNKS
    n_idx = tl.arange(0, N)
    square = n_idx[:, None] * N + n_idx[None, :]
    total = tl.sum(tl.sum(tl.where(n_idx[:, None] == n_idx[None, :], gram, 0.0), axis=1), axis=0)  # Σ s²
    inv = 1.0 / tl.sqrt(total / (N * HIDDEN) + norm_eps)
    part_rows = (first + parts)[:, None] * R_PAD
    # the three groups of logits, each summed over the chunks, then normalised
    pre_l = tl.sum(tl.load(dots_ptr + part_rows + n_idx[None, :], mask=part_live[:, None], other=0.0), axis=0) * inv
    post_l = (
        tl.sum(tl.load(dots_ptr + part_rows + N + n_idx[None, :], mask=part_live[:, None], other=0.0), axis=0) * inv
    )
    comb_l = (
        tl.sum(
            tl.load(
                dots_ptr + part_rows[:, :, None] + 2 * N + square[None, :, :], mask=part_live[:, None, None], other=0.0
            ),
            axis=0,
        )
        * inv
    )
    return pre_l, post_l, comb_l


@triton.jit
def _store_gates(
    post_l, comb_l, base_ptr, scale_ptr, post_ptr, comb_ptr, token, hc_eps, N: tl.constexpr, ITERS: tl.constexpr
):
    """post = 2 · sigmoid(post logits) and comb = Sinkhorn(softmax(comb logits) + eps) of one token, stored."""
    n_idx = tl.arange(0, N)
    square = n_idx[:, None] * N + n_idx[None, :]
    post = 2.0 * tl.sigmoid(post_l * tl.load(scale_ptr + 1) + tl.load(base_ptr + N + n_idx))
    z = comb_l * tl.load(scale_ptr + 2) + tl.load(base_ptr + 2 * N + square)
    z = tl.exp(z - tl.max(z, axis=1)[:, None])
    comb = _sinkhorn_rows_cols(z / tl.sum(z, axis=1)[:, None] + hc_eps, hc_eps, ITERS)
    tl.store(post_ptr + token * N + n_idx, post)
    tl.store(comb_ptr + token * N * N + square, comb)


@triton.jit
def _hc_mix(
    streams_ptr,
    dots_ptr,
    gram_ptr,
    base_ptr,
    scale_ptr,
    norm_w_ptr,
    x_ptr,
    post_ptr,
    comb_ptr,
    hc_eps,
    norm_eps,
    sub_eps,
    HIDDEN: tl.constexpr,
    N: tl.constexpr,
    R_PAD: tl.constexpr,
    CHUNKS: tl.constexpr,
    CHUNKS_PAD: tl.constexpr,
    ITERS: tl.constexpr,
    BLOCK: tl.constexpr,
    SPAN: tl.constexpr = 1,
    GRAM: tl.constexpr = False,
    GATES: tl.constexpr = True,
):
    """One program per (token, SPAN hidden chunks of BLOCK); each works the gates out from the CHUNKS partial sums
    (a few hundred flops), the first also stores post and comb (GATES; else `_hc_gates` does, beside). GRAM (a
    prompt chunk: one program a token, SPAN chunks the whole width): the Gram matrix from the token's streams here,
    not from partial sums."""
    token = tl.program_id(0).to(tl.int64)  # a long chunk's offsets pass 2^31
    chunk = tl.program_id(1)
    first = token * CHUNKS
    n_idx = tl.arange(0, N)
    if GRAM:
        gram = tl.zeros([N, N], dtype=tl.float32)
        for i in range(SPAN):
            cols = i * BLOCK + tl.arange(0, BLOCK)
            s = tl.load(
                streams_ptr + token * N * HIDDEN + n_idx[:, None] * HIDDEN + cols[None, :],
                mask=(cols < HIDDEN)[None, :],
                other=0.0,
            )
            gram += tl.sum(s[:, None, :] * s[None, :, :], axis=2)
    else:
        gram = _gram_of_parts(gram_ptr, first, N, CHUNKS, CHUNKS_PAD)
    pre_l, post_l, comb_l = _gate_logits(dots_ptr, gram, first, norm_eps, HIDDEN, N, R_PAD, CHUNKS, CHUNKS_PAD)
    pre = tl.sigmoid(pre_l * tl.load(scale_ptr) + tl.load(base_ptr + n_idx)) + hc_eps
    if GATES:
        if chunk == 0:
            _store_gates(post_l, comb_l, base_ptr, scale_ptr, post_ptr, comb_ptr, token, hc_eps, N, ITERS)
    # the pre-mix h = Σ pre_n s_n of this chunk, RMS-normalised: |h|² = preᵀ · gram · pre, no second pass
    h_sq = tl.sum(tl.sum(pre[:, None] * gram * pre[None, :], axis=1), axis=0)
    inv_h = 1.0 / tl.sqrt(h_sq / HIDDEN + sub_eps)
    for i in range(SPAN):
        cols = (chunk * SPAN + i) * BLOCK + tl.arange(0, BLOCK)
        live = cols < HIDDEN
        s = tl.load(
            streams_ptr + token * N * HIDDEN + n_idx[:, None] * HIDDEN + cols[None, :], mask=live[None, :], other=0.0
        )
        h = tl.sum(pre[:, None] * s, axis=0)
        w = tl.load(norm_w_ptr + cols, mask=live, other=0.0)
        tl.store(x_ptr + token * HIDDEN + cols, h * inv_h * w, mask=live)


@triton.jit
def _hc_gates(
    dots_ptr,
    gram_ptr,
    base_ptr,
    scale_ptr,
    post_ptr,
    comb_ptr,
    hc_eps,
    norm_eps,
    HIDDEN: tl.constexpr,
    N: tl.constexpr,
    R_PAD: tl.constexpr,
    CHUNKS: tl.constexpr,
    CHUNKS_PAD: tl.constexpr,
    ITERS: tl.constexpr,
):
    """A program a token: `_hc_mix`'s post and comb (its first program's, GATES), from the same partial sums by
    the same steps, for a launch beside the mix and the sublayer (the Sinkhorn iterations off the step's path)."""
    token = tl.program_id(0).to(tl.int64)
    first = token * CHUNKS
    gram = _gram_of_parts(gram_ptr, first, N, CHUNKS, CHUNKS_PAD)
    _, post_l, comb_l = _gate_logits(dots_ptr, gram, first, norm_eps, HIDDEN, N, R_PAD, CHUNKS, CHUNKS_PAD)
    _store_gates(post_l, comb_l, base_ptr, scale_ptr, post_ptr, comb_ptr, token, hc_eps, N, ITERS)


@triton.jit
def _hc_post(
    streams_ptr,
    out_ptr,
    post_ptr,
    comb_ptr,
    new_ptr,
    fn_ptr,
    dots_ptr,
    gram_ptr,
    HIDDEN: tl.constexpr,
    N: tl.constexpr,
    BLOCK: tl.constexpr,
    R: tl.constexpr = 1,
    R_PAD: tl.constexpr = 1,
    CHUNKS: tl.constexpr = 1,
    DOTS: tl.constexpr = False,
):
    """streams' = post ⊗ out + combᵀ · streams for one (token, hidden chunk); DOTS: then the next hyper-connection's
    share of its dot products and Gram matrix over the same chunk of the new streams (fn: its map), as `_hc_dots`
    would make them, read back from where this program stored them (its own threads' stores, after a barrier)."""
    token = tl.program_id(0).to(tl.int64)  # a long chunk's offsets pass 2^31
    chunk = tl.program_id(1)
    cols = chunk * BLOCK + tl.arange(0, BLOCK)
    live = cols < HIDDEN
    n_idx = tl.arange(0, N)
    s = tl.load(
        streams_ptr + token * N * HIDDEN + n_idx[:, None] * HIDDEN + cols[None, :], mask=live[None, :], other=0.0
    )  # [N (m), BLOCK]
    comb = tl.load(comb_ptr + token * N * N + n_idx[:, None] * N + n_idx[None, :])  # [m, n]
    mixed = tl.sum(comb[:, :, None] * s[:, None, :], axis=0)  # [n, BLOCK]
    post = tl.load(post_ptr + token * N + n_idx)
    out = tl.load(out_ptr + token * HIDDEN + cols, mask=live, other=0.0)
    tl.store(
        new_ptr + token * N * HIDDEN + n_idx[:, None] * HIDDEN + cols[None, :],
        post[:, None] * out[None, :] + mixed,
        mask=live[None, :],
    )
    if DOTS:
        tl.debug_barrier()
        _dots_of(new_ptr, fn_ptr, dots_ptr, gram_ptr, token, chunk, HIDDEN, N, R, R_PAD, CHUNKS, BLOCK)


def decode_form(tokens: int) -> bool:
    """Whether `hc_pre` takes a step's form for this many tokens (`_hc_dots`' partial sums, which `hc_post` can make
    ahead for the next hyper-connection) rather than a prompt chunk's (one fp32 product)."""
    return tokens <= DECODE_TOKENS or torch.get_float32_matmul_precision() != "highest"


def _partials(tokens: int, chunks: int, rows: int, n: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Room for `_hc_dots`' partial sums: dots [T, chunks, R_PAD], Gram matrices [T, chunks, n, n]."""
    dots = torch.empty(tokens, chunks, triton.next_power_of_2(rows), dtype=torch.float32, device=device)
    return dots, torch.empty(tokens, chunks, n, n, dtype=torch.float32, device=device)


def hc_pre(
    streams: torch.Tensor,
    fn: torch.Tensor,
    base: torch.Tensor,
    scale: torch.Tensor,
    norm_weight: torch.Tensor,
    hc_eps: float,
    norm_eps: float,
    sub_eps: float,
    iters: int,
    partials: tuple[torch.Tensor, torch.Tensor] | None = None,
    side: torch.cuda.Stream | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """streams [T, n, hidden] fp32 -> (the sublayer's input rms_norm(Σ pre·streams) · norm_weight [T, hidden],
    post [T, n], comb [T, n, n]); fn [2n + n², n·hidden] (fp32, or bf16 values kept as bf16: `_hc_dots` reads them
    as they are, each exact in its fp32 products, its sums in the order its layout for that element size gives),
    base [2n + n²], scale [3], norm_weight [hidden], fp32. `partials`: `_hc_dots`' sums for these streams and this
    fn, made ahead by the previous `hc_post` (a step's form only). `side` (a step's form only; else unused): post
    and comb are made on that stream (`_hc_gates`, the same bits), begun after what this stream has queued; the
    caller makes its stream wait for `side` before it reads them."""
    streams = streams.contiguous()
    tokens, n, hidden = streams.shape
    rows = fn.shape[0]
    chunks = triton.cdiv(hidden, CHUNK)  # CHUNK read at the call (the bench)
    prompt = not decode_form(tokens)
    if prompt:  # the dot products as one fp32 product
        dots = torch.mm(streams.view(tokens, n * hidden), widened(fn).t())  # [T, rows]: one part, rows apart
        gram, r_pad, parts = dots, rows, 1  # no Gram partials: `_hc_mix` makes the matrix (gram_ptr unread)
    else:
        r_pad = triton.next_power_of_2(rows)
        parts = chunks
        if partials is not None:
            dots, gram = partials
            if dots.shape != (tokens, chunks, r_pad) or gram.shape != (tokens, chunks, n, n):
                raise ValueError(
                    f"partial sums {tuple(dots.shape)} / {tuple(gram.shape)} were not made for {tokens} tokens, "
                    f"{chunks} chunks and {rows} logits"
                )
        else:
            dots, gram = _partials(tokens, chunks, rows, n, streams.device)
            _hc_dots[(tokens, chunks)](
                streams, fn, dots, gram, HIDDEN=hidden, N=n, R=rows, R_PAD=r_pad, CHUNKS=chunks, BLOCK=CHUNK,
                num_warps=DOTS_WARPS,
            )  # fmt: skip
    x = torch.empty(tokens, hidden, dtype=torch.float32, device=streams.device)
    post = torch.empty(tokens, n, dtype=torch.float32, device=streams.device)
    comb = torch.empty(tokens, n, n, dtype=torch.float32, device=streams.device)
    beside = False
    if side is not None and not prompt:
        beside = True
        side.wait_stream(torch.cuda.current_stream(streams.device))
        with torch.cuda.stream(side):
            gates(dots, gram, base, scale, post, comb, hc_eps, norm_eps, hidden, iters)
        for t in (dots, gram, post, comb):  # made on this stream, used on the side one
            t.record_stream(side)
    _hc_mix[(tokens, 1 if prompt else chunks)](
        streams,
        dots,
        gram,
        base,
        scale,
        norm_weight,
        x,
        post,
        comb,
        hc_eps,
        norm_eps,
        sub_eps,
        HIDDEN=hidden,
        N=n,
        R_PAD=r_pad,
        CHUNKS=parts,
        CHUNKS_PAD=triton.next_power_of_2(parts),
        ITERS=iters,
        BLOCK=PROMPT_CHUNK if prompt else CHUNK,
        SPAN=triton.cdiv(hidden, PROMPT_CHUNK) if prompt else 1,
        GRAM=prompt,
        GATES=not beside,
        num_warps=PROMPT_WARPS if prompt else MIX_WARPS,
    )
    return x, post, comb


def gates(
    dots: torch.Tensor,
    gram: torch.Tensor,
    base: torch.Tensor,
    scale: torch.Tensor,
    post: torch.Tensor,
    comb: torch.Tensor,
    hc_eps: float,
    norm_eps: float,
    hidden: int,
    iters: int,
) -> None:
    """`_hc_gates`: post [T, n] and comb [T, n, n] of streams `hidden` wide from `_hc_dots`' partial sums dots
    [T, chunks, R_PAD] and gram [T, chunks, n, n]: what `hc_pre`'s `_hc_mix` stores from its first program of a
    token (GATES), by the same steps."""
    tokens, chunks, r_pad = dots.shape
    _hc_gates[(tokens,)](
        dots, gram, base, scale, post, comb, hc_eps, norm_eps, HIDDEN=hidden, N=gram.shape[-1], R_PAD=r_pad,
        CHUNKS=chunks, CHUNKS_PAD=triton.next_power_of_2(chunks), ITERS=iters, num_warps=MIX_WARPS,
    )  # fmt: skip


def hc_post(
    streams: torch.Tensor,
    out: torch.Tensor,
    post: torch.Tensor,
    comb: torch.Tensor,
    next_fn: torch.Tensor | None = None,
) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor] | None]:
    """streams [T, n, hidden], the sublayer's output [T, hidden] -> (post ⊗ out + combᵀ · streams [T, n, hidden],
    and with `next_fn`, where the next `hc_pre` takes a step's form, its `_hc_dots` sums for the new streams, made in
    the same launch: `hc_pre(..., partials=)`; else None)."""
    streams, out = streams.contiguous(), out.contiguous()
    tokens, n, hidden = streams.shape
    new = torch.empty_like(streams)
    chunks = triton.cdiv(hidden, CHUNK)
    if next_fn is None or not CHAIN or not decode_form(tokens):
        _hc_post[(tokens, chunks)](streams, out, post, comb, new, new, new, new, HIDDEN=hidden, N=n, BLOCK=CHUNK)
        return new, None
    rows = next_fn.shape[0]
    dots, gram = _partials(tokens, chunks, rows, n, streams.device)
    _hc_post[(tokens, chunks)](
        streams, out, post, comb, new, next_fn, dots, gram, HIDDEN=hidden, N=n, BLOCK=CHUNK, R=rows,
        R_PAD=triton.next_power_of_2(rows), CHUNKS=chunks, DOTS=True, num_warps=DOTS_WARPS,
    )  # fmt: skip
    return new, (dots, gram)
