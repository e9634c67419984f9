"""`python -m engine info`: parameter counts and per-rank bytes from headers alone, and from a config alone; the
cache lines for each --kv row type against figures worked out from config.json."""

from __future__ import annotations

import json
import re
from importlib import resources
from pathlib import Path

import pytest
from safetensors import safe_open

from engine.__main__ import main
from engine.checkpoint.demo import write_demo
from engine.checkpoint.info import checkpoint_tensors, describe, rank_share
from engine.checkpoint.layout import REPLICATED, split_of

REAL_CONFIG = Path(str(resources.files("engine.checkpoint").joinpath("glm53_flash_config.json")))


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_demo(tmp_path_factory.mktemp("info") / "ckpt", seed=3, size="tiny")


def _numels(directory: Path) -> tuple[int, int]:
    """(all tensors, vision tensors) counted by opening every shard with safetensors."""
    total = vision = 0
    for shard in directory.glob("model-*.safetensors"):
        with safe_open(str(shard), framework="pt") as handle:
            for name in handle.keys():
                n = handle.get_tensor(name).numel()
                total += n
                vision += n if name.startswith("model.visual.") else 0
    return total, vision


def test_parameter_count_is_the_sum_of_tensor_numels(tiny: Path) -> None:
    info = describe(tiny)
    total, vision = _numels(tiny)
    assert info.total_params == total and info.params["vision"] == vision
    assert 0 < info.params["active"] < info.params["text"]
    # the config-only path derives the same tensors from config.json
    assert describe(tiny, config_only=True).total_params == total


@pytest.mark.parametrize("tp", [2, 3])
def test_rank_bytes_cover_the_model_with_replicated_tensors_on_every_rank(tiny: Path, tp: int) -> None:
    info = describe(tiny, tp=tp)
    config = info.config
    tensors = [t for t in checkpoint_tensors(tiny) if not t.name.startswith("model.visual.")]
    replicated = sum(t.nbytes for t in tensors if split_of(t.name, config) == REPLICATED)
    assert sum(info.rank_bytes) == info.text_bytes + (tp - 1) * replicated
    assert sum(info.rank_bytes) >= info.text_bytes
    # the by-kind line splits rank 0's figure, and adds the vision tower rank 0 holds with VISION=1
    text_kinds = {k: v for k, v in info.rank0_kinds.items() if k != "vision"}
    assert sum(text_kinds.values()) == info.rank_bytes[0]
    assert set(text_kinds) <= {"routed_experts", "dense", "embeddings_and_head", "mtp"}
    vision = [t for t in checkpoint_tensors(tiny) if t.name.startswith("model.visual.")]
    assert info.rank0_kinds["vision"] == sum(t.nbytes for t in vision) > 0
    assert info.rank0_kinds["routed_experts"] > 0 and info.rank0_kinds["embeddings_and_head"] > 0
    for t in tensors:  # every split tensor is covered exactly once
        if split_of(t.name, config) != REPLICATED:
            assert sum(rank_share(t, config, r, tp) for r in range(tp)) == t.nbytes


