"""fla-core's choices shipped for the KDA prompt kernels (engine/ops/fla_configs/<GPU>/, written by
bench/fla_configs.py): files in the format fla-core reads (fla/ops/utils/cache.py: `{kernel_name}.json`, entries
keyed by the md5 of the tuning key's compact sorted JSON), a choice for every head count a rank of GLM-5.3-Flash can
hold at 128 wide, and the engine pointing fla-core at them only where the operator has not chosen
(FLA_CACHE_MODE / FLA_CONFIG_DIR). fla-core is never installed on a CPU machine; the GPU side is
tests/gpu/test_fla_configs_gpu.py."""

from __future__ import annotations

import hashlib
import json
import os

import pytest

from engine.ops import fla_kda

FOLDERS = sorted(p for p in fla_kda.CONFIGS.iterdir() if p.is_dir())
HEADS = {64, 32, 22, 21, 16}  # GLM-5.3-Flash's 64 KDA heads at TP=1..4


def _key_hash(key: list) -> str:
    return hashlib.md5(json.dumps(key, separators=(",", ":"), sort_keys=True).encode()).hexdigest()


def test_folders_for_the_h200_and_the_gb10_hold_the_same_kernels():
    names = {p.name for p in FOLDERS}
    assert {"NVIDIA_H200", "NVIDIA_GB10"} <= names
    kernels = [sorted(f.stem for f in p.glob("*.json")) for p in FOLDERS]
    assert kernels[0] and all(k == kernels[0] for k in kernels)


@pytest.mark.parametrize("folder", FOLDERS, ids=lambda p: p.name)
def test_files_are_in_fla_cores_format_with_every_head_count(folder):
    for file in folder.glob("*.json"):
        body = json.loads(file.read_text())
        assert body["kernel_name"] == file.stem
        assert isinstance(body["default_config"], dict)
        keys = []
        for digest, entry in body["autotune_entries"].items():
            assert digest == _key_hash(entry["autotune_key"])  # how fla-core looks an entry up
            config = entry["config"]
            assert isinstance(config["kwargs"], dict) and config["num_warps"] >= 1 and config["num_stages"] >= 1
            keys.append(entry["autotune_key"])
            assert 128 in keys[-1] and all(isinstance(v, (int, bool, str)) for v in keys[-1])
        # the keys differ only where the head count stands (H, and HV where the kernel has it), one per head count
        varying = [i for i in range(len(keys[0])) if len({repr(k[i]) for k in keys}) > 1]
        assert varying and len(keys) == len(HEADS), file.name
        assert all(len({k[i] for i in varying}) == 1 for k in keys)
        assert {k[varying[0]] for k in keys} == HEADS, file.name


@pytest.mark.parametrize(
    "kernel,h200,gb10",
    [
        # fla-core offers a GPU under 166,912 bytes of shared memory a block (a GB10: 101,376) at most 2 stages here
        ("chunk_gated_delta_rule_fwd_kernel_h_blockdim64", 3, 2),
        # 4 stages compiled to 163,840 bytes on the H200 (bench/fla_configs.py time): capped at 2 for the GB10
        ("recompute_w_u_fwd_kda_kernel", 4, 2),
    ],
)
def test_the_gb10s_folder_keeps_the_h200s_choices_within_its_shared_memory(kernel, h200, gb10):
    def stages(folder: str) -> set[int]:
        body = json.loads((fla_kda.CONFIGS / folder / f"{kernel}.json").read_text())
        return {e["config"]["num_stages"] for e in body["autotune_entries"].values()}

    assert stages("NVIDIA_H200") == {h200} and stages("NVIDIA_GB10") == {gb10}


def test_the_engine_points_fla_core_at_them_unless_the_operator_chose(monkeypatch):
    for variable in ("FLA_CACHE_MODE", "FLA_CONFIG_DIR"):
        monkeypatch.delenv(variable, raising=False)
    assert fla_kda.use_shipped_configs("NVIDIA A100-SXM4-80GB") is None  # none shipped: fla-core autotunes
    assert "FLA_CACHE_MODE" not in os.environ and "FLA_CONFIG_DIR" not in os.environ
    folder = fla_kda.use_shipped_configs("NVIDIA GB10")
    assert folder == fla_kda.CONFIGS / "NVIDIA_GB10"
    assert os.environ["FLA_CACHE_MODE"] == "strict" and os.environ["FLA_CONFIG_DIR"] == str(folder)
    monkeypatch.setenv("FLA_CACHE_MODE", "disabled")  # the operator's choice stands
    monkeypatch.delenv("FLA_CONFIG_DIR")
    assert fla_kda.use_shipped_configs("NVIDIA H200") is None
    assert os.environ["FLA_CACHE_MODE"] == "disabled" and "FLA_CONFIG_DIR" not in os.environ
