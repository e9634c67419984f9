"""An EXL3 checkpoint served on CUDA with its routed experts kept in EXL3 form (moe.MoE → ops.Exl3Experts → the Triton
decode-GEMV / per-chunk decode) gives the greedy tokens of the same checkpoint decoded to dense weights on CUDA and of
the CPU reference. Runs on the lent H200 machine (`python -m pytest -q tests/gpu`, PYTHONPATH=.:tests/engine);
skipped without CUDA. The same path in Triton's interpreter on the CPU: tests/engine/test_exl3_moe.py."""

from __future__ import annotations

import pytest
import torch

import engine.models.glm5_next.moe as moe_module
from engine.checkpoint.demo import write_demo
from engine.models.glm5_next.model import Glm5NextForCausalLM
from engine.models.glm5_next.moe import MoE
from engine.parallel import ParallelGroup

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

STEPS = 24


@pytest.fixture(autouse=True)
def _own_kda_prompt_form(monkeypatch):
    """These tests are about the experts: the KDA layers take our own chunked prompt form whatever is installed.
    With fla-core importable its chunk_kda (tensor-core products) would run the prompt chunks instead, moving the
    logits against the CPU reference by ~5e-3 (tokens equal; issue 20) — its accuracy is tests/gpu/
    test_kda_prompt_gpu.py's subject, not this file's."""
    from engine.ops import fla_kda

    monkeypatch.setattr(fla_kda, "usable", lambda *args, **kwargs: False)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return write_demo(tmp_path_factory.mktemp("exl3gpu") / "demo", seed=3, size="exl3", fmt="exl3")


def _greedy(model, ids: list[int], chunk: int) -> tuple[list[int], torch.Tensor]:
    """Prefill in chunks of `chunk` tokens (top-k 2: 2·chunk (row, expert) pairs, so a chunk of 40 takes the
    prompt path and one of 8 the decode-GEMV), then one token at a time."""
    seq = model.new_sequence(model.make_pool(len(ids) + STEPS + 8))
    for start in range(0, len(ids), chunk):
        step = model.prefill(seq, ids[start : start + chunk])
    tokens, logits = [], []
    for _ in range(STEPS):
        logits.append(step.float().cpu())
        tokens.append(int(step.argmax()))
        step = model.decode([seq], [tokens[-1]])[0]
    return tokens, torch.stack(logits)


def _moes(model) -> list[MoE]:
    return [layer.mlp for layer in model.layers if isinstance(layer.mlp, MoE)]


@pytest.mark.parametrize("chunk", [40, 8])
def test_exl3_experts_on_cuda_give_the_dense_and_cpu_tokens(checkpoint, monkeypatch, chunk):
    ids = torch.randint(1, 97, (40,), generator=torch.Generator().manual_seed(5)).tolist()
    cpu_tokens, cpu_logits = _greedy(Glm5NextForCausalLM.load(checkpoint), ids, chunk)

    gpu = Glm5NextForCausalLM.load(checkpoint, ParallelGroup.single("cuda"), dtype=torch.float32)
    assert _moes(gpu) and all(m.exl3 is not None and not m.experts for m in _moes(gpu)), "experts were decoded"
    assert all(m.exl3.gate_up.trellis.is_cuda and m.exl3.gate_up.trellis.dtype == torch.int16 for m in _moes(gpu))
    exl3_tokens, exl3_logits = _greedy(gpu, ids, chunk)
    del gpu

    with monkeypatch.context() as patch:  # the same checkpoint decoded to dense on load
        patch.setattr(moe_module, "read_expert_banks", lambda *args: None)
        dense = Glm5NextForCausalLM.load(checkpoint, ParallelGroup.single("cuda"), dtype=torch.float32)
        assert all(m.exl3 is None and m.experts for m in _moes(dense))
        dense_tokens, dense_logits = _greedy(dense, ids, chunk)

    assert exl3_tokens == dense_tokens == cpu_tokens
    assert float((exl3_logits - dense_logits).abs().max()) < 1e-3
    assert float((exl3_logits - cpu_logits).abs().max()) < 1e-3