def test_splits_follow_the_tp_plan(tiny: Path) -> None:
    tensors = {t.name: t for t in checkpoint_tensors(tiny)}
    config = describe(tiny).config
    q = tensors["model.language_model.layers.0.self_attn.q_proj.weight"]  # 6 KDA heads x 16 rows, bf16
    assert [rank_share(q, config, r, 3) for r in range(3)] == [q.nbytes // 3] * 3
    o = tensors["model.language_model.layers.1.self_attn.o_proj.weight"]  # MLA row-parallel by heads
    assert split_of(o.name, config).dim == 1 and rank_share(o, config, 0, 2) == o.nbytes // 2
    embed = tensors["model.language_model.embed_tokens.weight"]  # 2688 rows over 5 ranks: uneven
    assert [rank_share(embed, config, r, 5) // (2 * 64) for r in range(5)] == [538, 538, 538, 537, 537]
    assert split_of("model.language_model.layers.1.mlp.gate.weight", config) == REPLICATED
    assert split_of("model.language_model.layers.1.self_attn.indexer.wk.weight", config) == REPLICATED


def test_real_config_figures() -> None:
    info = describe(REAL_CONFIG, tp=2)
    assert 321.0e9 < info.total_params < 321.5e9  # the released model is counted at ~321.3 B
    assert 17e9 < info.params["active"] < 19e9  # "18B active"
    assert abs(info.rank_bytes[0] - info.rank_bytes[1]) < 1e6
    assert 320e9 < info.rank_bytes[0] < 322e9


def test_cli_prints_architecture_and_ranks(tiny: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["info", str(tiny), "--tp", "3"]) == 0
    out = capsys.readouterr().out
    assert "4 KDA, 2 DSA" in out and "rank 2" in out and "8 experts, top-2" in out
    assert main(["info", str(tiny / "missing")]) == 2


def _expected_cache(config_path: Path, kv: str) -> tuple[int, float, int]:
    """From config.json alone: (pool bytes per token, KDA MiB per sequence, tokens per GiB) with row type `kv`.
    A pool row per DSA layer holds the latent and the index key and gate (kv_lora_rank + 2 index_head_dim values);
    fp8 rows carry one fp32 scale each. A KDA layer keeps an fp32 [heads, d, d] state and a q|k|v conv window."""
    text = json.loads(config_path.read_text())["text_config"]
    dsa = sum(1 for kind in text["layer_types"] if kind != "linear_attention")
    kda = len(text["layer_types"]) - dsa
    item = {"fp32": 4, "bf16": 2, "fp8": 1}[kv]
    per_token = dsa * ((text["kv_lora_rank"] + 2 * text["index_head_dim"]) * item + (4 if kv == "fp8" else 0))
    nested = text.get("linear_attn_config") or {}  # the released config nests the KDA sizes
    heads = text.get("linear_num_heads", nested.get("num_heads"))
    dim = text.get("linear_head_dim", nested.get("head_dim"))
    conv = text.get("linear_conv_kernel_dim", nested.get("short_conv_kernel_size"))
    state = kda * (heads * dim * dim + 3 * heads * dim * (conv - 1)) * 4
    return per_token, state / 2**20, 2**30 // per_token


@pytest.mark.parametrize("source", ["tiny", "real"])
def test_the_kv_option_sets_the_cache_row_type_and_its_bytes(
    tiny: Path, source: str, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tiny if source == "tiny" else REAL_CONFIG
    config = tiny / "config.json" if source == "tiny" else REAL_CONFIG
    printed = {}
    for kv in ("bf16", "fp8", "fp32"):
        assert main(["info", str(path), "--kv", kv, "--tp", "2"]) == 0
        out = capsys.readouterr().out
        per_token, state_mib, per_gib = _expected_cache(config, kv)
        cache = re.search(r"DSA cache, KV=(\w+): (\d+) B per token", out)
        assert cache is not None and cache.groups() == (kv, str(per_token)), out
        assert f"recurrent state {state_mib:.2f} MiB per sequence" in out  # fp32 whatever the row type
        assert f"pool: {per_gib:,} tokens per GiB" in out and f"--tp 2 --kv {kv} --dense bf16" in out
        dsa = int(re.search(r"(\d+) DSA", out).group(1))  # the MTP drafter's layer keeps one more pool row a token
        assert f"{2**30 // (per_token // dsa * (dsa + 1)):,} with the MTP drafter's row" in out, out
        printed[kv] = per_token
    assert printed["fp32"] == 2 * printed["bf16"] and printed["fp8"] > printed["bf16"] // 2
    assert main(["info", str(path)]) == 0  # bf16 rows unless asked, as serve's and fit's --kv
    assert f"KV=bf16: {printed['bf16']} B per token" in capsys.readouterr().out
