"""The plan for TP=1/2/3 under each runtime, compared with reviewed snapshots (UPDATE_SNAPSHOTS=1 rewrites them)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from recipe.plan.host import HostFacts
from recipe.plan.plan import build_plan
from recipe.settings import load_settings
from recipe.settings.values import checkout_key

SNAPSHOTS = Path(__file__).with_name("snapshots")
HOST = HostFacts(python="python3", gpu=False, cpu_count=4)
SPARK = HostFacts(python="python3", gpu=True, cpu_count=20, rdma=True)  # what detect_host finds on a Spark
BASE = {
    "LOG_DIR": "/srv/sparks/logs",
    "CACHE_DIR": "/srv/sparks/cache",
    "HF_CACHE": "/srv/hf",
    "API_KEY": "sk-test-0123456789",
    "HF_TOKEN": "hf_test0123456789",
}
WORKERS = {1: {}, 2: {"WORKER": "me@spark2"}, 3: {"WORKER": "me@spark2", "WORKER2": "me@spark3"}}


def plan_for(root: Path, tp: int, runtime: str):
    env = {**BASE, "TP": str(tp), "RUNTIME": runtime, **(WORKERS[tp] if runtime == "docker" else {})}
    return build_plan(load_settings(root, env), SPARK if runtime == "docker" else HOST)


@pytest.mark.parametrize("runtime", ["process", "docker"])
@pytest.mark.parametrize("tp", [1, 2, 3])
def test_plan_snapshot(root: Path, tp: int, runtime: str) -> None:
    plan = plan_for(root, tp, runtime)
    text = plan.to_json().replace(checkout_key(), "<checkout>") + "\n"  # where this checkout lies varies
    path = SNAPSHOTS / f"plan-tp{tp}-{runtime}.json"
    if os.environ.get("UPDATE_SNAPSHOTS") == "1":
        path.parent.mkdir(exist_ok=True)
        path.write_text(text)
    assert text == path.read_text(), f"{path.name} differs; review, then UPDATE_SNAPSHOTS=1 to accept"


@pytest.mark.parametrize("runtime", ["process", "docker"])
@pytest.mark.parametrize("tp", [1, 2, 3])
def test_plan_shape(root: Path, tp: int, runtime: str) -> None:
    plan = plan_for(root, tp, runtime)
    assert [r.rank for r in plan.ranks] == list(range(tp - 1, -1, -1))  # workers first, rank 0 last
    assert [r.ports for r in plan.ranks if r.ports] == [(8888, 29551)]  # only rank 0 listens
    for rank in plan.ranks:
        assert rank.argv[rank.argv.index("--rank") + 1] == str(rank.rank)
        assert ("--api-key-file" in rank.argv) == (rank.node == "local")  # the key file exists on the head only
    printed = plan.to_json()
    assert "sk-test-0123456789" not in printed and "hf_test0123456789" not in printed
    if runtime == "docker":
        for rank in plan.ranks:
            for flag in (
                "--gpus",
                "--network",
                "--ipc",
                "--shm-size",
                "/dev/infiniband",
                "NCCL_IB_HCA=<RoCE devices>",
                "memlock=-1",
                f"glm-sparks-rank{rank.rank}",
            ):
                assert any(flag in word for word in rank.argv), flag
        assert [r.node for r in plan.ranks] == [*reversed(list(WORKERS[tp].values())), "local"]


def test_secret_looking_env_is_masked_when_printed(root: Path) -> None:
    from recipe.plan.plan import mask_env

    assert mask_env("HF_TOKEN", "hf_x") == "***" and mask_env("NCCL_IB_HCA", "mlx5_0") == "mlx5_0"


def test_extra_args_reach_every_rank(root: Path) -> None:
    plan = build_plan(load_settings(root, {}), HOST, ("--max-tokens", "64"))
    assert all(r.argv[-2:] == ("--max-tokens", "64") for r in plan.ranks)


def test_plan_json_round_trips(root: Path) -> None:
    assert json.loads(plan_for(root, 2, "process").to_json())["ranks"][1]["rank"] == 0


def test_docker_flags_follow_the_host_facts(root: Path) -> None:
    """The test bed (no GPU, no /dev/infiniband) runs the same plan as a Spark, without the device flags."""
    settings = load_settings(root, {**BASE, "TP": "2", "RUNTIME": "docker", **WORKERS[2]})
    bare = build_plan(settings, HOST)
    for rank in bare.ranks:
        assert "--gpus" not in rank.argv and "--device" not in rank.argv and "IPC_LOCK" not in rank.argv
        assert "--network" in rank.argv and "OMP_NUM_THREADS=2" in rank.argv  # 4 cores shared by 2 ranks
    gpu_only = build_plan(settings, HostFacts(python="python3", gpu=True, cpu_count=4))
    assert all("--gpus" in r.argv and "--device" not in r.argv for r in gpu_only.ranks)
    assert not any(w.startswith("OMP_NUM_THREADS") for r in gpu_only.ranks for w in r.argv)


def test_docker_mounts_secret_only_on_rank_0_and_cache_writable(root: Path) -> None:
    plan = plan_for(root, 2, "docker")
    rank0, rank1 = plan.rank0, plan.ranks[0]
    assert any(m.target == "/run/secrets/api_key" for m in rank0.mounts)
    assert not any(m.target.startswith("/run/secrets") for m in rank1.mounts)
    cache = [m for m in rank1.mounts if m.target == "/cache"]
    assert cache and not cache[0].read_only and cache[0].source == "/srv/sparks/cache/kernels/<image id>"
    assert all(m.read_only for m in rank1.mounts if m.target != "/cache")


def test_a_refit_plans_again_from_settings(root: Path) -> None:
    """The refit changes the settings' window and plans again; only the window differs."""
    import dataclasses

    plan = plan_for(root, 3, "docker")
    settings = load_settings(root, {**BASE, "TP": "3", "RUNTIME": "docker", **WORKERS[3]})
    refit = plan.rebuilt(dataclasses.replace(settings, context=4096))
    for before, after in zip(plan.ranks, refit.ranks):
        assert after.argv[after.argv.index("--context") + 1] == "4096"
        i = before.argv.index("--context")
        assert before.argv[: i + 1] == after.argv[: i + 1] and before.argv[i + 2 :] == after.argv[i + 2 :]
    assert refit.summary["context"] == 4096


