"""DENSE=q4 / fp8 on the GPU: engine/ops/triton_dense.py against the exact product of its operands (the rows rounded
to bf16 for q4, fp16 for fp8; the dequantised weights) at every launch form, a row's bits independent of how many
rows share the call (1..64, any place), a CUDA graph replay equal to the eager call, the CPU reference path
agreeing; a prompt chunk's weight made bf16 in one launch (`dequantized`) with `QuantWeight.dequantize`'s bits; then
the model: a row's logits invariant in verify windows and rejected drafts leaving no trace with q4 weights, eager and
from graphs, and drafted ≡ serial through the scheduler on the trained demo with DENSE=q4.
Runs on the lent H200 machine (PYTHONPATH=.:tests/engine python -m pytest -q tests/gpu); skipped elsewhere."""

from __future__ import annotations

import pytest
import torch
from reference import make_reference
from test_dense import tiling
from test_drafts import (
    test_a_rejected_draft_leaves_every_state_bit_as_if_never_proposed as rejected_draft_check,
)
from test_drafts import (
    test_a_rows_logits_do_not_depend_on_window_width_or_neighbours as row_invariance_check,
)
from test_drafts import (
    test_drafted_replies_equal_serial_replies as drafted_equals_serial_check,
)

from engine import ops
from engine.models.glm5_next.model import Glm5NextForCausalLM
from engine.ops import reference
from engine.parallel import ParallelGroup
from engine.quant.dense import QuantWeight, quantize

