"""CUDA-graph decode (engine/runner/lanes.py) against the eager step and the plain decode path, on a tiny
random checkpoint on the GPU with fp32 weights (tight tolerance) and bf16 weights (the serving dtype: logits within
bf16 resolution, greedy tokens equal unless the reference side is at a near-tie). Runs on the lent H200 machine:
    PYTHONPATH=.:tests/engine python -m pytest -q tests/gpu
Skipped where no GPU is present (never part of CI)."""

from __future__ import annotations

import logging

import pytest
import torch
from reference import make_reference
from test_parity import NEAR_TIE, margin, prompt

from engine.models.glm5_next.model import Glm5NextForCausalLM
from engine.parallel import ParallelGroup
from engine.runner.lanes import LaneDecoder

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

TOKENS = 12
# (prompt seed, prompt length, lane, the step at which it joins): batch 1, 2, 3, 4, then lane 0 leaves and a new
# stream takes it (batch 4 again, same graphs)
SCHEDULE = [(1, 5, 0, 0), (2, 23, 1, 1), (3, 40, 2, 2), (4, 13, 3, 3), (5, 61, 0, TOKENS)]


TOL = {torch.float32: 1e-3, torch.bfloat16: 5e-2}


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    path = tmp_path_factory.mktemp("graphs")
    make_reference(path, "kda3_dsa1", seed=2)
    return path


