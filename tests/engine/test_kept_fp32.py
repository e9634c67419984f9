"""The control tensors the released checkpoint stores in fp32 (routers and their correction bias, KDA's conv taps,
dt_bias and A_log, the hyper-connections' base and scale) load as fp32 whatever the load dtype, as transformers keeps
them (`_keep_in_fp32_modules_strict`). A GPU loads in bf16; before, these were rounded to bf16 on the way in, so the
GPU routed with a rounded correction bias and could pick other experts than the reference. Run here on the CPU with
a bf16 load, the dtype a GPU uses."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from engine.checkpoint.demo import write_demo
from engine.checkpoint.layout import kept_fp32, text_tensors
from engine.checkpoint.loader import CheckpointReader
from engine.models.glm5_next.model import Glm5NextForCausalLM
from engine.models.glm5_next.moe import MoE
from engine.parallel import ParallelGroup

RELEASED = Path(__file__).resolve().parents[2] / "engine" / "checkpoint" / "glm53_flash_config.json"


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_demo(tmp_path_factory.mktemp("kept") / "ckpt", seed=3, size="tiny")


def _stored(path: Path) -> dict[str, torch.Tensor]:
    out = {}
    for file in path.glob("*.safetensors"):
        with safe_open(str(file), framework="pt") as handle:
            out.update({n: handle.get_tensor(n) for n in handle.keys()})
    return out


def test_kept_names_are_exactly_the_layouts_fp32_tensors() -> None:
    specs = text_tensors(json.loads(RELEASED.read_text()))
    marked = {s.name for s in specs if s.fp32}
    assert marked and marked == {s.name for s in specs if kept_fp32(s.name)}
    leaves = {n.rsplit(".layers.", 1)[-1].split(".", 1)[-1] for n in marked}
    assert leaves == {
        "mlp.gate.weight",
        "mlp.gate.e_score_correction_bias",
        "self_attn.q_conv1d.weight",
        "self_attn.k_conv1d.weight",
        "self_attn.v_conv1d.weight",
        "self_attn.dt_bias",
        "self_attn.A_log",
        "hc_attn_base",
        "hc_attn_scale",
        "hc_ffn_base",
        "hc_ffn_scale",
    }
    # names that only look alike stay in the load dtype
    for name in ("model.language_model.layers.1.mlp.gate_proj.weight", "model.language_model.layers.1.hc_attn_fn"):
        assert not kept_fp32(name)


def test_a_bf16_reader_keeps_the_stored_fp32_bits_of_the_kept_tensors_only(demo: Path) -> None:
    reader = CheckpointReader(demo, ParallelGroup.single(), dtype=torch.bfloat16)
    stored = _stored(demo)
    kept = [n for n in reader.names() if kept_fp32(n)]
    assert any(n.endswith("e_score_correction_bias") for n in kept) and any(n.endswith("A_log") for n in kept)
    rounded = 0
    for name in kept:
        got = reader.get(name)
        assert got.dtype == torch.float32 and torch.equal(got, stored[name]), name
        rounded += int(not torch.equal(stored[name].bfloat16().float(), stored[name]))
    assert rounded  # the stored values are not all bf16-exact: a bf16 read would have changed them
    other = next(n for n in reader.names() if n.endswith("mlp.shared_experts.gate_proj.weight"))
    assert reader.get(other).dtype == torch.bfloat16


def test_a_bf16_load_routes_with_the_stored_router_and_bias(demo: Path) -> None:
    """The model loaded as a GPU loads it (bf16) holds the routers and biases bit for bit as stored, and picks the
    experts that the stored fp32 router and bias pick; a bias rounded to bf16 picks others for some token."""
    model = Glm5NextForCausalLM.load(demo, dtype=torch.bfloat16)
    stored = _stored(demo)
    moes = [(i, layer.mlp) for i, layer in enumerate(model.layers) if isinstance(layer.mlp, MoE)]
    assert moes
    gen = torch.Generator().manual_seed(0)
    for i, moe in moes:
        prefix = f"model.language_model.layers.{i}.mlp.gate."
        assert torch.equal(moe.router, stored[prefix + "weight"])
        assert torch.equal(moe.bias, stored[prefix + "e_score_correction_bias"])
        x = torch.randn(256, moe.router.shape[1], generator=gen)
        scores = torch.sigmoid(x @ moe.router.t())
        exact = torch.topk(scores + stored[prefix + "e_score_correction_bias"], moe.top_k, dim=-1).indices
        assert torch.equal(moe.route(x)[0], exact)
    # the other kept tensors as stored, where a GPU-style load used to round them
    for i, layer in enumerate(model.layers):
        prefix = f"model.language_model.layers.{i}."
        assert torch.equal(layer.attn_hc.base, stored[prefix + "hc_attn_base"])
        assert torch.equal(layer.ffn_hc.scale, stored[prefix + "hc_ffn_scale"])
        if hasattr(layer.attn, "dt_bias"):
            assert torch.equal(layer.attn.dt_bias, stored[prefix + "self_attn.dt_bias"])
            assert torch.equal(layer.attn.a_decay, stored[prefix + "self_attn.A_log"].exp())
