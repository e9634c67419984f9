"""DSA's pool keys on the GPU (engine/ops/triton_dsa.py `complete_pools`, one launch a layer): the kernel against the
torch form for fp32, bf16 and fp8 rows (tests/engine/test_pool_keys_triton.py's cases, there under Triton's
interpreter), and through the serving path with CUDA graphs: steps read nothing of a complete pool but its key
(tests/engine/test_pool_keys.py's check, the steps' pool choice by top_pools' kernels); the pool choice without a
sort (`ops.top_pools`: on CUDA engine/ops/triton_dsa.py's kernels; tests/engine/test_top_pools.py's cases), eagerly
and replayed from a CUDA graph, for a prompt chunk's rows (those cases' rows repeated, and a 2,048-query chunk at a
512k span), and for a few queries whose spans its kernels cut into segments; the selected tokens from the chosen
pools (`ops.pool_tokens`, tests/engine/test_pool_tokens.py's cases), eagerly and from a graph. Skipped where no
GPU is present (never part of CI)."""

from __future__ import annotations

import pytest
import torch
from reference import make_reference
from test_pool_keys import KVS, decode_outputs
from test_pool_keys_triton import check, kernel_figures_on
from test_pool_tokens import cases as token_cases
from test_pool_tokens import same_as_by_hand
from test_top_pools import by_sort, cases, check_cases

from engine import ops
from engine.models.glm5_next.model import Glm5NextForCausalLM
from engine.ops.reference import pool_tokens as torch_pool_tokens
from engine.parallel import ParallelGroup

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@pytest.fixture(scope="module")
def figures() -> dict:
    return kernel_figures_on("cuda")


@pytest.mark.parametrize("kv", KVS)
@pytest.mark.parametrize("form", ["step", "prompt"])
def test_the_kernel_writes_the_torch_forms_pool_keys_on_the_gpu(figures, kv, form):
    f = figures[f"{kv}_{form}"]
    check(f, kv, form, fp32_tol=1e-5)  # the GPU's exp is Triton's fast one
    assert f["fp8_slips"] == 0  # e4m3 conversion in hardware: no interpreter slip to allow


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    path = tmp_path_factory.mktemp("dsa_heavy")
    make_reference(path, "dsa_heavy", seed=2)
    return Glm5NextForCausalLM.load(path, ParallelGroup.single("cuda"), dtype=torch.float32)


@torch.no_grad()
@pytest.mark.parametrize("kv", KVS)
def test_graphed_steps_read_only_the_pool_keys_of_complete_pools(model, kv):
    clean, poisoned = decode_outputs(model, kv, False, graphs=True), decode_outputs(model, kv, True, graphs=True)
    for i, (a, b) in enumerate(zip(clean, poisoned)):
        assert torch.equal(a, b), f"output {i}"
        assert torch.isfinite(a).all()


def test_top_pools_on_the_gpu_eagerly_and_from_a_graph():
    check_cases("cuda")
    for name, index, k in cases("cuda"):
        if k == 0:  # no kernel to capture (an empty span's choice is made without one): checked eagerly above
            continue
        static = index.clone()
        ops.top_pools(static, k)  # warm (the allocator, topk's workspace) before capture
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = ops.top_pools(static, k)
        static.copy_(index.flip(-1))  # new scores into the captured input
        graph.replay()
        assert torch.equal(out, by_sort(index.flip(-1), k)), name


def test_top_pools_kernel_takes_the_same_pools_for_a_prompt_chunks_rows():
    from engine.ops import triton_dsa

    rows = 512  # a 128k span's block of queries
    gen = torch.Generator(device="cuda").manual_seed(5)
    chunk = torch.randn(2048, 131072, device="cuda", generator=gen)  # a 2k chunk at 512k: 131,072 pools of 4
    chunk[:, 130600:] = torch.finfo(torch.float32).min  # pools not complete yet at the queries' positions
    chunk[:, 100:40000:50] = 3.0  # 798 pools tied near the top: the 512th place falls inside the tie
    above = (chunk > 3.0).sum(-1)
    assert bool(((above < 512) & (above + 798 >= 512)).all())
    every = [*((name, index.repeat(-(-rows // index.shape[0]), 1), k) for name, index, k in cases("cuda")),
             ("2k chunk at 512k", chunk, 512)]  # fmt: skip
    for name, index, k in every:
        assert triton_dsa.top_pools_applies(index), name
        assert torch.equal(ops.top_pools(index, k), by_sort(index, k)), name


def test_top_pools_kernel_cuts_a_few_queries_spans_into_segments_eagerly_and_from_a_graph():
    """A decode step's or a long span's block of queries: few rows, each span cut into segments of whole blocks
    (`top_pools_segments`), the kernels called directly whatever `top_pools_applies` says, and replayed from a graph
    with new scores."""
    from engine.ops import triton_dsa

    gen = torch.Generator(device="cuda").manual_seed(6)
    long = torch.randn(2, 262144, device="cuda", generator=gen)  # a 1M span's pools
    long[:, 5:200000:300] = 2.9  # 667 tied near the top: the 512th place falls inside the tie
    assert triton_dsa.top_pools_segments(*long.shape) < long.shape[1] // 64  # over 64 programs a query
    for name, index, k in [*cases("cuda"), ("1M span, 2 queries", long, 512)]:
        if k == 0:
            continue
        assert torch.equal(triton_dsa.top_pools(index, k), by_sort(index, k)), name
        static = index.clone()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = triton_dsa.top_pools(static, k)
        static.copy_(index.flip(-1))
        graph.replay()
        assert torch.equal(out, by_sort(index.flip(-1), k)), name


def test_pool_tokens_kernel_gives_the_rules_integers_eagerly_and_from_a_graph():
    """`ops.pool_tokens` on CUDA (engine/ops/triton_dsa.py's one launch) against the rule (test_pool_tokens.py's
    cases), then replayed from a graph with new positions and choices in the captured inputs."""
    from engine.ops import triton_dsa

    same = same_as_by_hand(ops.pool_tokens, "cuda")
    assert all(same.values()), [name for name, ok in same.items() if not ok]
    for name, args in token_cases("cuda"):
        assert triton_dsa.pool_tokens_applies(args["positions"]), name
        static = {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in args.items()}
        ops.pool_tokens(**static)  # compiled before capture
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = ops.pool_tokens(**static)
        moved = {**args, "positions": (args["positions"] - 3).clamp(min=0)}
        if args["chosen"] is not None:
            moved["chosen"] = args["chosen"].flip(0)
            static["chosen"].copy_(moved["chosen"])
        static["positions"].copy_(moved["positions"])
        graph.replay()
        want = torch_pool_tokens(**{k: v.cpu() if isinstance(v, torch.Tensor) else v for k, v in moved.items()})
        assert all(torch.equal(a.cpu(), b) for a, b in zip(out, want)), name
