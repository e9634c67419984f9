"""fla-core's choices shipped for the KDA prompt kernels (engine/ops/fla_configs/<GPU>/) on the GPU: a fresh process
with a fresh Triton cache reads them instead of autotuning (every cached autotuner holds a shipped configuration,
fla-core in "strict" mode), and chunk_kda with them, at GLM-5.3-Flash's TP=2 and TP=3 shard shapes, equals the
token-by-token delta rule, with the log-decay given and made in fla-core's gate kernel (`fla_kda.kda_gated`, the
served form). This GPU's own folder is picked by its name (the engine's default); the GB10's folder is
forced through FLA_CONFIG_DIR, so its choices are compiled and run here too (on this GPU, not on a GB10), each
compiled kernel within a GB10's shared memory a block (as this GPU's compiler lays it out). Skipped
without a GPU or fla-core (never part of CI)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from engine.ops import fla_kda

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available() or not fla_kda.usable(torch.device("cuda"), 128),
    reason="needs a CUDA GPU and fla-core",
)

PROBE = r"""
import gc, json, sys, torch
sys.path[:0] = [sys.argv[1]]
from test_kda_prompt_gpu import inputs, rel
from engine.models.glm5_next.kda import kda_steps
from engine.ops import fla_kda
heads = int(sys.argv[2])
with torch.no_grad():
    state, *rest = inputs(200, heads, 128, seed=heads)
    out, final = fla_kda.kda_chunked(state, *rest)
    want_out, want_final = kda_steps(state, *rest)
    # the served form: the log-decay made in fla-core's gate kernel from f_b's output (GLM-5.3-Flash's bound, -5)
    q, k, v, g, beta = rest
    gen = torch.Generator(device="cuda").manual_seed(heads)
    raw = torch.randn(g.shape, device="cuda", generator=gen)
    a_log = torch.rand(heads, device="cuda", generator=gen) * 2
    dt_bias = torch.randn(heads * 128, device="cuda", generator=gen) * 0.5
    decay = -5.0 * torch.sigmoid(a_log.exp()[:, None] * (raw + dt_bias.view(heads, 128)))
    gated = fla_kda.kda_gated(state, q, k, v, raw, beta, a_log, dt_bias, -5.0)
    want_gated = kda_steps(state, q, k, v, decay, beta)
from fla.ops.utils import cache
chosen, looked_up = {}, {}
for tuner in (o for o in gc.get_objects() if isinstance(o, cache.CachedAutotuner) and o.cache):
    chosen[tuner.kernel_name] = [
        {"kwargs": dict(c.kwargs), "num_warps": c.num_warps, "num_stages": c.num_stages} for c in tuner.cache.values()
    ]
    looked_up[tuner.kernel_name] = [cache.AutotuneKey.key_hash(key) for key in tuner.cache]  # the files' keys
print(json.dumps({"mode": cache.FLA_CACHE_MODE.value, "dir": str(cache.get_fla_config_dir()), "chosen": chosen,
                  "looked_up": looked_up,
                  "rel": [rel(out, want_out), rel(final, want_final), rel(gated[0], want_gated[0]),
                          rel(gated[1], want_gated[1])]}))
"""


def _probe(tmp_path: Path, heads: int, folder: Path | None) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLA_")}
    env["TRITON_CACHE_DIR"] = str(tmp_path / "triton")  # nothing compiled or tuned before
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    if folder is not None:
        env["FLA_CACHE_MODE"], env["FLA_CONFIG_DIR"] = "strict", str(folder)
    run = subprocess.run(
        [sys.executable, "-c", PROBE, str(ROOT / "tests" / "gpu"), str(heads)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


def _shipped(folder: Path) -> dict[str, list[dict]]:
    out = {}
    for file in folder.glob("*.json"):
        body = json.loads(file.read_text())
        out[body["kernel_name"]] = [
            {k: e["config"][k] for k in ("kwargs", "num_warps", "num_stages")}
            for e in body["autotune_entries"].values()
        ]
    return out


@pytest.mark.parametrize("which", ["this GPU", "GB10"])
@pytest.mark.parametrize("heads", [32, 22])
def test_a_first_start_reads_the_shipped_choices_and_is_exact(tmp_path, which, heads):
    folder = (
        fla_kda.shipped_configs(torch.cuda.get_device_name())
        if which == "this GPU"
        else fla_kda.CONFIGS / "NVIDIA_GB10"
    )
    if folder is None:
        pytest.skip(f"no fla-core choices shipped for {torch.cuda.get_device_name()}")
    result = _probe(tmp_path, heads, None if which == "this GPU" else folder)
    assert result["mode"] == "strict" and Path(result["dir"]) == folder
    shipped = _shipped(folder)
    assert set(result["chosen"]) == set(shipped)  # every kernel chunk_kda launches has a shipped choice
    for kernel, configs in result["chosen"].items():
        assert all(c in shipped[kernel] for c in configs), (kernel, configs)
    for kernel, digests in result["looked_up"].items():  # found under its own key, not tuned to the same choice
        body = json.loads((folder / f"{kernel}.json").read_text())
        assert set(digests) <= set(body["autotune_entries"]), (kernel, digests)
    assert max(result["rel"]) < 1e-4, result["rel"]
    if which == "GB10":  # each compiled kernel within a GB10's shared memory a block (measured here on this GPU)
        shared = {}
        for meta in (tmp_path / "triton").glob("*/*.json"):
            data = json.loads(meta.read_text())
            if isinstance(data, dict) and data.get("name") in shipped:
                shared[data["name"]] = max(shared.get(data["name"], 0), data["shared"])
        assert set(shared) == set(shipped) and max(shared.values()) <= GB10_SHARED, shared


GB10_SHARED = 101_376  # bytes of shared memory a block on sm_121 (fla-core's "ada" tier)