def test_a_checkpoint_setting_is_the_positional_argument_only(root: Path) -> None:
    env = {**BASE, "TP": "2", "RUNTIME": "process", "CHECKPOINT": "/models/glm"}
    for rank in build_plan(load_settings(root, env), HOST).ranks:
        assert rank.argv[rank.argv.index("serve") + 1] == "/models/glm"
        assert "(positional)" not in rank.argv and rank.argv.count("/models/glm") == 1


def test_drafts_are_on_by_default_on_every_device(root: Path) -> None:
    """The default DRAFTER=mtp+copy reaches CPU and GPU ranks alike (since session 17 a step that may verify drafts
    costs a GPU decode step ~1.5 %, docs/BENCHMARKS.md), and a drafter written out, none included, wins."""

    def drafter(plan) -> str:
        argv = plan.ranks[-1].argv
        return argv[argv.index("--drafter") + 1]

    assert drafter(build_plan(load_settings(root, BASE), HOST)) == "mtp+copy"
    gpu = build_plan(load_settings(root, BASE), SPARK)
    assert drafter(gpu) == "mtp+copy" and gpu.summary["drafter"] == "mtp+copy"
    assert drafter(build_plan(load_settings(root, {**BASE, "DRAFTER": "copy"}), SPARK)) == "copy"
    assert drafter(build_plan(load_settings(root, {**BASE, "DRAFTER": "none"}), SPARK)) == "none"


def test_the_prefill_chunk_follows_the_device(root: Path) -> None:
    """PREFILL_CHUNK's default 128 reaches CPU ranks; on a GPU host the default is 2048 (a prompt step costs about
    one pass over the weights there); a value written out wins on both."""

    def chunk(plan) -> str:
        argv = plan.ranks[-1].argv
        return argv[argv.index("--prefill-chunk") + 1]

    assert chunk(build_plan(load_settings(root, BASE), HOST)) == "128"
    assert chunk(build_plan(load_settings(root, BASE), SPARK)) == "2048"
    assert chunk(build_plan(load_settings(root, {**BASE, "PREFILL_CHUNK": "512"}), SPARK)) == "512"
    assert chunk(build_plan(load_settings(root, {**BASE, "PREFILL_CHUNK": "64"}), HOST)) == "64"