def _first_moe_and_rows(checkpoint, rows: int, seed: int):
    """The first MoE layer of the checkpoint on CUDA (fp32), `rows` random inputs and their routing, and the
    generator that drew them."""
    gpu = Glm5NextForCausalLM.load(checkpoint, ParallelGroup.single("cuda"), dtype=torch.float32)
    moe = _moes(gpu)[0]
    gen = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(rows, moe.router.shape[1], generator=gen, device="cuda")
    return moe, x, *moe.route(x), gen


def test_routed_rows_do_not_depend_on_the_batch(checkpoint):
    moe, x, chosen, weights, _ = _first_moe_and_rows(checkpoint, 8, seed=1)
    together = moe.exl3(x, chosen, weights, moe.limit)
    for t in (0, 3, 7):
        alone = moe.exl3(x[t : t + 1], chosen[t : t + 1], weights[t : t + 1], moe.limit)
        assert torch.equal(alone[0], together[t]), t


def test_routed_path_replays_in_a_cuda_graph(checkpoint):
    """The decode path is sync-free with fixed shapes: captured once in a CUDA graph, a replay on new rows and new
    expert choices in the same buffers gives the eager result."""
    moe, x, chosen, weights, gen = _first_moe_and_rows(checkpoint, 4, seed=2)
    eager = moe.exl3(x, chosen, weights, moe.limit)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up: kernels compiled before capture
        for _ in range(2):
            moe.exl3(x, chosen, weights, moe.limit)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = moe.exl3(x, chosen, weights, moe.limit)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, eager)
    x.copy_(torch.randn(x.shape, generator=gen, device="cuda"))
    new_chosen, new_weights = moe.route(x)
    chosen.copy_(new_chosen)
    weights.copy_(new_weights)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, moe.exl3(x, chosen, weights, moe.limit))


@pytest.mark.parametrize("dense", ["bf16", "q4"])
def test_shared_expert_beside_gives_the_one_stream_bits(checkpoint, monkeypatch, dense):
    """A step's MoE with the shared expert on the second stream (moe.SHARED_BESIDE, the default) gives the bits of
    one stream, eagerly and replayed from a CUDA graph (the fork and join captured as two branches), on new rows."""
    gpu = Glm5NextForCausalLM.load(checkpoint, ParallelGroup.single("cuda"), dense=dense)
    moe = _moes(gpu)[0]
    gen = torch.Generator(device="cuda").manual_seed(4)
    x = torch.randn(4, moe.router.shape[1], generator=gen, device="cuda").to(torch.bfloat16)

    def one_stream(rows: torch.Tensor) -> torch.Tensor:
        with monkeypatch.context() as patch:
            patch.setattr(moe_module, "SHARED_BESIDE", False)
            return moe._decode(rows)

    assert moe_module.SHARED_BESIDE
    for rows in (x[:1], x):
        assert torch.equal(moe._decode(rows), one_stream(rows))
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up: kernels compiled before capture
        moe._decode(x)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = moe._decode(x)
    for _ in range(2):
        x.copy_(torch.randn(x.shape, generator=gen, device="cuda"))
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, one_stream(x))


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs for NCCL")
def test_nccl_tp2_exl3_equals_cpu(checkpoint, tmp_path):
    from test_tensor_parallel import assert_nccl_tp2_equals_cpu

    assert_nccl_tp2_equals_cpu(checkpoint, tmp_path)


