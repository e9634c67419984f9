"""The fused decode kernels — hyper-connections (engine/ops/triton_mhc.py), one KDA token (engine/ops/triton_kda.py),
the MoE routing and SwiGLU (triton_moe.py), the rows' RMS norm (triton_rows.py) and DSA's lane attention
(triton_dsa.py) — in Triton's interpreter on the CPU, against the model's own torch path on a tiny random checkpoint
(tests/engine/reference.py) or the torch form of the op.

As in test_exl3_triton.py, Triton reads TRITON_INTERPRET when first imported, so the kernels run in a child process
(this file run as a script prints every figure as JSON) and the tests assert on what it printed. The same kernels run
on a GPU in every CUDA decode step (tests/gpu: greedy tokens on CUDA against the CPU reference).
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest
from interpreter import figures_of

ROOT = Path(__file__).resolve().parents[2]
TOLERANCE = 2e-5  # of the largest magnitude: fp32 sums in another order


def _relative(a, b) -> float:
    return float((a - b).abs().max() / b.abs().max().clamp(min=1e-30))


def _each_prompt_launch() -> Iterator[str]:
    """Each launch of triton_dsa.PROMPT_LAUNCHES in turn as the one `selected_attention` takes (its name yielded),
    the served choice back afterwards."""
    from engine.ops import triton_dsa

    served = triton_dsa.prompt_launch
    try:
        for name, launch in triton_dsa.PROMPT_LAUNCHES.items():
            triton_dsa.prompt_launch = lambda capability, lo=False, chosen=launch: chosen
            yield name
    finally:
        triton_dsa.prompt_launch = served


def _cases() -> dict:
    """Run in the child (TRITON_INTERPRET=1)."""
    import torch

    sys.path.insert(0, str(ROOT / "tests" / "engine"))
    from reference import make_reference

    from engine import ops as engine_ops
    from engine.models.glm5_next.model import Glm5NextForCausalLM
    from engine.ops import triton_mhc

    gen = torch.Generator().manual_seed(3)
    out: dict = {}
    with tempfile.TemporaryDirectory() as tmp:
        make_reference(tmp, "kda3_dsa1", seed=4)
        model = Glm5NextForCausalLM.load(tmp)
    layer = model.layers[1]
    hidden, n = model.cfg.hidden_size, model.cfg.hc_mult

    # hyper-connection: the sublayer's input, post and comb, and the new streams, for 3 tokens
    hc = layer.attn_hc
    hc.base = torch.randn(hc.base.shape, generator=gen) * 0.5  # the checkpoint's are zeros: make every gate count
    streams = torch.randn(3, n, hidden, generator=gen)
    seen = {}

    def sublayer(x):
        seen.setdefault("x", []).append(x)
        return torch.tanh(x @ torch.ones(hidden, hidden) / hidden**0.5)

    reference = hc.around(streams, sublayer, layer.input_norm, layer.eps)
    x, post, comb = triton_mhc.hc_pre(
        streams, hc.fn, hc.base, hc.scale, layer.input_norm, hc.eps, hc.norm_eps, layer.eps, hc.iters
    )
    _, ref_post, ref_comb = hc.weights(streams)
    fused, _ = triton_mhc.hc_post(streams, sublayer(x), post, comb)
    # chained (a step's form): the launch making the new streams also makes the next hyper-connection's sums
    nxt = layer.ffn_hc
    chained, ahead = triton_mhc.hc_post(streams, sublayer(x), post, comb, nxt.fn)
    after = (nxt.fn, nxt.base, nxt.scale, layer.post_norm, nxt.eps, nxt.norm_eps, layer.eps, nxt.iters)
    taken = triton_mhc.hc_pre(fused, *after, partials=ahead)
    chained_equal = torch.equal(chained, fused) and all(
        torch.equal(a, b) for a, b in zip(taken, triton_mhc.hc_pre(fused, *after))
    )
    # post and comb made beside the mix (`gates`, `_hc_gates`: a step's form on a second stream), from the same sums
    beside = torch.empty_like(taken[1]), torch.empty_like(taken[2])
    triton_mhc.gates(*ahead, nxt.base, nxt.scale, *beside, nxt.eps, nxt.norm_eps, hidden, nxt.iters)
    out["hc"] = {
        "gates_beside_equal": bool(torch.equal(beside[0], taken[1]) and torch.equal(beside[1], taken[2])),
        "chained_equal": bool(chained_equal),
        "input": _relative(x, seen["x"][0]),
        "post": _relative(post, ref_post),
        "comb": _relative(comb, ref_comb),
        "streams": _relative(fused, reference),
        "comb_row_sums": float((comb.sum(-1) - 1).abs().max()),
    }
    # a token's result does not depend on the others
    alone, _, _ = triton_mhc.hc_pre(
        streams[1:2], hc.fn, hc.base, hc.scale, layer.input_norm, hc.eps, hc.norm_eps, layer.eps, hc.iters
    )
    out["hc"]["batch_independent"] = bool(torch.equal(alone[0], x[1]))
    # the map kept as the bf16 a GPU's load reads (`HyperConnection`): `_hc_dots` reads it as it is, each value
    # exact in its fp32 product; and the rows kernel for a bf16-kept weight of fp32 products (DSA's kv_b).
    # In the interpreter (numpy's sums) the bits equal the fp32 copy's; compiled, the layout follows the element size
    kept = hc.fn.bfloat16()
    args = (hc.base, hc.scale, layer.input_norm, hc.eps, hc.norm_eps, layer.eps, hc.iters)
    bf16_map = triton_mhc.hc_pre(streams, kept, *args)
    fp32_map = triton_mhc.hc_pre(streams, kept.float(), *args)
    rows = torch.randn(3, 2, 96, generator=gen)
    weight = torch.randn(2, 40, 96, generator=gen).bfloat16()
    from engine.ops import triton_rows

    out["bf16_kept_equal"] = bool(
        all(torch.equal(a, b) for a, b in zip(bf16_map, fp32_map))
        and torch.equal(triton_rows.rows_product(rows, weight), triton_rows.rows_product(rows, weight.float()))
    )

    # a prompt chunk's form (more than DECODE_TOKENS tokens: the dot products as one matrix product, one `_hc_mix`
    # program a token with its Gram matrix, PROMPT_CHUNK columns a step: two steps here, the second masked) against
    # the torch path; a token's result with every other token changed
    tokens, wide = triton_mhc.DECODE_TOKENS + 6, triton_mhc.PROMPT_CHUNK + 188
    fn = torch.randn(2 * n + n * n, n * wide, generator=gen) * 0.05
    norm = torch.rand(wide, generator=gen) + 0.5
    streams = torch.randn(tokens, n, wide, generator=gen)
    mix = torch.randn(wide, wide, generator=gen) / wide**0.5

    def chunk_sublayer(x):
        return torch.tanh(x @ mix)

    args = (fn, hc.base, hc.scale, norm, hc.eps, hc.norm_eps, layer.eps, hc.iters)
    reference, _ = engine_ops.hc_around(streams, chunk_sublayer, *args)  # CPU tensors: the torch path
    x, post, comb = triton_mhc.hc_pre(streams, *args)
    fused, _ = triton_mhc.hc_post(streams, chunk_sublayer(x), post, comb)
    others = torch.randn(tokens, n, wide, generator=gen)
    others[-1] = streams[-1]
    x_others, _, _ = triton_mhc.hc_pre(others, *args)
    out["hc_chunk"] = {
        "streams": _relative(fused, reference),
        "token_alone": bool(torch.equal(x_others[-1], x[-1])),
    }

    # KDA: three decode tokens on lanes [2, 0] of 4, fused against the torch step, bounded and softplus gates
    attn = layer.attn
    (state_shape, conv_shape) = attn.state_shapes
    for bound in ("bounded", "softplus"):
        if bound == "softplus":
            attn.lower_bound = None
        lanes = torch.tensor([2, 0])
        states = torch.randn(4, *state_shape, generator=gen) * 0.3
        windows = torch.randn(4, *conv_shape, generator=gen)
        ref_states, ref_windows = states.clone(), windows.clone()
        worst = {"out": 0.0, "state": 0.0, "window": 0.0}
        for _ in range(3):
            x = torch.randn(2, hidden, generator=gen)
            ref_out, new_windows, new_state = attn._step(x, ref_windows[lanes], ref_states[lanes])
            ref_windows[lanes], ref_states[lanes] = new_windows, new_state
            got = attn._fused_step(x, lanes, windows, states)
            worst["out"] = max(worst["out"], _relative(got, ref_out))
            worst["state"] = max(worst["state"], _relative(states, ref_states))
            worst["window"] = max(worst["window"], _relative(windows, ref_windows))
        worst["untouched_lanes_equal"] = bool(
            torch.equal(states[[1, 3]], ref_states[[1, 3]]) and torch.equal(windows[[1, 3]], ref_windows[[1, 3]])
        )
        out[f"kda_{bound}"] = worst

    # KDA verify window: 3 rows a lane on lanes [2, 0], through `decode_lanes` with the fused kernel (as on a GPU:
    # row t reads the state kept after row t-1 and writes its own to the kept rows) against its torch path
    width, lane_ids = 3, torch.tensor([2, 2, 2, 0, 0, 0])

    def lane_state(seed: int) -> SimpleNamespace:
        g = torch.Generator().manual_seed(seed)
        return SimpleNamespace(
            kda={attn.layer: torch.randn(4, *state_shape, generator=g) * 0.3},
            conv={attn.layer: torch.randn(4, *conv_shape, generator=g)},
            kda_rows={attn.layer: torch.zeros(4, width, *state_shape)},
            conv_rows={attn.layer: torch.zeros(4, width, *conv_shape)},
        )

    x = torch.randn(2 * width, hidden, generator=gen)
    start, ref, fused = lane_state(9), lane_state(9), lane_state(9)
    ref_out = attn.decode_lanes(x, SimpleNamespace(lanes=ref, width=width, lane_ids=lane_ids))
    applies = engine_ops.kda_decode_applies
    engine_ops.kda_decode_applies = lambda x: True
    try:
        got = attn.decode_lanes(x, SimpleNamespace(lanes=fused, width=width, lane_ids=lane_ids))
    finally:
        engine_ops.kda_decode_applies = applies
    used = [0, 2]
    out["kda_verify"] = {
        "out": _relative(got, ref_out),
        "state_rows": _relative(fused.kda_rows[attn.layer][used], ref.kda_rows[attn.layer][used]),
        "window_rows": _relative(fused.conv_rows[attn.layer][used], ref.conv_rows[attn.layer][used]),
        "lanes_untouched": bool(
            torch.equal(fused.kda[attn.layer], start.kda[attn.layer])
            and torch.equal(fused.conv[attn.layer], start.conv[attn.layer])
        ),
        "other_rows_untouched": bool(
            fused.kda_rows[attn.layer][[1, 3]].abs().max() == 0 and fused.conv_rows[attn.layer][[1, 3]].abs().max() == 0
        ),
    }
    # the verify rows read in place (strided views of the projections) against contiguous copies of each row, the
    # form before session 24: the same bits, outputs and kept rows
    copied = lane_state(9)
    mixed, f, gate = (part.reshape(-1, width, *part.shape[1:]) for part in attn._fused_project(x))
    kept = (copied.conv_rows[attn.layer], copied.kda_rows[attn.layer])
    rows = []
    for t in range(width):
        row_t = (mixed[:, t].contiguous(), f[:, t].contiguous(), gate[:, t].contiguous())
        source = (copied.conv[attn.layer], copied.kda[attn.layer]) if t == 0 else (kept[0][:, t - 1], kept[1][:, t - 1])
        rows.append(attn._fused_core(*row_t, torch.tensor([2, 0]), *source, kept[0][:, t], kept[1][:, t]))
    core = attn.group.sum_partials(engine_ops.linear(torch.stack(rows, 1).flatten(0, 1), attn.o_proj))
    out["kda_verify"]["strided_equal"] = bool(
        torch.equal(core, got)
        and torch.equal(copied.kda_rows[attn.layer], fused.kda_rows[attn.layer])
        and torch.equal(copied.conv_rows[attn.layer], fused.conv_rows[attn.layer])
    )

    # MoE: route + gate‖up + down with the SwiGLU and routing weights fused, the shared expert in the bank
    moe = layer.mlp
    x = torch.randn(3, hidden, generator=gen)
    reference = moe(x)  # CPU: the torch route and per-expert loop
    moe.stacked = moe._stack()  # what a GPU load does
    chosen, weights = moe.route(x)
    from engine.ops import triton_moe

    got_chosen, got_weights = triton_moe.route(
        x @ moe.router.t(), moe.bias, moe.top_k, moe.scale, moe.renorm, moe.num_routed
    )
    out["moe"] = {
        "shared_in_bank": moe.shared_in_bank,
        "output": _relative(moe(x), reference),
        "same_experts": got_chosen[:, :-1].long().sort(-1).values.tolist() == chosen.sort(-1).values.tolist(),
        "shared_column": got_chosen[:, -1].tolist(),
        "shared_weight": got_weights[:, -1].tolist(),
        "weights": _relative(
            got_weights[:, :-1].gather(-1, got_chosen[:, :-1].long().argsort(-1)),
            weights.gather(-1, chosen.argsort(-1)),
        ),
    }
    # the clamped SwiGLU in one kernel, over the two strided halves of a gate‖up output, values past the limit
    gate_up = torch.randn(3, 2 * 96, generator=gen) * 8
    gate, up = gate_up.chunk(2, dim=-1)
    out["swiglu"] = _relative(triton_moe.swiglu(gate, up, 7.0), engine_ops.reference.swiglu_clamped(gate, up, 7.0))
    out["swiglu_clamped"] = bool((gate > 7).any() and (up.abs() > 7).any())
    # bf16 halves read as they are, the result rounded to bf16: the bits of widening first and rounding after
    half_gate, half_up = gate_up.bfloat16().chunk(2, dim=-1)
    out["swiglu_bf16"] = bool(
        torch.equal(
            triton_moe.swiglu(half_gate, half_up, 7.0, torch.bfloat16),
            triton_moe.swiglu(half_gate.float(), half_up.float(), 7.0).bfloat16(),
        )
    )
    # a prompt chunk's expert outputs (sorted by expert) back to their tokens, weighted, onto the shared output
    chosen = torch.randint(0, 5, (6, 3), generator=gen)
    order = torch.argsort(chosen.flatten(), stable=True)
    pairs = (torch.randn(18, 40, generator=gen) * 3).bfloat16()
    pair_weights = torch.rand(6, 3, generator=gen)
    base = torch.randn(6, 40, generator=gen)
    out["combine_pairs"] = max(
        _relative(triton_moe.combine_pairs(pairs, order, pair_weights, b), engine_ops.reference.combine_pairs(
            pairs, order, pair_weights, b))
        for b in (base, None)
    )  # fmt: skip
    # the served top-k (8) over rows of two column blocks (1,500 wide; 1,024 a program), fp32 pairs
    order8 = torch.argsort(torch.randint(0, 9, (40,), generator=gen), stable=True)
    pairs8, weights8 = torch.randn(40, 1500, generator=gen), torch.rand(5, 8, generator=gen)
    out["combine_pairs_wide"] = bool(
        torch.equal(
            triton_moe.combine_pairs(pairs8, order8, weights8),
            engine_ops.reference.combine_pairs(pairs8, order8, weights8),
        )
    )
    mine = torch.zeros(6, 40)
    for row, flat in enumerate(order.tolist()):  # each sorted row's own (token, slot), spelled out
        mine[flat // 3] += pairs[row].float() * pair_weights[flat // 3, flat % 3]
    out["combine_pairs_spelled"] = _relative(engine_ops.reference.combine_pairs(pairs, order, pair_weights), mine)

    # the RMS norm a row a program, over a strided view (the latent part of a kv_a output), with and without weight
    from engine.ops import triton_rows

    rows = torch.randn(3, 576, generator=gen)[:, :512] * 3
    weight = torch.rand(512, generator=gen) + 0.5
    out["rms_norm"] = max(
        _relative(triton_rows.rms_norm_rows(rows, w, 1e-6), engine_ops.reference.rms_norm(rows, w, 1e-6))
        for w in (weight, None)
    )
    out["rms_norm_alone"] = bool(
        torch.equal(
            triton_rows.rms_norm_rows(rows[1:2], weight, 1e-6)[0], triton_rows.rms_norm_rows(rows, weight, 1e-6)[1]
        )
    )

    # DSA's lane attention in two kernels: 3 rows, 4 heads, 100 selected tokens (four blocks of 32), row 2's last two
    # not counted at all, against the torch form (dsa.py `_attend_rows`)
    from engine.ops import triton_dsa

    q_abs = torch.randn(3, 4, 64, generator=gen)
    latents = torch.randn(3, 100, 64, generator=gen)
    counts = torch.rand(3, 100, generator=gen) < 0.7
    counts[2, 64:] = False
    counts[:, 0] = True

    def attend(q, lat, cnt):
        scores = torch.bmm(q, lat.transpose(1, 2)) * 0.125
        return torch.bmm(torch.softmax(scores.masked_fill(~cnt[:, None, :], float("-inf")), dim=-1), lat)

    fused = triton_dsa.lane_attention(q_abs, latents, counts, 0.125)
    out["lane_attention"] = _relative(fused, attend(q_abs, latents, counts))
    out["lane_attention_alone"] = bool(
        torch.equal(triton_dsa.lane_attention(q_abs[1:2], latents[1:2], counts[1:2], 0.125)[0], fused[1])
    )
    # the latents left in a cache pool (a step's selected tokens' slots [3, 100] in a pool of rows 64 + 16 wide, so
    # strided; uncounted tokens at a slot past the pool, never read): the bits of the same values gathered as
    # KVPool.read gives them, for every row type, and a row alone its bits among the others
    from engine.cache import KVPool

    in_pool = {}
    for kv in ("fp32", "bf16", "fp8"):
        pool = KVPool(1, 300, 80, kv)
        pool.write(0, torch.arange(301), torch.randn(301, 80, generator=gen))
        slots = torch.randint(0, 301, (3, 100), generator=gen).masked_fill(~counts, 10**6)
        held = engine_ops.PoolColumns(pool, 0, slice(0, 64), slots)
        got = triton_dsa.lane_attention(q_abs, held, counts, 0.125)
        gathered = pool.read(0, slots.clamp(max=300), columns=slice(0, 64))
        alone = dataclasses.replace(held, slots=slots[1:2])
        in_pool[kv] = bool(torch.equal(got, triton_dsa.lane_attention(q_abs, gathered, counts, 0.125))) and bool(
            torch.equal(triton_dsa.lane_attention(q_abs[1:2], alone, counts[1:2], 0.125)[0], got[1])
        )
    out["lane_attention_in_pool"] = in_pool

    # a prompt chunk's attention over selected tokens in one kernel: 5 queries, 150 selected tokens each (several
    # blocks, the last ragged) among 120 latents; query 1 counts none of its first 64 (the online softmax starts
    # past a block that counts nothing), query 4 only its last token, tokens that do not count point out of bounds
    # (never read); latents with and without a lo part, against the gathered torch form; 3 heads (one head group,
    # masked) and 40 (two groups), under every launch of PROMPT_LAUNCHES
    tokens = torch.randint(0, 120, (5, 150), generator=gen)
    counts = torch.rand(5, 150, generator=gen) < 0.7
    counts[1, :64], counts[4] = False, False
    counts[:, 149] = True
    tokens[counts.logical_not()] = 10_000
    latents = torch.randn(120, 64, generator=gen)
    bf16 = latents.bfloat16().float()
    errors: dict[str, float] = {}
    split_flags: dict[str, bool] = {}
    for heads in (3, 40):
        q_abs = torch.randn(heads, 5, 64, generator=gen) * 0.3
        for name in _each_prompt_launch():
            for kind, values, split in (
                ("lo", latents, engine_ops.split_bf16(latents)),
                ("bf16", bf16, (bf16.bfloat16(), None)),
            ):
                want = attend(q_abs.transpose(0, 1) / 0.125, values[tokens.clamp(max=119)], counts)
                got = triton_dsa.selected_attention(engine_ops.split_bf16(q_abs), split, tokens, counts)
                errors[f"{heads}_{name}_{kind}"] = _relative(got, want.transpose(0, 1))
                # written split for the head product after it: split_bf16's bits of the fp32 context
                hi, lo = triton_dsa.selected_attention(engine_ops.split_bf16(q_abs), split, tokens, counts, None, True)
                want_hi, want_lo = engine_ops.split_bf16(got)
                split_flags[f"{heads}_{name}_{kind}"] = bool(torch.equal(hi, want_hi) and torch.equal(lo, want_lo))
    out["selected_attention"], out["selected_attention_split_out"] = errors, split_flags
    # 64-bit latent offsets (latents past 2^31 values: none this small, so forced) give the 32-bit form's bits;
    # where the form switches, on shapes alone (meta tensors: no storage)
    q_split = engine_ops.split_bf16(torch.randn(40, 5, 64, generator=gen) * 0.3)
    narrow = triton_dsa.selected_attention(q_split, engine_ops.split_bf16(latents), tokens, counts)
    offsets_wide = triton_dsa.offsets_wide
    triton_dsa.offsets_wide = lambda latents: True
    try:
        wide = triton_dsa.selected_attention(q_split, engine_ops.split_bf16(latents), tokens, counts)
    finally:
        triton_dsa.offsets_wide = offsets_wide
    edge = [torch.empty_strided((2, 512), (stride, 1), device="meta") for stride in (2**31 - 512, 2**31 - 511)]
    out["selected_attention_wide"] = [bool(torch.equal(wide, narrow))] + [triton_dsa.offsets_wide(e) for e in edge]
    # q_abs · scale split in one launch: split_bf16's bits of the scaled values (a ragged last block; values at
    # bf16 rounding ties, signed zeros, infinities and a NaN among them)
    x = torch.randn(3, 7, 1000, generator=gen) * 5
    x.view(-1)[:6] = torch.tensor([1.0 + 2**-8, 1.0 + 3 * 2**-8, -0.0, float("inf"), -float("inf"), float("nan")])
    hi, lo = triton_dsa.split_scaled(x, 0.0721)
    want_hi, want_lo = engine_ops.split_bf16(x * 0.0721)
    same_bits = [  # bit for bit, a NaN's payload aside
        bool(((a.view(torch.int16) == b.view(torch.int16)) | (a.isnan() & b.isnan())).all())
        for a, b in ((hi, want_hi), (lo, want_lo))
    ]
    out["split_scaled"] = same_bits + [bool(hi.isnan()[0, 0, 5]), bool(lo.isnan()[0, 0, 3:6].all())]
    # unscaled, strided x (a contiguous copy split): the ties, zeros and infinities as written (scaled, they were
    # not ties any more); x[0, 0, 0] is left out by the stride, so the values sit from index 1 on
    x.view(-1)[1:7] = torch.tensor([1.0 + 2**-8, 1.0 + 3 * 2**-8, -0.0, float("inf"), -float("inf"), float("nan")])
    hi, lo = triton_dsa.split_scaled(x[:, :, 1:], 1.0)
    want_hi, want_lo = engine_ops.split_bf16(x[:, :, 1:])
    out["split_unscaled"] = [
        bool(((a.view(torch.int16) == b.view(torch.int16)) | (a.isnan() & b.isnan())).all())
        for a, b in ((hi, want_hi), (lo, want_lo))
    ] + [bool(hi[0, 0, 0] == 1.0 and hi[0, 0, 1] == 1.0 + 2**-6)]  # a tie down to even, one up to even
    # a cache pool's latents (`PoolLatents.by_row`): a bf16 pool's read in place (the latent columns of a pool
    # layer's rows, row width 96, so strided; the tokens' slots as the rows) give the bits of the gathered contiguous
    # latents; an fp8 pool's (e4m3 values, bf16 exactly; each row's scale on its scores and softmax weights) as a
    # bf16 copy by position (the H200's launch) and read in place (the others') give each other's bits and the fp32
    # form over value × scale to rounding; 3 heads (one group) and 40 (two)
    from engine.cache import KVPool

    slots = torch.randperm(200, generator=gen)[:120]  # position p's row at slot slots[p]
    for kv in ("bf16", "fp8"):
        pool = KVPool(1, 200, 96, kv)
        pool.write(0, slots, torch.cat([latents, torch.randn(120, 32, generator=gen)], 1))
        values = pool.read(0, slots)[:, :64]
        held = engine_ops.PoolLatents(pool, 0, slice(0, 64), slots)
        split, rows, scales = held.by_row(tokens, fp8=True, copy=True)
        in_place, slot_rows, slot_scales = held.by_row(tokens, fp8=True)
        assert in_place[0].data_ptr() == pool.rows.data_ptr() and (slot_scales is not None) == (kv == "fp8")
        if kv == "fp8":  # the copy: the stored values by position, as bf16, and their scales
            assert split[0].dtype == torch.bfloat16 and torch.equal(rows, tokens)
            assert torch.equal(split[0].float() * scales[:, None], values)
        for heads in (3, 40):
            q_abs = engine_ops.split_bf16(torch.randn(heads, 5, 64, generator=gen) * 0.3)
            if kv == "bf16":
                got = triton_dsa.selected_attention(q_abs, split, rows, counts, scales)
                want = triton_dsa.selected_attention(q_abs, (values.bfloat16(), None), tokens, counts)
                out[f"selected_attention_in_place_{heads}"] = bool(torch.equal(got, want))
                continue
            q = (q_abs[0].float() + q_abs[1].float()).transpose(0, 1) / 0.125
            want = attend(q, values[tokens.clamp(max=119)], counts).transpose(0, 1)
            for name in _each_prompt_launch():  # under every launch the kernel may take (the H200's and a GB10's)
                got = triton_dsa.selected_attention(q_abs, split, rows, counts, scales)
                out[f"selected_attention_fp8_{heads}_{name}"] = _relative(got, want)
                by_slot = triton_dsa.selected_attention(q_abs, in_place, slot_rows, counts, slot_scales)
                out[f"selected_attention_fp8_copy_{heads}_{name}"] = bool(torch.equal(got, by_slot))

    # a prompt chunk's causal conv in one kernel: 37 tokens (two token blocks, the last ragged), 200 channels (two
    # channel blocks), kernel 4, rows of a strided view; and a chunk of 2 tokens, shorter than the window
    from engine.ops import triton_kda

    wide = torch.randn(37, 260, generator=gen)
    window = torch.randn(200, 3, generator=gen)
    conv_w = torch.randn(200, 4, generator=gen)
    conv, conv_window = {}, {}
    for t in (37, 2):
        x = wide[:t, 30:230]
        got_out, got_window = triton_kda.causal_conv(x, window, conv_w)
        want_out, want_window = engine_ops.reference.causal_conv(x, window, conv_w)
        conv[t], conv_window[t] = _relative(got_out, want_out), bool(torch.equal(got_window, want_window))
    out["causal_conv"], out["causal_conv_window"] = max(conv.values()), all(conv_window.values())
    # the same conv split into q, k, v (3 parts of 2 heads of 16) with q's and k's heads L2-normalised, q scaled:
    # against the torch form (ops.conv_qkv off CUDA), each part contiguous
    window, conv_w = torch.randn(96, 3, generator=gen), torch.randn(96, 4, generator=gen)
    qkv, qkv_flags = {}, []
    for t in (37, 2):
        x = (wide * 4)[:t, 30:126]  # rows of a strided view
        assert x.stride(0) == 260
        got, want = triton_kda.conv_qkv(x, window, conv_w, 16, 1e-6), engine_ops.conv_qkv(x, window, conv_w, 16)
        qkv[t] = max(_relative(a, b) for a, b in zip(got[:3], want[:3]))
        qkv_flags += [all(part.is_contiguous() and part.shape == (t, 2, 16) for part in got[:3])]
        qkv_flags += [bool(torch.equal(got[3], want[3]))]
        qkv_flags += [bool(torch.allclose(got[1].norm(dim=-1), torch.ones(t, 2), atol=1e-5))]  # unit heads
    out["conv_qkv"], out["conv_qkv_flags"] = max(qkv.values()), qkv_flags
    # KDA's gated norm of a prompt chunk (triton_kda.gated_norm): 37 tokens (three blocks, the last ragged), 3 heads
    # of 16, the gate as rows of a strided view; fp32 against the torch form, and bf16 as the fp32 result cast
    core = torch.randn(37, 3, 16, generator=gen) * 3
    gate = (torch.randn(37, 80, generator=gen) * 2)[:, 10:58]
    norm_w = torch.rand(16, generator=gen) + 0.5
    want = (engine_ops.reference.rms_norm(core, norm_w, 1e-6) * torch.sigmoid(gate.view(37, 3, 16))).flatten(1)
    got = triton_kda.gated_norm(core, gate, norm_w, 1e-6, torch.float32)
    got_bf16 = triton_kda.gated_norm(core, gate, norm_w, 1e-6, torch.bfloat16)
    out["gated_norm"] = _relative(got, want)
    out["gated_norm_bf16"] = [got_bf16.dtype == torch.bfloat16, bool(torch.equal(got_bf16, got.bfloat16()))]

    # DSA's indexer scores in one kernel: 37 queries (three blocks of queries, the last ragged) over 150 pools (three
    # blocks, the last ragged), 16 heads of 32, pools of 4, queries at positions that see none, some or all pools;
    # keys shared by every query (a prompt chunk) and one set a query (decode), against both torch forms; and each
    # query's scores alone, with its own keys, equal to its row of the chunk's
    q = torch.randn(37, 16, 32, generator=gen)
    keys = torch.randn(1, 150, 32, generator=gen)
    head_w = torch.randn(37, 16, generator=gen)
    positions = torch.linspace(0, 700, 37).long()
    index, flags = {}, []
    got = triton_dsa.index_scores(q, keys, head_w, positions, 4, 0.2)
    each = triton_dsa.index_scores(q, keys.expand(37, -1, -1), head_w, positions, 4, 0.2)
    flags.append(bool(torch.equal(got, each)))
    for alone in (False, True):
        want = engine_ops.reference.index_scores(q, keys, head_w, positions, 4, 0.2, alone)
        hidden = want == torch.finfo(torch.float32).min
        index[str(alone)] = _relative(got.masked_fill(hidden, 0), want.masked_fill(hidden, 0))
        flags.append(bool(torch.equal(got == torch.finfo(torch.float32).min, hidden)))
    rows = [
        triton_dsa.index_scores(q[i : i + 1], keys, head_w[i : i + 1], positions[i : i + 1], 4, 0.2)
        for i in (0, 20, 36)
    ]
    flags.append(all(torch.equal(row[0], got[i]) for row, i in zip(rows, (0, 20, 36))))
    out["index_scores"], out["index_flags"] = index, flags
    out["index_some_hidden"] = bool(hidden.any() and not hidden.all())

    # keys left in the cache pool (engine_ops.PoolKeys; rows of 8 + 2 × 32 values, the key at column 8), for every
    # row type: a decode step's (each query's own pools' last slots) against the gathered keys — fp32 rows the same
    # bits (both tf32x3), bf16 rows the bits of their values as a bf16 tensor (both the split bf16 form), fp8 rows to
    # rounding (the scale on the product, not on the key) —, to the torch form, and a prompt chunk's (one set of
    # slots for every query) the bits each query gets with those slots as its own
    from engine.cache import KVPool

    own, to_torch, chunk = {}, {}, {}
    for kv in ("fp32", "bf16", "fp8"):
        pool = KVPool(1, 400, 8 + 64, kv)
        pool.write(0, torch.arange(401), torch.randn(401, 72, generator=gen) * 2)
        ends = torch.randint(0, 401, (37, 150), generator=gen)
        stored = engine_ops.PoolKeys(pool, 0, slice(8, 40), ends)
        gathered = stored.read()
        in_place = triton_dsa.index_scores(q, stored, head_w, positions, 4, 0.2)
        as_tensor = triton_dsa.index_scores(q, gathered.bfloat16() if kv == "bf16" else gathered, head_w, positions,
                                            4, 0.2)  # fmt: skip
        want = engine_ops.reference.index_scores(q, stored, head_w, positions, 4, 0.2)
        seen = want != torch.finfo(torch.float32).min
        if kv == "fp8":
            own[kv] = _relative(in_place.masked_fill(~seen, 0), as_tensor.masked_fill(~seen, 0))
        else:
            own[kv] = bool(torch.equal(in_place, as_tensor))
        own[kv + "_read"] = bool(torch.equal(gathered, pool.read(0, ends, columns=slice(8, 40))))
        to_torch[kv] = _relative(in_place.masked_fill(~seen, 0), want.masked_fill(~seen, 0))
        one = engine_ops.PoolKeys(pool, 0, slice(8, 40), ends[:1])
        shared = triton_dsa.index_scores(q, one, head_w, positions, 4, 0.2)
        own_slots = dataclasses.replace(one, slots=ends[:1].expand(37, -1))  # each query its own copy of the slots
        each = triton_dsa.index_scores(q, own_slots, head_w, positions, 4, 0.2)
        chunk[kv] = bool(torch.equal(shared, each))
        hidden = torch.finfo(torch.float32).min
        shown = (shared != hidden) | (each != hidden)
        chunk[kv + "_error"] = _relative(shared.masked_fill(~shown, 0), each.masked_fill(~shown, 0))
    out["index_pool_keys_torch"], out["index_pool_keys_chunk"] = to_torch, chunk
    out["index_pool_keys"] = own
    return out


@pytest.fixture(scope="module")
def results() -> dict:
    return figures_of(__file__)


def test_hyper_connection_kernels_match_the_torch_path(results: dict) -> None:
    hc = results["hc"]
    for figure in ("input", "post", "comb", "streams"):
        assert hc[figure] <= TOLERANCE, (figure, hc)
    assert hc["comb_row_sums"] < 1e-3  # Sinkhorn ran: comb is (nearly) doubly stochastic
    assert hc["batch_independent"]
    # a step's `_hc_post` with the next map: the same new streams, and sums that give the next `hc_pre` its bits
    assert hc["chained_equal"]
    # post and comb made beside the mix (`_hc_gates`, from those sums): `_hc_mix`'s bits
    assert hc["gates_beside_equal"]


def test_hyper_connection_prompt_chunk_kernels_match_the_torch_path(results: dict) -> None:
    """A prompt chunk's form (the dot products as one matrix product: fn read once per tile of tokens; one
    `_hc_mix` program a token, its Gram matrix included) against the torch path, and a token's input to its sublayer
    with every other token of the chunk changed."""
    case = results["hc_chunk"]
    assert case["streams"] <= TOLERANCE, case
    assert case["token_alone"]


@pytest.mark.parametrize("gate", ["bounded", "softplus"])
def test_kda_decode_kernel_matches_the_torch_step(results: dict, gate: str) -> None:
    case = results[f"kda_{gate}"]
    for figure in ("out", "state", "window"):
        assert case[figure] <= TOLERANCE, (figure, case)
    assert case["untouched_lanes_equal"]


def test_kda_verify_rows_write_their_kept_states_through_the_kernel(results: dict) -> None:
    """A verify window's rows through the fused kernel: each row's kept state and window as the torch path keeps
    them, the lanes' own state untouched (LaneState.commit picks a row), no other lane's rows written."""
    case = results["kda_verify"]
    for figure in ("out", "state_rows", "window_rows"):
        assert case[figure] <= TOLERANCE, (figure, case)
    assert case["lanes_untouched"] and case["other_rows_untouched"]
    assert case["strided_equal"]  # rows read in place ≡ copied out first, bit for bit


def test_bf16_kept_weights_give_their_fp32_copys_bits(results: dict) -> None:
    """The hyper-connections' map and the rows kernel's weight (DSA's kv_b) kept as bf16 on a GPU: read as
    they are, each value exact in its fp32 product (in the interpreter, the fp32 copy's bits; compiled, the sums'
    order follows the layout the element size gives: tests/gpu checks row invariance there)."""
    assert results["bf16_kept_equal"]


def test_moe_kernels_match_the_torch_path(results: dict) -> None:
    moe = results["moe"]
    assert moe["shared_in_bank"]
    assert moe["same_experts"]
    assert moe["shared_column"] == [8, 8, 8] and moe["shared_weight"] == [1.0, 1.0, 1.0]
    assert moe["weights"] <= TOLERANCE and moe["output"] <= TOLERANCE, moe


def test_swiglu_kernel_matches_the_torch_form(results: dict) -> None:
    """engine/ops/triton_moe.py `swiglu` (what ops.swiglu_clamped runs on CUDA) against the reference's four torch
    ops, with gates and ups past the limit."""
    assert results["swiglu_clamped"]
    assert results["swiglu"] <= TOLERANCE, results["swiglu"]


def test_rms_norm_kernel_matches_the_torch_form_row_by_row(results: dict) -> None:
    """engine/ops/triton_rows.py `rms_norm_rows` (what ops.rms_norm runs for a CUDA step's rows) against the
    reference over a strided view, with and without a weight, and a row alone equal to the same row beside others."""
    assert results["rms_norm"] <= TOLERANCE, results["rms_norm"]
    assert results["rms_norm_alone"]


def test_lane_attention_kernels_match_the_torch_form(results: dict) -> None:
    """engine/ops/triton_dsa.py (what ops.lane_attention runs for a CUDA step's rows) against DSA's batched-matmul
    form, with a block of tokens none of which counts, and a row alone equal to the same row beside others; the
    latents read by slot where a cache pool holds them give the bits of the same values gathered."""
    assert results["lane_attention"] <= TOLERANCE, results["lane_attention"]
    assert results["lane_attention_alone"]
    # latents read where the cache pool holds them: the gathered values' bits, every row type, a row alone too
    assert results["lane_attention_in_pool"] == {"fp32": True, "bf16": True, "fp8": True}


def test_prompt_moe_glue_kernels_match_the_torch_forms(results: dict) -> None:
    """A CUDA prompt chunk's bf16 experts between and after their grouped GEMMs (moe.MoE._grouped): the clamped SwiGLU
    on the bf16 halves of gate‖up written as bf16 gives the bits of widening to fp32 first and rounding after; the
    sorted pairs' outputs weighted and summed back to their tokens (onto a base, and without) in one launch agree
    with the torch form, which agrees with the sum spelled out pair by pair."""
    assert results["swiglu_bf16"]
    assert results["combine_pairs"] <= TOLERANCE, results["combine_pairs"]
    assert results["combine_pairs_spelled"] <= TOLERANCE, results["combine_pairs_spelled"]
    assert results["combine_pairs_wide"]  # top-8 over two column blocks: the reference's bits


def test_prompt_causal_conv_kernel_matches_the_torch_form(results: dict) -> None:
    """engine/ops/triton_kda.py `causal_conv` (a CUDA prompt chunk's conv + SiLU in one launch) against
    `reference.causal_conv`, over two blocks of tokens and of channels, rows of a strided view, and a chunk shorter
    than the window (taps from the window; the new window keeps part of the old)."""
    assert results["causal_conv"] <= TOLERANCE, results["causal_conv"]
    assert results["causal_conv_window"]


def test_prompt_conv_with_the_qk_norms_matches_the_torch_form(results: dict) -> None:
    """engine/ops/triton_kda.py `conv_qkv` (a CUDA KDA prompt chunk's conv + SiLU, q's and k's heads L2-normalised,
    q scaled, q|k|v written as three contiguous tensors in the same launch) against ops.conv_qkv's torch form (conv,
    split, reference.l2norm): two token blocks and a chunk shorter than the window, rows of a strided view."""
    assert results["conv_qkv"] <= TOLERANCE, results["conv_qkv"]
    assert results["conv_qkv_flags"] == [True] * 6, results["conv_qkv_flags"]


def test_prompt_gated_norm_kernel_matches_the_torch_form(results: dict) -> None:
    """engine/ops/triton_kda.py `gated_norm` (a CUDA KDA prompt chunk's per-head RMS norm · weight · sigmoid(gate) in
    one launch, written as o_proj's operand) against the torch form; its bf16 output is its fp32 result rounded to
    nearest as torch rounds it, bit for bit."""
    assert results["gated_norm"] <= TOLERANCE, results["gated_norm"]
    assert results["gated_norm_bf16"] == [True, True], results["gated_norm_bf16"]


def test_prompt_selected_attention_kernel_matches_the_torch_form(results: dict) -> None:
    """engine/ops/triton_dsa.py `selected_attention` (a CUDA prompt chunk's DSA attention over selected tokens:
    a program a query, an online softmax over blocks of its tokens, split bf16 products) against the gathered fp32
    form, with a first block that counts nothing, tokens that do not count pointing out of bounds (never read),
    latents with and without a lo part, one and two head groups, under every launch the kernel may take; and a bf16
    or fp8 cache pool's latents read in place (strided rows, by slot; fp8 with its rows' scales) or, an fp8 pool's,
    as a bf16 copy of the stored values with their scales (the in-place bits)."""
    errors = results["selected_attention"]
    assert len(errors) == 2 * 2 * 4, errors  # heads 3 and 40, two latent kinds, four launches
    assert max(errors.values()) <= TOLERANCE, errors
    # forced 64-bit offsets: the same bits; 32-bit up to a last offset of 2^31 - 1, 64-bit past it
    assert results["selected_attention_wide"] == [True, False, True], results["selected_attention_wide"]
    split = results["selected_attention_split_out"]  # the context written split: split_bf16's bits of it
    assert split == dict.fromkeys(errors, True), split
    fp8 = {k: v for k, v in results.items() if k.startswith("selected_attention_fp8_") and "_copy_" not in k}
    assert len(fp8) == 2 * 4 and max(fp8.values()) <= TOLERANCE, fp8  # fp8 rows: to rounding, every launch
    copied = {k: v for k, v in results.items() if k.startswith("selected_attention_fp8_copy_")}
    assert copied == dict.fromkeys(copied, True) and len(copied) == 2 * 4, copied  # a copy ≡ in place
    for heads in (3, 40):  # bf16 rows in place: the same bits
        assert results[f"selected_attention_in_place_{heads}"]


def test_the_scaled_split_kernel_gives_split_bf16s_bits(results: dict) -> None:
    """engine/ops/triton_dsa.py `split_scaled` (a prompt chunk's q_abs · scaling split for the selected-token kernel
    in one launch) against `reference.split_bf16(x * scale)`: the same bits, ties rounded to even, signed zeros and
    infinities kept, a NaN's parts NaN; strided x and a scale of 1, where the ties are ties. (Subnormal results
    are not compared: Triton 3.6's interpreter widens a subnormal bf16 wrongly, which a GPU does not.)"""
    assert results["split_scaled"] == [True] * 4, results["split_scaled"]  # hi, lo bit for bit; NaN parts NaN
    assert results["split_unscaled"] == [True] * 3, results["split_unscaled"]  # and two ties to even


def test_indexer_scores_kernel_matches_the_torch_forms(results: dict) -> None:
    """engine/ops/triton_dsa.py `index_scores` (DSA's indexer on CUDA, prompt chunks and decode steps) against
    `reference.index_scores`'s batched and elementwise forms, the pools a query cannot see yet at fp32's lowest as
    there; keys shared by the chunk's queries give each query the bits its own keys give it, and a query alone the
    bits it has among 37."""
    index = results["index_scores"]
    assert len(index) == 2 and max(index.values()) <= TOLERANCE, index  # both torch forms
    # shared keys ≡ own keys, the hidden pools as each torch form's, then a query alone
    assert results["index_flags"] == [True] * 4, results["index_flags"]
    assert results["index_some_hidden"]
    # keys read where the cache pool holds them: the gathered keys' bits for fp32 and bf16 rows (fp8: to rounding),
    # the torch form's values, and a prompt chunk's shared slots the bits of each query's own
    own = results["index_pool_keys"]
    assert {k: v for k, v in own.items() if k != "fp8"} == dict.fromkeys(
        ("fp32", "bf16", "fp32_read", "bf16_read", "fp8_read"), True
    ), own
    assert 0 < own["fp8"] <= TOLERANCE, own  # the scale on the product rounds otherwise than on the key
    assert max(results["index_pool_keys_torch"].values()) <= TOLERANCE, results["index_pool_keys_torch"]
    # a prompt chunk's shared slots: fp32 rows the bits of each query's own. bf16 and fp8 rows (the split bf16 form,
    # q's parts made for the launch against in the kernel) to fp32 rounding here: the interpreter computes with
    # numpy on the host, whose last bits may follow the host's kernels for each operand shape (an AMD EPYC with
    # AVX-512 gave 36 of 5,550 scores 1 ulp apart, 2026-12-07; earlier hosts none); the same bits on the GPU:
    # tests/gpu/test_rows_gpu.py::test_indexer_scores_at_the_served_shapes
    chunk = results["index_pool_keys_chunk"]
    assert chunk["fp32"] and chunk["fp32_error"] == 0, chunk
    assert max(chunk["bf16_error"], chunk["fp8_error"]) <= 1e-6, chunk


if __name__ == "__main__":
    os.environ.setdefault("TRITON_INTERPRET", "1")
    sys.path.insert(0, str(ROOT))
    print(json.dumps(_cases()))
