"""EXL3 checkpoints: make-demo --format exl3 is laid out like the served checkpoint, the engine serves it exactly as
the same weights stored dense, tensor parallel keeps whole Hadamard blocks, and what cannot be served is refused."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from engine.checkpoint.demo import write_demo
from engine.checkpoint.exl3 import Exl3Index, read_projection
from engine.checkpoint.loader import CheckpointError, CheckpointReader
from engine.models.glm5_next.model import Glm5NextForCausalLM
from engine.parallel import ParallelGroup
from engine.quant import exl3

EXPERT = "model.language_model.layers.1.mlp.experts.3."


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_demo(tmp_path_factory.mktemp("exl3") / "ckpt", seed=0, size="exl3", fmt="exl3")


def _headers(path: Path) -> dict[str, tuple[str, list[int]]]:
    out = {}
    for file in path.glob("*.safetensors"):
        with safe_open(str(file), framework="pt") as handle:
            out.update({n: (handle.get_slice(n).get_dtype(), handle.get_slice(n).get_shape()) for n in handle.keys()})
    return out


def test_demo_stores_routed_experts_as_4bit_mcg_groups_and_the_rest_plain(demo: Path) -> None:
    config = json.loads((demo / "config.json").read_text())
    assert config["quantization_config"]["quant_method"] == "exl3"
    assert config["quantization_config"]["codebook"] == "mcg"
    hidden, width = config["text_config"]["hidden_size"], config["text_config"]["moe_intermediate_size"]
    headers = _headers(demo)
    assert headers[EXPERT + "gate_proj.trellis"] == ("I16", [hidden // 16, width // 16, 64])
    assert headers[EXPERT + "down_proj.trellis"] == ("I16", [width // 16, hidden // 16, 64])
    assert headers[EXPERT + "gate_proj.suh"] == ("F16", [hidden])
    assert headers[EXPERT + "gate_proj.svh"] == ("F16", [width])
    assert headers[EXPERT + "up_proj.mcg"] == ("I32", [])
    assert EXPERT + "gate_proj.weight" not in headers
    assert headers["model.language_model.layers.1.mlp.shared_experts.gate_proj.weight"][0] == "BF16"
    assert headers["model.language_model.layers.0.mlp.gate_proj.weight"][0] == "BF16"  # dense MLP stays bf16
    reader = CheckpointReader(demo, ParallelGroup.single())
    index = Exl3Index.of(reader)
    assert {(g.bits, g.codebook) for g in index.groups.values()} == {(4, "mcg")}


def _dense_twin(demo: Path, out: Path) -> Path:
    """The same checkpoint with every EXL3 group replaced by its decoded weight, stored in fp32."""
    shutil.copytree(demo, out)
    index = json.loads((out / "model.safetensors.index.json").read_text())
    for file in sorted(out.glob("*.safetensors")):
        tensors = load_file(str(file))
        for prefix in sorted({n.rsplit(".", 1)[0] for n in tensors if n.endswith(".trellis")}):
            linear = exl3.Exl3Linear(
                tensors.pop(prefix + ".trellis"), tensors.pop(prefix + ".suh"), tensors.pop(prefix + ".svh"), "mcg"
            )
            tensors.pop(prefix + ".mcg")
            tensors[prefix + ".weight"] = linear.dequantize(torch.float32).t().contiguous()
        save_file(tensors, str(file))
        index["weight_map"] = {
            n: file.name if n.rsplit(".", 1)[0] + ".weight" in tensors else f for n, f in index["weight_map"].items()
        }
    index["weight_map"] = {
        n.rsplit(".", 1)[0] + ".weight" if n.endswith(".trellis") else n: f
        for n, f in index["weight_map"].items()
        if not n.endswith((".suh", ".svh", ".mcg"))
    }
    (out / "model.safetensors.index.json").write_text(json.dumps(index))
    config = json.loads((out / "config.json").read_text())
    del config["quantization_config"]
    (out / "config.json").write_text(json.dumps(config))
    return out


def test_engine_serves_the_exl3_checkpoint_as_its_decoded_dense_twin(demo: Path, tmp_path: Path) -> None:
    twin = _dense_twin(demo, tmp_path / "dense")
    assert not any(n.endswith(".trellis") for n in _headers(twin))
    models = [Glm5NextForCausalLM.load(path, ParallelGroup.single()) for path in (demo, twin)]
    for ours, dense in zip(models[0].layers, models[1].layers):
        for a, b in zip(getattr(ours.mlp, "experts", []), getattr(dense.mlp, "experts", [])):
            assert torch.equal(a.gate_up, b.gate_up) and torch.equal(a.down, b.down)
    logits = []
    for model in models:
        seq = model.new_sequence(model.make_pool(64, "fp32"))
        first = model.prefill(seq, [5, 9, 2, 7, 11, 3])
        logits.append(torch.stack([first, model.decode([seq], [int(first.argmax())])[0]]))
    assert torch.isfinite(logits[0]).all() and logits[0].std() > 0.1
    # Same weights, but not the same bits out: the reader returns tensors at their safetensors offsets (the dense
    # twin's are not 64-byte aligned, the decoded ones are) and CPU BLAS sums in an alignment-dependent order.
    torch.testing.assert_close(logits[0], logits[1], rtol=0, atol=1e-4)
    assert logits[0][0].argmax() == logits[1][0].argmax()


@pytest.mark.parametrize("world", [2, 3])
def test_tensor_parallel_parts_are_whole_blocks_that_rebuild_the_weight(demo: Path, world: int) -> None:
    full = {
        p: read_projection(CheckpointReader(demo, ParallelGroup.single()), EXPERT + p, None)
        for p in ("gate_proj", "down_proj")
    }
    parts = {p: [] for p in full}
    for rank in range(world):
        reader = CheckpointReader(demo, ParallelGroup(rank, world))
        gate = Exl3Index.of(reader).load(reader, EXPERT + "gate_proj", 0)
        assert gate.out_features % exl3.HADAMARD_BLOCK == 0 and gate.in_features == full["gate_proj"].shape[1]
        parts["gate_proj"].append(read_projection(reader, EXPERT + "gate_proj", 0))
        parts["down_proj"].append(read_projection(reader, EXPERT + "down_proj", 1))
    assert torch.equal(torch.cat(parts["gate_proj"], 0), full["gate_proj"])  # outputs: rows of [out, in]
    assert torch.equal(torch.cat(parts["down_proj"], 1), full["down_proj"])  # inputs: columns


# -- refusals: small hand-made checkpoints ------------------------------------------------------------------------

MLP = "model.language_model.layers.1.mlp.experts.0."


def _group(prefix: str, k: int = 128, n: int = 128, words: int = 64, marker: int | None = 0xCBAC1FED) -> dict:
    out = {
        prefix + ".trellis": torch.zeros(k // 16, n // 16, words, dtype=torch.int16),
        prefix + ".suh": torch.ones(k, dtype=torch.float16),
        prefix + ".svh": torch.ones(n, dtype=torch.float16),
    }
    if marker is not None:
        out[prefix + ".mcg"] = torch.tensor(marker - 2**32 if marker >= 2**31 else marker, dtype=torch.int32)
    return out


def _checkpoint(tmp_path: Path, tensors: dict, quant: dict | None = None) -> CheckpointReader:
    save_file(tensors, str(tmp_path / "model.safetensors"))
    config = {"model_type": "glm5_next"} | ({"quantization_config": quant} if quant else {})
    (tmp_path / "config.json").write_text(json.dumps(config))
    return CheckpointReader(tmp_path, ParallelGroup.single())


def _experts(**overrides) -> dict:
    tensors = {}
    for proj in ("gate_proj", "up_proj", "down_proj"):
        tensors |= _group(MLP + proj, **overrides.get(proj, {}))
    return tensors


QUANT = {"quant_method": "exl3", "bits": 4.0, "codebook": "mcg"}


def test_a_well_formed_checkpoint_is_accepted(tmp_path: Path) -> None:
    index = Exl3Index.of(_checkpoint(tmp_path, _experts(), QUANT))
    assert sorted(index.groups) == [MLP + p for p in ("down_proj", "gate_proj", "up_proj")]


@pytest.mark.parametrize(
    "tensors, quant, message",
    [
        (_experts(up_proj=dict(marker=None)), QUANT, rf"{MLP}up_proj\.trellis: .*codebook mcg.*no marker \(3inst\)"),
        (_experts(gate_proj=dict(words=72)), QUANT, rf"{MLP}gate_proj\.trellis: last dimension 72 is 4\.5 bits"),
        (_experts(down_proj=dict(marker=0x12345678)), QUANT, rf"{MLP}down_proj\.mcg: holds 0x12345678"),
        (_experts(gate_proj=dict(words=40)), None, rf"{MLP}gate_proj\.trellis: 2\.5-bit tiles need the mul1 codebook"),
        (_experts(gate_proj=dict(k=96)), None, rf"{MLP}gate_proj\.trellis: K=96 and N=128 must be multiples of 128"),
        (
            _experts() | _group("model.language_model.layers.1.self_attn.q_proj"),
            None,
            r"layers\.1\.self_attn\.q_proj\.trellis: this engine reads EXL3 only for MLP projections",
        ),
        (
            {k: v for k, v in _experts().items() if not k.endswith("down_proj.svh")},
            None,
            rf"{MLP}down_proj: neither \.svh nor \.sv",
        ),
        (
            {k: v for k, v in _experts().items() if "down_proj" not in k}
            | {MLP + "down_proj.weight": torch.zeros(128, 128)},
            None,
            r"experts\.0: gate_proj is EXL3 but down_proj\.weight is plain",
        ),
        (
            {"model.language_model.norm.weight": torch.ones(128)},
            QUANT,
            r"quant_method exl3 but no tensor ends in \.trellis",
        ),
    ],
)
def test_what_cannot_be_served_is_refused_naming_the_tensor(
    tmp_path: Path, tensors: dict, quant: dict | None, message: str
) -> None:
    with pytest.raises((CheckpointError, exl3.Exl3FormatError), match=message):
        Exl3Index.of(_checkpoint(tmp_path, tensors, quant))
