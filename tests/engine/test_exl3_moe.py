"""EXL3 routed experts kept in EXL3 form (engine/checkpoint/exl3.read_expert_banks → engine/ops/fused.Exl3Experts →
engine/ops/triton_exl3.routed_experts,
the CUDA path of moe.MoE) in Triton's interpreter on the CPU, against the same experts decoded to dense weights.

As in test_exl3_triton.py, the kernels run in a child process started with TRITON_INTERPRET=1 (this file run as a
script prints the figures as JSON) and the tests assert on them; skipped where Triton is not installed. The same
model served on a GPU: tests/gpu/test_exl3_moe_gpu.py.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LAYER = "model.language_model.layers.1.mlp."
TOLERANCE = 2e-6  # of max |y|: fp32 sums of a few hundred products against fp64


def _cases(tmp: str) -> dict:
    """Run in the child (TRITON_INTERPRET=1): every figure the tests check."""
    import torch

    from engine.checkpoint.demo import write_demo
    from engine.checkpoint.exl3 import read_expert_banks
    from engine.checkpoint.loader import CheckpointReader
    from engine.models.glm5_next.moe import SwiGLU
    from engine.ops import Exl3Experts
    from engine.ops import triton_exl3 as tx
    from engine.ops.reference import swiglu_clamped
    from engine.parallel import ParallelGroup
    from engine.quant import exl3

    gen = torch.Generator().manual_seed(11)
    limit = 10.0
    out: dict = {}

    def bank(matrices: int, k: int, n: int) -> exl3.Exl3Bank:
        trellis = torch.randint(-32768, 32768, (matrices, k // 16, n // 16, 64), generator=gen).to(torch.int16)
        suh = torch.sign(torch.randn(matrices, k, generator=gen)) / (1.2437 * k**0.5)
        svh = (torch.rand(matrices, n, generator=gen) + 0.5) * torch.sign(torch.randn(matrices, n, generator=gen))
        return exl3.Exl3Bank(trellis, suh.half(), svh.half(), "mcg")

    def reference(x, chosen, weights, gate_up, down):
        """fp64 on the decoded weights (Exl3Linear.dequantize), one (row, expert) at a time."""
        y = torch.zeros(x.shape[0], down.svh.shape[-1], dtype=torch.float64)
        for t in range(x.shape[0]):
            for j, e in enumerate(chosen[t].tolist()):
                gate = x[t].double() @ gate_up.linear(2 * e).dequantize(torch.float64)
                up = x[t].double() @ gate_up.linear(2 * e + 1).dequantize(torch.float64)
                y[t] += float(weights[t, j]) * (
                    swiglu_clamped(gate, up, limit) @ down.linear(e).dequantize(torch.float64)
                )
        return y

    def error(y, exact) -> float:
        return float((y.double() - exact).abs().max() / exact.abs().max())

    # random banks: 5 experts, hidden 256, width 128; 3 rows x top-3 (9 pairs: the decode-GEMV path) with repeats
    hidden, width, experts = 256, 128, 5
    gate_up, down = bank(2 * experts, hidden, width), bank(experts, width, hidden)
    x = torch.randn(3, hidden, generator=gen) * 2
    chosen = torch.tensor([[4, 0, 2], [2, 4, 1], [3, 0, 4]])
    weights = torch.rand(3, 3, generator=gen) + 0.2
    y = tx.routed_experts(x, chosen, weights, gate_up, down, limit)
    out["decode_error"] = error(y, reference(x, chosen, weights, gate_up, down))
    out["decode_rows_alone_differ"] = int(
        sum(
            (
                tx.routed_experts(x[t : t + 1], chosen[t : t + 1], weights[t : t + 1], gate_up, down, limit)[0] != y[t]
            ).sum()
            for t in range(3)
        )
    )
    # the shared expert's output added in the last launch (a tensor, or a call made there): the bits of a separate
    # fp32 addition after it
    shared = torch.randn(3, hidden, generator=gen)
    out["decode_add_same_bits"] = [
        bool(torch.equal(tx.routed_experts(x, chosen, weights, gate_up, down, limit, add=a), shared + y))
        for a in (shared, lambda: shared)
    ]
    # a prompt chunk: 200 rows x top-3 = 600 pairs > PAIRS_MAX, experts decoded per chunk
    x = torch.randn(200, hidden, generator=gen) * 2
    chosen = torch.stack([torch.randperm(experts, generator=gen)[:3] for _ in range(200)])
    weights = torch.rand(200, 3, generator=gen) + 0.2
    assert chosen.numel() > tx.PAIRS_MAX
    y = tx.routed_experts(x, chosen, weights, gate_up, down, limit)
    out["prompt_error"] = error(y, reference(x, chosen, weights, gate_up, down))
    shared = torch.randn(200, hidden, generator=gen)
    out["prompt_add_same_bits"] = bool(
        torch.equal(tx.routed_experts(x, chosen, weights, gate_up, down, limit, add=shared), shared + y)
    )

    # the demo checkpoint's layer, loaded as a bank (names, gate/up interleave, order) and TP=2 whole-block parts,
    # against the CPU model's dense experts (decoded on load)
    demo = write_demo(Path(tmp) / "demo", seed=0, size="exl3", fmt="exl3")
    config = json.loads((demo / "config.json").read_text())["text_config"]
    n_experts, k = config["n_routed_experts"], config["num_experts_per_tok"]
    reader = CheckpointReader(demo, ParallelGroup.single())
    dense = [SwiGLU(reader, f"{LAYER}experts.{e}.", limit) for e in range(n_experts)]
    x = torch.randn(2, config["hidden_size"], generator=gen)
    chosen = torch.stack([torch.randperm(n_experts, generator=gen)[:k] for _ in range(2)])
    weights = torch.rand(2, k, generator=gen) + 0.2
    expected = torch.zeros(2, config["hidden_size"], dtype=torch.float64)
    for t in range(2):
        for j, e in enumerate(chosen[t].tolist()):
            expected[t] += float(weights[t, j]) * dense[e].partial(x[t : t + 1])[0].double()
    whole = Exl3Experts(*read_expert_banks(reader, LAYER, n_experts))
    out["demo_bank_sizes"] = [len(whole.gate_up), len(whole.down)]
    out["demo_error"] = error(whole(x, chosen, weights, limit), expected)
    parts = [
        Exl3Experts(*read_expert_banks(CheckpointReader(demo, ParallelGroup(rank, 2)), LAYER, n_experts))
        for rank in (0, 1)
    ]
    out["demo_tp2_widths"] = [p.down.trellis.shape[1] * 16 for p in parts]
    out["demo_tp2_error"] = error(sum(p(x, chosen, weights, limit) for p in parts), expected)
    out["shared_expert_not_banked"] = read_expert_banks(reader, "model.language_model.layers.0.mlp.", 1) is None
    return out


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> dict:
    if importlib.util.find_spec("triton") is None:
        pytest.skip("triton is not installed (scripts/bootstrap.sh adds it to the dev set-up on a CPU machine)")
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [sys.executable, __file__, str(tmp_path_factory.mktemp("exl3moe"))],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_decode_path_equals_the_dense_reference(results: dict) -> None:
    assert results["decode_error"] <= TOLERANCE


def test_a_rows_result_does_not_depend_on_the_batch(results: dict) -> None:
    assert results["decode_rows_alone_differ"] == 0


def test_prompt_chunk_path_equals_the_dense_reference(results: dict) -> None:
    assert results["prompt_error"] <= TOLERANCE


def test_the_shared_experts_output_added_in_the_last_launch_gives_the_separate_additions_bits(results: dict) -> None:
    """`routed_experts(..., add=)`: a decode step's rows (the output given, and a call giving it, as the shared
    expert's stream join is) and a prompt chunk's."""
    assert results["decode_add_same_bits"] == [True, True]
    assert results["prompt_add_same_bits"]


def test_demo_layer_banked_equals_its_experts_decoded_on_load(results: dict) -> None:
    assert results["demo_bank_sizes"] == [16, 8]  # gate and up of 8 experts; down of 8
    assert results["demo_error"] <= 1e-5
    assert results["shared_expert_not_banked"]


def test_tensor_parallel_parts_sum_to_the_whole(results: dict) -> None:
    assert results["demo_tp2_widths"] == [128, 128]  # expert width 256: one Hadamard block a rank
    assert results["demo_tp2_error"] <= 1e-5


if __name__ == "__main__":
    os.environ.setdefault("TRITON_INTERPRET", "1")
    sys.path.insert(0, str(ROOT))
    print(json.dumps(_cases(sys.argv[1])))
