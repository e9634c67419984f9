"""One decode token of Kimi Delta Attention (engine/models/glm5_next/kda.py) per stream, in one GPU kernel.

Between the input projections and o_proj, the reference runs ~40 small torch ops per layer for a decode token (conv
window shift, conv, SiLU, two L2 norms, the decay and write-strength gates, the delta rule's five steps, the gated
RMS norm, the lane state's gather and scatter). Here one program per (stream, head) does all of it in registers:

    conv + SiLU over the K-1 cached inputs and the new one (q, k and v channels of its head); q, k L2-normalised
    (q · d^-1/2); g = lower_bound · sigmoid(e^A_log · (f + dt_bias)) (or -e^A_log · softplus(f + dt_bias) without a
    bound); beta = sigmoid(b); S ← e^g ⊙ S; δ = beta · (v − Sᵀk); S ← S + k δᵀ; o = Sᵀq; out = rms_norm(o) · w ·
    sigmoid(gate),

reading the stream's lane state ([lanes, H, d, d] fp32 and the conv windows [lanes, 3·H·d, K-1]) at `lane_ids` and
writing the new one in place, or (a verify window's row) to other tensors of the same per-lane shape: the state
kept after that row, so no copy of it is made. fp32 throughout, as the reference (`ops.kda_step`); sums run in
another order, so the result agrees to fp32 rounding. A stream's result depends on its own inputs and state only.

A prompt chunk's causal conv (`causal_conv`, `_causal_conv`) is one launch too: a program per (block of tokens,
block of channels) takes each output's K taps from the chunk or, for its first K-1 tokens, from the window, in tap
order, then SiLU (the torch form was five launches and a concatenation: ~0.5 ms a 2k chunk of a KDA layer's 12k
channels on the H200). An output depends on its own K inputs alone, whatever the chunk's length. `conv_qkv` is the
same launch with a program a head that also L2-normalises q's and k's heads (q then scaled) and writes q, k and v as
three contiguous tensors: the torch form took a dozen launches for the two norms, and fla-core copied the strided v.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from engine.ops import reference
from engine.ops.triton_dense import _round_bf16


@triton.jit
def _conv_silu(proj_ptr, win_ptr, conv_w_ptr, chan, live, taps, KERNEL: tl.constexpr):
    """The causal conv (+ SiLU) of channels `chan` [D] over their window [D, K-1] and new input; also the shifted
    window [D, KP] (its last K-1 taps) to store back."""
    past = taps[None, :] < KERNEL - 1
    window = tl.load(win_ptr + chan[:, None] * (KERNEL - 1) + taps[None, :], mask=live[:, None] & past, other=0.0)
    new = tl.load(proj_ptr + chan, mask=live, other=0.0)
    seq = tl.where(taps[None, :] == KERNEL - 1, new[:, None], window)  # [D, KP]: K taps in order
    w = tl.load(
        conv_w_ptr + chan[:, None] * KERNEL + taps[None, :], mask=live[:, None] & (taps[None, :] < KERNEL), other=0.0
    )
    y = tl.sum(seq * w, axis=1)
    # the next window: taps 1..K-1 of seq (the oldest input dropped)
    nxt = tl.load(
        win_ptr + chan[:, None] * (KERNEL - 1) + taps[None, :] + 1,
        mask=live[:, None] & (taps[None, :] + 1 < KERNEL - 1),
        other=0.0,
    )
    nxt = tl.where(taps[None, :] == KERNEL - 2, new[:, None], nxt)
    return y * tl.sigmoid(y), nxt


@triton.jit
def _store_window(win_ptr, chan, live, taps, nxt, KERNEL: tl.constexpr):
    tl.store(
        win_ptr + chan[:, None] * (KERNEL - 1) + taps[None, :], nxt, mask=live[:, None] & (taps[None, :] < KERNEL - 1)
    )


@triton.jit
def _kda_decode(
    proj_ptr,
    f_ptr,
    b_ptr,
    gate_ptr,
    conv_w_ptr,
    dt_bias_ptr,
    a_decay_ptr,
    o_norm_ptr,
    lane_ptr,
    win_all_ptr,
    state_all_ptr,
    win_out_ptr,
    state_out_ptr,
    out_ptr,
    lower_bound,
    eps,
    q_scale,
    proj_stride,
    f_stride,
    b_stride,
    gate_stride,
    win_lane_stride,
    state_lane_stride,
    win_out_lane_stride,
    state_out_lane_stride,
    HEADS: tl.constexpr,
    D: tl.constexpr,
    DP: tl.constexpr,
    KERNEL: tl.constexpr,
    KP: tl.constexpr,
    BOUNDED: tl.constexpr,
):
    row = tl.program_id(0)
    head = tl.program_id(1)
    lane = tl.load(lane_ptr + row).to(tl.int64)
    width = HEADS * D
    offs = tl.arange(0, DP)
    live = offs < D
    taps = tl.arange(0, KP)
    chan = head * D + offs
    proj = proj_ptr + row * proj_stride
    win = win_all_ptr + lane * win_lane_stride
    q, q_win = _conv_silu(proj, win, conv_w_ptr, chan, live, taps, KERNEL)
    k, k_win = _conv_silu(proj, win, conv_w_ptr, width + chan, live, taps, KERNEL)
    v, v_win = _conv_silu(proj, win, conv_w_ptr, 2 * width + chan, live, taps, KERNEL)
    q = q / tl.sqrt(tl.sum(q * q, axis=0) + 1e-6) * q_scale
    k = k / tl.sqrt(tl.sum(k * k, axis=0) + 1e-6)
    raw = tl.load(f_ptr + row * f_stride + chan, mask=live, other=0.0) + tl.load(
        dt_bias_ptr + chan, mask=live, other=0.0
    )
    a = tl.load(a_decay_ptr + head)
    if BOUNDED:
        g = lower_bound * tl.sigmoid(a * raw)
    else:
        g = -a * tl.where(raw > 20.0, raw, tl.log(1.0 + tl.exp(tl.minimum(raw, 20.0))))
    beta = tl.sigmoid(tl.load(b_ptr + row * b_stride + head))
    square = head * D * D + offs[:, None] * D + offs[None, :]
    both = live[:, None] & live[None, :]
    s = tl.load(state_all_ptr + lane * state_lane_stride + square, mask=both, other=0.0) * tl.exp(g)[:, None]  # [k, v]
    delta = (v - tl.sum(s * k[:, None], axis=0)) * beta
    s = s + k[:, None] * delta[None, :]
    o = tl.sum(s * q[:, None], axis=0)
    o = o / tl.sqrt(tl.sum(o * o, axis=0) / D + eps) * tl.load(o_norm_ptr + offs, mask=live, other=0.0)
    o = o * tl.sigmoid(tl.load(gate_ptr + row * gate_stride + chan, mask=live, other=0.0))
    tl.debug_barrier()  # every window value is read before any is overwritten (in place)
    win_out = win_out_ptr + lane * win_out_lane_stride
    _store_window(win_out, chan, live, taps, q_win, KERNEL)
    _store_window(win_out, width + chan, live, taps, k_win, KERNEL)
    _store_window(win_out, 2 * width + chan, live, taps, v_win, KERNEL)
    tl.store(state_out_ptr + lane * state_out_lane_stride + square, s, mask=both)
    tl.store(out_ptr + row * width + chan, o, mask=live)


def kda_decode(
    proj: torch.Tensor,
    f: torch.Tensor,
    b: torch.Tensor,
    gate: torch.Tensor,
    conv_w: torch.Tensor,
    dt_bias: torch.Tensor,
    a_decay: torch.Tensor,
    o_norm: torch.Tensor,
    lane_ids: torch.Tensor,
    windows: torch.Tensor,
    states: torch.Tensor,
    lower_bound: float | None,
    eps: float,
    windows_out: torch.Tensor | None = None,
    states_out: torch.Tensor | None = None,
) -> torch.Tensor:
    """One token per stream. proj [B, ≥3·H·d] (the q|k|v projections before the conv), f [B, H·d] (f_b's output),
    b [B, ≥H] (beta logits), gate [B, H·d] (g_b's output): fp32, rows may be strided; conv_w [3·H·d, K], dt_bias
    [H·d], a_decay [H] (e^A_log), o_norm [d]; lane_ids [B]; windows [lanes, 3·H·d, K-1] and states [lanes, H, d, d]
    (fp32; each lane's part contiguous, the lanes at any stride), updated in place, or left as they are with the new
    ones written to `windows_out` / `states_out` (the same shapes). Returns the gated, normalised output [B, H·d]
    fp32 (o_proj's input)."""
    rows = lane_ids.shape[0]
    heads, d = states.shape[1], states.shape[2]
    kernel = conv_w.shape[1]
    for t in (proj, f, b, gate):
        assert t.stride(-1) == 1 and t.dtype == torch.float32
    windows_out = windows if windows_out is None else windows_out
    states_out = states if states_out is None else states_out
    for t in (windows, states, windows_out, states_out):  # a lane's part contiguous: lanes may be a strided view's
        assert t.dtype == torch.float32 and t[0].is_contiguous()
    assert windows_out.shape == windows.shape and states_out.shape == states.shape and conv_w.is_contiguous()
    out = torch.empty(rows, heads * d, dtype=torch.float32, device=proj.device)
    dp = triton.next_power_of_2(d)
    _kda_decode[(rows, heads)](
        proj,
        f,
        b,
        gate,
        conv_w,
        dt_bias,
        a_decay,
        o_norm,
        lane_ids,
        windows,
        states,
        windows_out,
        states_out,
        out,
        0.0 if lower_bound is None else lower_bound,
        eps,
        d**-0.5,
        proj.stride(0),
        f.stride(0),
        b.stride(0),
        gate.stride(0),
        windows.stride(0),
        states.stride(0),
        windows_out.stride(0),
        states_out.stride(0),
        HEADS=heads,
        D=d,
        DP=dp,
        KERNEL=kernel,
        KP=triton.next_power_of_2(kernel),
        BOUNDED=lower_bound is not None,
        num_warps=16 if dp >= 128 else 4,
    )  # 16 warps: the 128×128 state tile without spilling much
    return out


CONV_BLOCK = (32, 128)  # tokens × channels a program of the prompt conv


@triton.jit
def _causal_conv(
    x_ptr, win_ptr, w_ptr, out_ptr, T, C, x_stride, w_stride, PART, q_scale, eps, KERNEL: tl.constexpr,
    BT: tl.constexpr, BC: tl.constexpr, NORM: tl.constexpr,
):  # fmt: skip
    rows = tl.program_id(0) * BT + tl.arange(0, BT)
    first = tl.program_id(1) * BC
    cols = first + tl.arange(0, BC)
    row_ok = rows < T
    col_ok = cols < C
    acc = tl.zeros([BT, BC], dtype=tl.float32)
    for k in tl.static_range(KERNEL):
        j = rows + (k - (KERNEL - 1))  # the tap's input: x row j, or window column K-1+j before the chunk
        from_x = (row_ok & (j >= 0))[:, None] & col_ok[None, :]
        from_win = (row_ok & (j < 0))[:, None] & col_ok[None, :]
        xv = tl.load(x_ptr + j.to(tl.int64)[:, None] * x_stride + cols[None, :], mask=from_x, other=0.0)
        wv = tl.load(win_ptr + cols[None, :] * (KERNEL - 1) + (j + KERNEL - 1)[:, None], mask=from_win, other=0.0)
        tap = tl.where(from_x, xv, wv)
        weight = tl.load(w_ptr + cols * w_stride + k, mask=col_ok, other=0.0)
        if k == 0:
            acc = tap * weight[None, :]
        else:
            acc = acc + tap * weight[None, :]
    out = acc * tl.sigmoid(acc)  # SiLU, as the decode kernel takes it
    if NORM:  # the block is one head: q's and k's heads L2-normalised (eps under the root), q's then scaled
        if first < 2 * PART:
            norm = tl.sqrt_rn(tl.sum(out * out, axis=1) + eps)
            out = tl.div_rn(out, norm[:, None])
            if first < PART:
                out = out * q_scale
    # channel c of token t at part c // PART (q, k, v: each [T, PART] contiguous; one part when PART = C): a block's
    # channels lie in one part (BC divides PART, or PART = C)
    part = first // PART
    at = rows.to(tl.int64)[:, None] * PART + (cols - part * PART)[None, :]
    tl.store(out_ptr + part.to(tl.int64) * T * PART + at, out, mask=row_ok[:, None] & col_ok[None, :])


def causal_conv(x: torch.Tensor, window: torch.Tensor, weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """`reference.causal_conv` for a CUDA chunk in one launch: x [T, C] fp32 (rows may be strided), window [C, K-1],
    weight [C, K] -> the outputs [T, C] and the new window [C, K-1] (the last K-1 inputs)."""
    t, channels = x.shape
    out = torch.empty(t, channels, dtype=torch.float32, device=x.device)
    return out, _conv_launch(x, window, weight, out, channels, CONV_BLOCK[1], norm=False)


def conv_qkv(
    x: torch.Tensor, window: torch.Tensor, weight: torch.Tensor, head_dim: int, eps: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """A KDA prompt chunk's conv + SiLU split into q, k, v with q's and k's heads L2-normalised and q scaled by
    head_dim^-1/2 (`fused.conv_qkv`'s contract), in one kernel (and the window's copy): x [T, 3·W] fp32 (rows may be strided), window
    [3·W, K-1], weight [3·W, K] -> q, k, v [T, W / head_dim, head_dim], each contiguous, and the new window. A
    program's channels are one head (head_dim a power of two), so its sums of squares stay in registers."""
    t, channels = x.shape
    part = channels // 3
    assert channels % (3 * head_dim) == 0 and head_dim & (head_dim - 1) == 0, "a program's channels: one head of q|k|v"
    out = torch.empty(3, t, part, dtype=torch.float32, device=x.device)
    new_window = _conv_launch(x, window, weight, out, part, head_dim, norm=True, q_scale=head_dim**-0.5, eps=eps)
    q, k, v = (o.view(t, part // head_dim, head_dim) for o in out)
    return q, k, v, new_window


def _conv_launch(x, window, weight, out, part: int, block_c: int, norm: bool, q_scale: float = 1.0, eps: float = 0.0):
    t, channels = x.shape
    window = window.contiguous()
    bt = CONV_BLOCK[0]
    _causal_conv[(triton.cdiv(t, bt), triton.cdiv(channels, block_c))](
        x, window, weight, out, t, channels, x.stride(0), weight.stride(0), part, float(q_scale), float(eps),
        KERNEL=weight.shape[1], BT=bt, BC=block_c, NORM=norm, num_warps=4,
    )  # fmt: skip
    return reference.conv_window(x, window)


NORM_ROWS = 16  # tokens a program of `gated_norm`


@triton.jit
def _gated_norm(
    core_ptr, gate_ptr, w_ptr, out_ptr, T, core_stride, gate_stride, out_stride, eps, D: tl.constexpr,
    BT: tl.constexpr, BF16: tl.constexpr,
):  # fmt: skip
    rows = tl.program_id(0) * BT + tl.arange(0, BT)
    chan = tl.program_id(1) * D + tl.arange(0, D)  # one head
    ok = (rows < T)[:, None]
    r64 = rows.to(tl.int64)[:, None]
    o = tl.load(core_ptr + r64 * core_stride + chan[None, :], mask=ok, other=0.0)
    gate = tl.load(gate_ptr + r64 * gate_stride + chan[None, :], mask=ok, other=0.0)
    w = tl.load(w_ptr + tl.arange(0, D))
    o = o / tl.sqrt(tl.sum(o * o, axis=1) / D + eps)[:, None] * w[None, :]
    o = o * tl.sigmoid(gate)
    if BF16:  # rounded to nearest even as torch's cast (and so in the interpreter, whose cast truncates)
        o = _round_bf16(o)
    tl.store(out_ptr + r64 * out_stride + chan[None, :], o, mask=ok)


def gated_norm(
    core: torch.Tensor, gate: torch.Tensor, weight: torch.Tensor, eps: float, dtype: torch.dtype
) -> torch.Tensor:
    """A KDA prompt chunk's output before o_proj in one launch: each head of core [T, H, d] RMS-normalised (· weight
    [d]) and gated by sigmoid(gate [T, H·d]), written as `dtype` [T, H·d] (bf16: o_proj's operand, no cast after).
    core's and gate's rows may be strided (unit stride within a row); d a power of two. The decode kernel's norm and
    gate (`_kda_decode`), so a token's values agree with a step's to fp32 rounding."""
    t, heads, d = core.shape
    assert d & (d - 1) == 0 and core.stride(2) == 1 and core.stride(1) == d and gate.stride(1) == 1
    assert gate.shape == (t, heads * d) and core.dtype == gate.dtype == weight.dtype == torch.float32
    assert dtype in (torch.float32, torch.bfloat16), f"written as fp32 or bf16, not {dtype}"
    out = torch.empty(t, heads * d, dtype=dtype, device=core.device)
    _gated_norm[(triton.cdiv(t, NORM_ROWS), heads)](
        core, gate, weight, out, t, core.stride(0), gate.stride(0), out.stride(0), float(eps), D=d, BT=NORM_ROWS,
        BF16=dtype == torch.bfloat16, num_warps=4,
    )  # fmt: skip
    return out
