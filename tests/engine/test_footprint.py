"""What /health reports a rank holds (engine/footprint.py), against the tensors themselves on the trained demo: the
kinds add up to every storage the model reaches, each counted once; the routed experts, embeddings and head and the
MTP layer are theirs; the lane states are what pool sizing set aside for them (cache.lane_state_bytes)."""

from __future__ import annotations

import pytest

from engine import footprint
from engine.cache import lane_state_bytes
from engine.checkpoint.demo import TRAINED
from engine.models.glm5_next.model import Glm5NextForCausalLM
from engine.models.glm5_next.moe import MoE
from engine.runner.executor import StepExecutor


@pytest.fixture(scope="module")
def model():
    return Glm5NextForCausalLM.load(TRAINED, mtp=True)


def nbytes(*tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def test_weights_by_kind_add_up_to_what_the_model_holds(model):
    kinds = footprint.weight_bytes(model)
    assert sum(kinds.values()) == footprint.held_bytes(model) and all(v > 0 for v in kinds.values())
    assert kinds["embeddings_and_head"] == nbytes(model.embed, model.lm_head)
    assert kinds["mtp"] == footprint.held_bytes(model.mtp) > 0
    experts = [e for layer in model.layers if isinstance(layer.mlp, MoE) for e in layer.mlp.experts]
    assert kinds["routed_experts"] == sum(nbytes(e.gate_up, e.down) for e in experts)


def test_the_mtp_layer_is_held_only_when_it_drafts(model):
    plain = Glm5NextForCausalLM.load(TRAINED)
    assert plain.mtp is None and footprint.weight_bytes(plain)["mtp"] == 0
    assert plain.num_pool_layers == model.num_pool_layers - 1
    assert plain.cache_bytes_per_token("bf16") < model.cache_bytes_per_token("bf16")


@pytest.mark.parametrize("kv", ["bf16", "fp8"])
def test_the_report_counts_the_pool_and_the_lane_states(model, kv):
    executor = StepExecutor(model, model.make_pool(256, kv), lanes=3, graphs=False, window=4)
    report = footprint.report(model, executor.pool, footprint.held_bytes(executor.decoder.state))
    item = 2 if kv == "bf16" else 1
    rows = model.num_pool_layers * 257 * model.cfg.pool_row_width * item  # one scratch row past the 256
    assert report["pool_bytes"] == rows + (model.num_pool_layers * 257 * 4 if kv == "fp8" else 0)
    fixed, per_token = lane_state_bytes(model.kda_state_shapes(), 3, 4, model.mtp_hidden_size)
    assert report["lane_state_bytes"] == fixed + per_token * 256  # what size_pool set aside
    assert report["pool_rows"] == kv and report["dense_dtype"] == "fp32"