@pytest.fixture(scope="module", params=[torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def model(request, checkpoint):
    return Glm5NextForCausalLM.load(checkpoint, ParallelGroup.single("cuda"), dtype=request.param)


def assert_follows(
    tokens: list[int],
    logits: list[torch.Tensor],
    ref_tokens: list[int],
    ref_logits: list[torch.Tensor],
    tol: float,
    what: str,
) -> None:
    """Same greedy tokens and logits within tol, up to a first difference the reference calls a near-tie."""
    for t, (a, b) in enumerate(zip(logits, ref_logits)):
        assert float((a - b).abs().max()) < tol, f"{what} token {t}"
        if tokens[t] != ref_tokens[t]:
            assert margin(b) < NEAR_TIE, f"{what} token {t}: a clear greedy choice differs"
            return


def run_schedule(model, graphs: bool):
    """Streams of SCHEDULE through one LaneDecoder; per stream (greedy tokens, logits), and the decoder."""
    decoder = LaneDecoder(model, model.make_pool(512, "bf16"), num_lanes=4, graphs=graphs)
    decoder.min_span, decoder.pad_spans = 16, True  # eager with the graphs' spans: the same kernels on both sides
    live: dict[int, tuple[int, object]] = {}
    out = {i: ([], []) for i in range(len(SCHEDULE))}
    for step in range(80):
        for i, (seed, length, lane, start) in enumerate(SCHEDULE):
            if start == step:
                seq = decoder.new_sequence(lane)
                logits = model.prefill(seq, prompt(seed=seed, length=length))
                out[i][0].append(int(logits.argmax()))
                out[i][1].append(logits.cpu())
                live[lane] = (i, seq)
        if not live:
            break
        lanes = sorted(live)
        logits = decoder.decode([live[lane][1] for lane in lanes], [out[live[lane][0]][0][-1] for lane in lanes])
        for row, lane in enumerate(lanes):
            i, seq = live[lane]
            out[i][0].append(int(logits[row].argmax()))
            out[i][1].append(logits[row].cpu())
            if len(out[i][0]) == TOKENS:
                seq.release()
                del live[lane]
    return out, decoder


@torch.no_grad()
def test_graph_decode_equals_eager_decode(model):
    graphed, decoder = run_schedule(model, graphs=True)
    eager, _ = run_schedule(model, graphs=False)
    assert decoder.uses_graphs, "the capture fell back to eager"
    assert {b for b, _, _ in decoder.graphs} == {1, 2, 3, 4}
    for i in graphed:
        assert_follows(*graphed[i], *eager[i], TOL[model.embed.dtype], f"stream {i}")


@torch.no_grad()
def test_post_and_comb_beside_give_the_one_stream_bits(model, monkeypatch):
    """A step's hyper-connections with post and comb made on the second stream (triton_mhc.GATES_BESIDE, the
    default: a branch of each captured graph beside `_hc_mix` and the sublayer) give every token and logit bit of
    `_hc_mix` making them on the step's stream, graphed and eager."""
    from engine.ops import triton_mhc

    assert triton_mhc.GATES_BESIDE
    for graphs in (True, False):
        beside, decoder = run_schedule(model, graphs=graphs)
        assert decoder.uses_graphs == graphs
        monkeypatch.setattr(triton_mhc, "GATES_BESIDE", False)
        inline, _ = run_schedule(model, graphs=graphs)
        monkeypatch.undo()
        for i in beside:
            assert beside[i][0] == inline[i][0], f"stream {i}, graphs {graphs}"
            assert all(torch.equal(a, b) for a, b in zip(beside[i][1], inline[i][1])), f"stream {i}, graphs {graphs}"


@torch.no_grad()
def test_graph_decode_equals_the_plain_path_alone(model):
    """Each stream batched in graphs against the same stream alone through model.decode (bf16: logits within
    bf16 resolution; greedy tokens equal unless the plain path is at a near-tie)."""
    graphed, _ = run_schedule(model, graphs=True)
    for i, (seed, length, _, _) in enumerate(SCHEDULE):
        seq = model.new_sequence(model.make_pool(length + TOKENS, "bf16"))
        step = model.prefill(seq, prompt(seed=seed, length=length))
        tokens, logits = [], []
        for t in range(TOKENS):
            logits.append(step.cpu())
            tokens.append(graphed[i][0][t])  # follow the graphed stream's tokens
            step = model.decode([seq], [tokens[-1]])[0]
        plain_tokens = [int(x.argmax()) for x in logits]
        assert_follows(graphed[i][0], graphed[i][1], plain_tokens, logits, TOL[model.embed.dtype], f"stream {i}")


@torch.no_grad()
def test_joining_and_leaving_needs_no_new_capture(model):
    _, decoder = run_schedule(model, graphs=True)
    captured = dict(decoder.graphs)
    seq = decoder.new_sequence(2)  # a lane reused by a new stream at a (batch, span) seen before: (1, 16)
    model.prefill(seq, prompt(seed=9, length=10))
    decoder.decode([seq], [3])
    assert (1, 1, 16) in captured
    assert decoder.graphs == captured and all(decoder.graphs[k] is captured[k] for k in captured)


@torch.no_grad()
def test_a_failed_capture_falls_back_to_eager_with_one_warning(model, monkeypatch, caplog):
    expected, _ = run_schedule(model, graphs=False)
    plain_step = type(model).decode_step

    def syncing_step(self, lanes, inputs, span, width=1):
        if torch.cuda.is_current_stream_capturing():
            inputs.sum().item()  # a host read: not allowed while capturing
        return plain_step(self, lanes, inputs, span, width)

    monkeypatch.setattr(type(model), "decode_step", syncing_step)
    with caplog.at_level(logging.WARNING, logger="engine.lanes"):
        got, decoder = run_schedule(model, graphs=True)
    assert not decoder.uses_graphs
    warnings = [r for r in caplog.records if "CUDA graph capture failed" in r.getMessage()]
    assert len(warnings) == 1
    assert all(got[i][0] == expected[i][0] for i in got)
    # the failed capture must not leave the device's random generator unusable (it did before restore_generator:
    # the next test's torch.randn raised "Offset increment outside graph capture encountered unexpectedly")
    assert torch.randn(4, device="cuda").isfinite().all()


def test_cuda_graphs_0_turns_them_off(model):
    """--cuda-graphs 0 reaches the decoder through the executor (EngineConfig.cuda_graphs)."""
    from engine.runner.executor import StepExecutor

    assert not StepExecutor(model, model.make_pool(64, "bf16"), lanes=1, graphs=False).decoder.uses_graphs
    assert StepExecutor(model, model.make_pool(64, "bf16"), lanes=1, graphs=True).decoder.uses_graphs
