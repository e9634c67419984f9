"""The launcher's pieces that need no docker daemon: the plan's placeholders filled per node, docker's own reason
picked out of its output, and the refit: rank 0's real refusal (the engine's `size_pool`) read back by the recipe,
then a whole start on this machine that refits once and serves the window that fits."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from runs import local_env, run_dir, run_script

from recipe.launch.docker import NodeReady, docker_error, for_node
from recipe.launch.launch import fitting_window
from recipe.net.nodes import Result
from recipe.plan.host import HostFacts
from recipe.plan.plan import build_plan
from recipe.settings import load_settings

SPARK = HostFacts(python="python3", gpu=True, cpu_count=20, rdma=True)


def test_placeholders_are_filled_per_node(root: Path) -> None:
    env = {"TP": "2", "RUNTIME": "docker", "WORKER": "me@spark2", "CACHE_DIR": "/srv/c", "LOG_DIR": "/srv/l"}
    rank1 = build_plan(load_settings(root, env), SPARK).ranks[0]
    argv = for_node(rank1, NodeReady(image_id="0123456789ab", user="1000:1000", leftovers=()))
    assert argv[argv.index("--user") + 1] == "1000:1000"
    assert "/srv/c/kernels/0123456789ab:/cache" in argv
    assert not any("<image id>" in word or "<uid:gid>" in word for word in argv)
    assert rank1.argv[rank1.argv.index("--user") + 1] == "<uid:gid>"  # the plan itself is left as it was


def test_docker_error_is_dockers_reason_not_its_help_hint() -> None:
    stderr = (
        'docker: Error response from daemon: Conflict. The container name "/glm-sparks-rank1" is already in '
        "use.\nSee 'docker run --help'.\n"
    )
    assert docker_error(Result("w", (), 125, "", stderr)).startswith("Error response from daemon: Conflict.")
    assert (
        docker_error(Result("w", (), 255, "", "ssh: connect to host w port 22: Connection refused\n"))
        == "ssh: connect to host w port 22: Connection refused"
    )


def test_the_engines_refusal_names_the_window_the_recipe_restarts_with(capsys: pytest.CaptureFixture) -> None:
    from engine.config import EXIT_WINDOW, EngineConfig
    from engine.parallel import ParallelGroup
    from engine.serve import size_pool

    cfg = EngineConfig("unused", memory_reserve_gib=0.0, kv_pool_gib=1 / 1024, context=65536, parallel=2)
    with pytest.raises(SystemExit) as stop:
        size_pool(cfg, 128, "cpu", ParallelGroup.single())  # 1 MiB at 128 bytes a token: 8192 tokens
    assert stop.value.code == EXIT_WINDOW
    refusal = capsys.readouterr().err.strip().splitlines()
    assert fitting_window({"rank 0 here (glm-sparks-rank0)": ["loading: done", *refusal]}) == 8192
    assert fitting_window({"rank 1 on w (x)": refusal}) is None  # rank 0's word counts, not a peer's
    assert fitting_window({"rank 0 here (x)": ["loading: done"]}) is None


@pytest.mark.slow
def test_start_refits_once_to_the_window_that_fits(tmp_path: Path) -> None:
    env = local_env(
        tmp_path,
        TP="1",
        CONTEXT="8192",
        MAX_TOKENS="256",
        KV_POOL_GIB="0.0002",
        WAIT_TIMEOUT="600",
        STOP_TIMEOUT="20",
    )  # ~210 KiB: ~1600 tokens

    def wrapper(script: str) -> subprocess.CompletedProcess:
        return run_script(env, script)

    try:
        done = wrapper("start.sh")
        assert done.returncode == 0 and "is LIVE" in done.stdout, done.stdout + done.stderr
        refit = [line for line in done.stderr.splitlines() if "starting again with --context" in line]
        assert len(refit) == 1, done.stderr
        fits = int(refit[0].rsplit("--context", 1)[1].split()[0])
        assert 0 < fits < 8192 and f"{fits} tokens" in done.stdout  # the banner shows the window it serves
        ranks = json.loads((run_dir(tmp_path / "logs") / "state.json").read_text())["ranks"]
        assert len(ranks) == 1
    finally:
        stopped = wrapper("stop.sh")
    assert stopped.returncode == 0
    assert len(list((tmp_path / "logs").glob("*-rank0.log.gz"))) == 2  # the refused run's log is kept too


def test_docker_args_go_before_the_image(root: Path) -> None:
    env = {
        "TP": "2",
        "RUNTIME": "docker",
        "WORKER": "me@spark2",
        "IMAGE": "engine:1",
        "DOCKER_ARGS": "-v '/data sets:/data:ro' -e NCCL_DEBUG=INFO",
    }
    for rank in build_plan(load_settings(root, env), SPARK).ranks:
        at = rank.argv.index("engine:1")
        assert rank.argv[at - 4 : at] == ("-v", "/data sets:/data:ro", "-e", "NCCL_DEBUG=INFO")