pytestmark = [pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

# [out, in]: a wide layer (split over the inputs), one with many inputs, a small one, an output count no block divides,
# a tall one (64 outputs a warp: triton_dense.TALL outputs, TALL_GROUPS groups a slice)
SHAPES = [(4096, 2048), (1024, 6144), (96, 1024), (1000, 192), (16384, 2048)]


def weight(shape, mode, seed=0):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    return quantize((torch.randn(*shape, generator=gen, device="cuda") * 0.02).bfloat16(), mode)


def rows(n, width, seed=1):
    return torch.randn(n, width, generator=torch.Generator(device="cuda").manual_seed(seed), device="cuda")


def test_the_shapes_take_both_warp_heights():
    """The table's launches for SHAPES hold 32 outputs a warp and, for the tall one, 64, so the tests below run both."""
    from engine.ops.triton_dense import BLOCK_O, launch_shape

    assert {BLOCK_O // launch_shape(o, k, 64, fp8)["num_warps"] for o, k in SHAPES for fp8 in (False, True)} == {32, 64}


@pytest.mark.parametrize("mode", ["q4", "fp8"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_kernel_equals_the_dequantised_product(mode, shape):
    from engine.ops.triton_dense import dense_rows

    w = weight(shape, mode)
    assert isinstance(w, QuantWeight)
    x = rows(64, shape[1])
    got = dense_rows(x, w)
    exact = _exact(x, w)  # the stored values multiply the rows; a group's scale (and offset) come after, in fp32
    assert (got.double() - exact).abs().max() <= 1e-4 * exact.abs().max()


def _exact(x, w):
    """The rows rounded to fp16 (fp8: its values are fp16 ones) or bf16 (q4) times the dequantised weight, float64."""
    rounded = x.half() if w.mode == "fp8" else x.bfloat16()
    return rounded.double() @ w.dequantize(torch.float32).double().t()


@pytest.mark.parametrize(
    "tuning",
    [
        dict(num_warps=2, unroll=1),
        dict(num_warps=4, unroll=4),
        dict(splits=3),
        dict(block_o=64, num_warps=4),
        dict(sigma=True),
        dict(sigma=False),
    ],
)
@pytest.mark.parametrize("mode", ["q4", "fp8"])
def test_every_launch_form_gives_the_exact_product(mode, tuning):
    """Launches the default table does not pick for SHAPES (each picked for some real weight): 64 outputs a warp,
    no unrolling or four groups ahead (a split shorter than the unroll), an uneven split, 64 outputs a program."""
    from engine.ops.triton_dense import dense_rows

    w = weight((2000, 1536), mode)
    x = rows(11, 1536)
    got = dense_rows(x, w, tuning)
    exact = _exact(x, w)
    assert (got.double() - exact).abs().max() <= 1e-4 * exact.abs().max()


def test_an_fp8_lm_heads_own_launch_gives_the_exact_product():
    """An fp8 weight of an LM head's height takes its own launch (`launch_shape`: split to HEAD_PROGRAMS programs,
    compiled for any row count): exact at 1 and 8 rows, and one row's bits the same alone and among eight."""
    from engine.ops.triton_dense import HEAD, dense_rows, launch_shape

    w = weight((HEAD, 512), "fp8")
    launch = launch_shape(HEAD, 512, w.group, True)
    assert launch["splits"] > 1 and not launch["one_row"]
    x = rows(8, 512)
    got = dense_rows(x, w)
    exact = _exact(x, w)
    assert (got.double() - exact).abs().max() <= 1e-4 * exact.abs().max()
    assert torch.equal(dense_rows(x[:1], w), got[:1])


@pytest.mark.parametrize("mode", ["q4", "fp8"])
def test_one_row_gives_the_same_bits_compiled_for_it_or_for_any_row_count(mode):
    """`one_row` picks Triton's own compile of a one-row launch (N == 1 a constant) or the kernel compiled for any N:
    the same arithmetic, so the same bits, and the bits of that row among others."""
    from engine.ops.triton_dense import dense_rows

    w = weight((2000, 1536), mode)
    x = rows(5, 1536)
    own = dense_rows(x[:1], w, dict(one_row=True))
    assert torch.equal(dense_rows(x[:1], w, dict(one_row=False)), own)
    assert torch.equal(dense_rows(x, w, dict(one_row=False))[:1], own)


@pytest.mark.parametrize("mode", ["q4", "fp8"])
@pytest.mark.parametrize(
    "shape", [(2000, 1536), (16384, 2048), (96, 1024), (1000, 192)], ids=lambda s: f"{s[0]}x{s[1]}"
)
def test_the_mma_rows_order_leaves_every_bit(mode, shape):
    """`sigma` only changes which MMA row computes which output (and so which thread loads its scales and stores its
    sums): each output's products and sums are the same operations in the same order, so the same bits — at one
    row, a verify window's and a block's, split over the inputs or not, 32 or 64 outputs a warp, an output count no
    block divides (TP=3's kda_in_proj, 8,469 outputs, takes σ)."""
    from engine.ops.triton_dense import dense_rows

    w = weight(shape, mode)
    for n in (1, 5, 8, 11):
        x = rows(n, shape[1])
        assert torch.equal(dense_rows(x, w, dict(sigma=True)), dense_rows(x, w, dict(sigma=False))), (n, mode)


@pytest.mark.parametrize("mode", ["q4", "fp8"])
def test_a_tiled_weight_gives_the_bits_of_its_rows(mode, monkeypatch):
    """A weight's codes are kept tiled (engine/quant/dense.py `tiled_shape`): the kernel reads each group's bytes
    from the tiles and must give the bits of the same weight kept in rows — at the table's launch and the other
    forms, blocks read from one base or row by row, one row to a block and a half, whole and as row slices that
    start inside a tile (the KDA input projection's parts) — and `dequantized` its bits."""
    from engine.ops.triton_dense import dense_rows, dequantized
    from engine.quant import dense

    tiled = weight((16384, 2048), mode)
    monkeypatch.setattr(dense, "tiled_shape", tiling(False))
    plain = weight((16384, 2048), mode)
    assert tiled.tiled and not plain.tiled
    forms = [None, dict(sigma=True), dict(sigma=False), dict(num_warps=4, unroll=1), dict(splits=3)]
    forms += [dict(whole_from=1), dict(whole_from=0), dict(whole_from=1, sigma=True)]
    for n in (1, 5, 8, 11):
        x = rows(n, 2048)
        for tuning in forms:
            assert torch.equal(dense_rows(x, tiled, tuning), dense_rows(x, plain, tuning)), (n, tuning)
    for start, stop in ((0, 12288), (12288, 16000), (70, 5000), (16000, 16384)):
        part, twin = tiled.rows(start, stop), plain.rows(start, stop)
        assert part.data.data_ptr() == tiled.data.data_ptr()
        for n in (1, 8):
            x = rows(n, 2048)
            assert torch.equal(dense_rows(x, part), dense_rows(x, twin)), (start, stop, n)
        assert torch.equal(dequantized(part), twin.dequantize(torch.bfloat16)), (start, stop)


def test_a_model_with_tiled_q4_weights_gives_the_same_logits(monkeypatch, tmp_path):
    """The grouped reference with every q4 weight tiled (`tiled_shape` whatever the padding) gives the logits of the
    weights kept in rows, bit for bit: a prompt (the dequantised weights) and decode steps (the kernel)."""
    from engine.quant import dense

    make_reference(tmp_path, "grouped64", seed=3)

    def logits():
        model = Glm5NextForCausalLM.load(tmp_path, ParallelGroup.single("cuda"), dense="q4")
        seq = model.new_sequence(model.make_pool(128))
        out = [model.prefill(seq, [(7 * i) % 50 + 1 for i in range(80)]).reshape(-1)]  # past 64 rows: a chunk
        for token in (3, 11):
            out.append(model.decode([seq], [token])[0].reshape(-1))
        return model, torch.stack(out)

    monkeypatch.setattr(dense, "tiled_shape", tiling(False))
    _, plain = logits()
    monkeypatch.setattr(dense, "tiled_shape", tiling(True))
    model, tiled = logits()
    assert model.layers[0].attn.in_proj.tiled
    assert torch.equal(plain, tiled)


def test_an_fp8_width_groups_do_not_divide():
    """fp8 takes any input width: the last, shorter group is masked input by input."""
    from engine.ops.triton_dense import dense_rows

    w = weight((96, 200), "fp8")
    x = rows(5, 200)
    got = dense_rows(x, w)
    exact = _exact(x, w)
    assert (got.double() - exact).abs().max() <= 1e-4 * exact.abs().max()
    assert torch.equal(dense_rows(x[2:3], w), got[2:3])


@pytest.mark.parametrize("mode", ["q4", "fp8"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_a_rows_bits_do_not_depend_on_the_other_rows(mode, shape):
    w = weight(shape, mode)
    x = rows(64, shape[1])
    full = ops.linear(x, w)
    for n in (1, 2, 3, 5, 8, 16, 17, 40):
        for start in (0, 7, 64 - n):
            assert torch.equal(ops.linear(x[start : start + n], w), full[start : start + n]), (n, start)


@pytest.mark.parametrize("mode", ["q4", "fp8"])
def test_a_graph_replay_equals_the_eager_call(mode):
    w = weight((4096, 2048), mode)
    x = rows(4, 2048)
    eager = ops.linear(x, w)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = ops.linear(x, w)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, eager)


@pytest.mark.parametrize("mode", ["q4", "fp8"])
def test_the_cpu_reference_and_the_prompt_path_agree(mode):
    """The CPU path (dequantise to fp32, fp32 product), the GPU prompt path (more than 64 rows: dequantised bf16
    matmul) and the kernel give the same products within bf16 operand rounding."""
    w = weight((512, 1024), mode)
    x = rows(80, 1024)
    kernel = torch.cat([ops.linear(x[i : i + 16], w) for i in range(0, 80, 16)])
    prompt = ops.linear(x, w)
    cpu_w = QuantWeight(w.mode, w.data.cpu(), w.scale.cpu(), None if w.offset is None else w.offset.cpu(), w.group)
    cpu = ops.linear(x.cpu(), cpu_w)
    scale = cpu.abs().max()
    assert (kernel.cpu() - cpu).abs().max() <= 1e-2 * scale
    assert (prompt.cpu() - cpu).abs().max() <= 1e-2 * scale


@pytest.mark.parametrize(
    "mode, shape", [("q4", (4096, 4096)), ("q4", (2048, 6144)), ("fp8", (4096, 4100)), ("fp8", (6144, 2048))]
)
def test_the_dequantising_kernel_gives_the_dequantised_bits(mode, shape):
    """Served sizes (fp8 with a last, shorter group), whole and as a column-split rank's rows (views), bf16 and
    fp32."""
    from engine.ops.triton_dense import dequantized

    w = weight(shape, mode)
    for part in (w, w.rows(1000, shape[0] - 24)):
        for dtype in (torch.bfloat16, torch.float32):
            assert torch.equal(dequantized(part, dtype), part.dequantize(dtype)), (part.shape, dtype)


@pytest.mark.parametrize("mode", ["q4", "fp8"])
def test_a_prompt_chunk_takes_the_dequantised_weight(mode, monkeypatch):
    """A prompt chunk's product with a reduced weight runs on the one-launch dequantisation (`dequantized`, spied on:
    its bits equal `dequantize`'s, so equal results alone would not show it ran) and gives the torch form's bits."""
    from engine.ops import triton_dense

    calls = []
    real = triton_dense.dequantized
    monkeypatch.setattr(triton_dense, "dequantized", lambda w, *a: calls.append(w) or real(w, *a))
    w = weight((2048, 4096), mode)
    x = rows(256, 4096)
    assert torch.equal(ops.linear(x, w), reference.linear(x, w.dequantize(torch.bfloat16)))
    assert calls == [w]


@pytest.fixture(scope="module")
def q4_model(tmp_path_factory):
    path = tmp_path_factory.mktemp("grouped64")
    make_reference(path, "grouped64", seed=3)
    model = Glm5NextForCausalLM.load(path, ParallelGroup.single("cuda"), dense="q4")
    assert isinstance(model.layers[0].attn.in_proj, QuantWeight)
    return model


@pytest.mark.parametrize("graphs", [False, True], ids=["eager", "graphs"])
def test_rows_are_invariant_with_q4_weights(q4_model, graphs):
    row_invariance_check(q4_model, graphs)


@pytest.mark.parametrize("graphs", [False, True], ids=["eager", "graphs"])
def test_rejected_drafts_leave_no_trace_with_q4_weights(q4_model, graphs):
    rejected_draft_check(q4_model, graphs)


def test_drafted_equals_serial_through_the_scheduler_with_q4_weights():
    import json

    from tokenizers import Tokenizer

    from engine.checkpoint.demo import TRAINED

    model = Glm5NextForCausalLM.load(TRAINED, ParallelGroup.single("cuda"), mtp=True, dense="q4")
    tokenizer = Tokenizer.from_file(str(TRAINED / "tokenizer.json"))
    eos = frozenset(json.loads((TRAINED / "config.json").read_text())["text_config"]["eos_token_id"])
    drafted_equals_serial_check((model, tokenizer, eos), 4, False, graphs=True)