def _bank(gen: torch.Generator, matrices: int, k: int, n: int, bits: float = 4, codebook: str = "mcg"):
    """A random EXL3 bank on the GPU, 4-bit mcg unless asked (any trellis bitstream is a valid encoding)."""
    from engine.quant import exl3

    trellis = torch.randint(
        -32768, 32768, (matrices, k // 16, n // 16, int(16 * bits)), generator=gen, device="cuda", dtype=torch.int32
    ).to(torch.int16)
    suh = (torch.rand(matrices, k, generator=gen, device="cuda") / k**0.5).half()
    svh = (torch.rand(matrices, n, generator=gen, device="cuda") + 0.5).half()
    return exl3.Exl3Bank(trellis, suh, svh, codebook)


def test_routed_rows_do_not_depend_on_the_batch_at_the_served_shapes():
    """GLM-5.3-Flash's expert shapes (hidden 4096, width 2048, top-8): a row alone (8 pairs) and among 64 rows
    (512 pairs: 8 lanes × a verify window of 8) gives the same bits; the launch (split-K, tiles a program) must
    depend on the matrix, never on the number of pairs."""
    from engine.ops.triton_exl3 import PAIRS_MAX, routed_experts

    gen = torch.Generator(device="cuda").manual_seed(4)
    experts, hidden, width, k, rows = 16, 4096, 2048, 8, 64

    gate_up, down = _bank(gen, 2 * experts, hidden, width), _bank(gen, experts, width, hidden)
    x = torch.randn(rows, hidden, generator=gen, device="cuda")
    chosen = torch.stack([torch.randperm(experts, generator=gen, device="cuda")[:k] for _ in range(rows)])
    weights = torch.rand(rows, k, generator=gen, device="cuda")
    assert chosen.numel() <= PAIRS_MAX
    together = routed_experts(x, chosen, weights, gate_up, down, 10.0)
    for t in (0, 5, 63):
        alone = routed_experts(x[t : t + 1], chosen[t : t + 1], weights[t : t + 1], gate_up, down, 10.0)
        assert torch.equal(alone[0], together[t]), t


PROMPT_FORMS = {  # name: launch options of grouped_experts, and whether the wgmma form runs (on the H200)
    "tf32": ({"operands": "tf32"}, False),
    "fp16_dot": ({"operands": "fp16", "form": "dot"}, False),
    "fp16_wgmma": ({"operands": "fp16", "form": "wgmma"}, True),
    "fp16_dot_blocks_first": ({"operands": "fp16", "form": "dot", "n_first": False}, False),
    "fp16_wgmma_blocks_first": ({"operands": "fp16", "form": "wgmma", "n_first": False}, True),
    "fp16_wgmma_bm128": ({"operands": "fp16", "form": "wgmma", "bm": 128}, True),
    "fp16_wgmma_16_tiles_8warps": ({"operands": "fp16", "form": "wgmma", "bnt": 16, "wgmma_warps": 8}, True),
    # the wgmma form's ring of x stages: other depths, and its build without the register cap
    "fp16_wgmma_4_stages_of_2": ({"operands": "fp16", "form": "wgmma", "stages": 4, "stage_tiles": 2}, True),
    "fp16_wgmma_2_stages_of_1": ({"operands": "fp16", "form": "wgmma", "stages": 2, "stage_tiles": 1}, True),
    "fp16_wgmma_no_cap": ({"operands": "fp16", "form": "wgmma", "wgmma_maxnreg": None}, True),
}


@pytest.mark.parametrize("form", list(PROMPT_FORMS))
@pytest.mark.parametrize("split_x", [True, False])
def test_prompt_chunk_on_the_tensor_cores_equals_the_expert_loop(split_x, form, monkeypatch):
    """A prompt chunk at GLM-5.3-Flash's expert shapes (hidden 4096, width 2048, top-8 of 32 experts, 96 tokens: 768
    pairs, past PAIRS_MAX): the grouped kernels (each expert's trellis decoded into TF32 or fp16 MMA operands:
    `_exl3_grouped`'s tl.dot, or on Hopper `_exl3_grouped_wgmma`'s warpgroup MMA with W_q as the register operand)
    against the first prompt path (W_q decoded whole, fp32 matmul), within the operand's rounding of x (split_x: x
    as two parts, as close as fp32); two runs give the same bits; a token's bits do not depend on the chunk's other
    tokens; the form asked for is the one that ran."""
    from engine.ops import triton_exl3 as tx

    gen = torch.Generator(device="cuda").manual_seed(6)
    experts, hidden, width, k, rows = 32, 4096, 2048, 8, 96

    gate_up, down = _bank(gen, 2 * experts, hidden, width), _bank(gen, experts, width, hidden)
    x = torch.randn(rows, hidden, generator=gen, device="cuda")
    chosen = torch.stack([torch.randperm(experts, generator=gen, device="cuda")[:k] for _ in range(rows)])
    weights = torch.rand(rows, k, generator=gen, device="cuda")
    assert chosen.numel() > tx.PAIRS_MAX
    looped = tx._looped_experts(x, chosen, weights, gate_up, down, 10.0)
    launch, wgmma = PROMPT_FORMS[form]
    launch = {**launch, "split_x": split_x}
    ran = []
    applies = tx._wgmma_applies
    monkeypatch.setattr(tx, "_wgmma_applies", lambda *a: ran.append(applies(*a)) or ran[-1])
    grouped = tx.grouped_experts(x, chosen, weights, gate_up, down, 10.0, **launch)
    assert ran and set(ran) == {wgmma and torch.cuda.get_device_capability() == (9, 0)}, ran
    error = float((grouped - looped).abs().max() / looped.abs().max())
    assert error <= (1e-4 if split_x else 3e-3), error  # TF32 5.4e-5 and 1.3e-3 on the H200; fp16 2.5e-5, 3.7e-4
    assert torch.equal(grouped, tx.grouped_experts(x, chosen, weights, gate_up, down, 10.0, **launch))
    if launch["operands"] == "fp16":  # the option is taken: other operands, other last bits
        tf32 = tx.grouped_experts(x, chosen, weights, gate_up, down, 10.0, split_x=split_x, operands="tf32")
        assert not torch.equal(grouped, tf32)
    # the first 80 tokens again beside 16 others: their pairs sit elsewhere in the experts' blocks
    other = torch.cat([x[:80], torch.randn(16, hidden, generator=gen, device="cuda")])
    again = tx.grouped_experts(
        other, torch.cat([chosen[:80], chosen[16:32]]), weights[:96], gate_up, down, 10.0, **launch
    )
    assert torch.equal(again[:80], grouped[:80])


@pytest.mark.parametrize(("bits", "codebook"), [(3, "mcg"), (5, "3inst"), (3.5, "mul1"), (4, "mul1")])
def test_the_wgmma_form_decodes_every_width_like_the_dot_form(bits, codebook):
    """The wgmma form reads a tile's words for any width and codebook through the same decode as the dot form: a
    chunk's result agrees with the dot form's and with the expert loop, whatever the format."""
    from engine.ops import triton_exl3 as tx

    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the wgmma form is compute capability 9.0's")
    gen = torch.Generator(device="cuda").manual_seed(7)
    experts, hidden, width, k, rows = 16, 1024, 512, 8, 80
    gate_up = _bank(gen, 2 * experts, hidden, width, bits, codebook)
    down = _bank(gen, experts, width, hidden, bits, codebook)
    x = torch.randn(rows, hidden, generator=gen, device="cuda")
    chosen = torch.stack([torch.randperm(experts, generator=gen, device="cuda")[:k] for _ in range(rows)])
    weights = torch.rand(rows, k, generator=gen, device="cuda")
    looped = tx._looped_experts(x, chosen, weights, gate_up, down, 10.0)
    scale = looped.abs().max()
    wgmma = tx.grouped_experts(x, chosen, weights, gate_up, down, 10.0, form="wgmma")
    dot = tx.grouped_experts(x, chosen, weights, gate_up, down, 10.0, form="dot")
    assert float((wgmma - looped).abs().max() / scale) <= 1e-4
    assert float((wgmma - dot).abs().max() / scale) <= 1e-4
