"""RUNTIME=docker across namespaced nodes, each with its own sshd and dockerd: `./start.sh` runs one container per
rank (rank 1 on w1 over ssh, rank 0 on the head), the real `openai` client chats through both, `./stop.sh` saves
every rank's log on the head and leaves no container or engine process on any node. Then: a killed worker container
ends rank 0 (peer watch) and `sparks status` names it; a rank that exits while loading takes every rank down with
its last log lines; an unreachable worker is refused before anything is stopped; `./start-tp3.sh` on three nodes
(with a window too large for its memory: rank 0 names what fits and the start goes again with it, once).

No GPU or /dev/infiniband exist here, so the plan has no --gpus/--device flags (host facts decide; the same plan
gets them on a Spark). The image is the recipe's own: the test bed's Python base (tests/cluster/images.py) is loaded
into the head's dockerd only, and the first start builds the engine image on the head and ships it to the workers
(`docker save | ssh | docker load`), as on Sparks.
"""

from __future__ import annotations

import gzip
import json
import os
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest
from headcli import CHAT, PYTHON, REPO, SPARKS, demo_on_head, engines, run_on_head, start_with_a_refusing_worker
from runs import RUN

START_TIMEOUT_S = 480


def on_node(bed, name: str, script: str, timeout_s: float = 300) -> subprocess.CompletedProcess:
    """A shell line on a node: the head's own, or a worker's over ssh from the head (never from here)."""
    if name == "head":
        return bed.on_head(["sh", "-c", script], os.environ.copy(), timeout_s=timeout_s)
    return bed.on_head(
        [str(bed.root / "bin" / "ssh"), f"root@{bed.nodes[name].address}", script],
        os.environ.copy(),
        timeout_s=timeout_s,
    )


def containers(bed, name: str) -> list[str]:
    done = on_node(bed, name, "docker ps -a --format '{{.Names}} {{.State}}'")
    assert done.returncode == 0, done.stderr
    return done.stdout.split("\n")[:-1]


def state(bed) -> dict[int, dict]:
    path = bed.path_on("head", f"logs/{RUN}/state.json")
    return {r["rank"]: r for r in json.loads(path.read_text())["ranks"]} if path.is_file() else {}


def assert_nothing_left(bed) -> None:
    for name in bed.nodes:
        assert containers(bed, name) == [], f"a container was left on {name}"
    assert engines(bed) == [], "an engine process outlived ./stop.sh"


@pytest.fixture(scope="module")
def docker_env(bed):
    from images import BaseImageUnavailable, image_settings

    try:
        started = time.monotonic()
        base = image_settings(bed)
        print(f"[docker] base image {base['BASE_IMAGE']} on the head in {time.monotonic() - started:.1f}s")
    except BaseImageUnavailable as why:
        pytest.skip(f"test bed base image: {why}")
    env = bed.environ(
        COLUMNS="200",
        RUNTIME="docker",
        TP="2",
        CHECKPOINT=demo_on_head(bed),
        CONTEXT="8192",
        MAX_TOKENS="1024",
        KV_POOL_GIB="1",
        PARALLEL="4",
        WAIT_TIMEOUT="300",
        STOP_TIMEOUT="15",
        **base,
    )
    yield env
    bed.on_head([str(REPO / "stop.sh")], env, timeout_s=180)  # whatever happened, leave no container anywhere


def test_docker_start_chat_stop_across_two_nodes(bed, docker_env) -> None:
    w1 = f"root@{bed.nodes['w1'].address}"
    started = time.monotonic()
    done = run_on_head(bed, [str(REPO / "start.sh")], docker_env, timeout_s=START_TIMEOUT_S)
    print(f"[cold TP=2 docker start on the test bed: {time.monotonic() - started:.1f}s wall]")
    assert done.returncode == 0 and "is LIVE" in done.stdout, done.stdout + done.stderr
    summary = [line for line in done.stdout.splitlines() if "Started in" in line]
    assert summary, done.stdout
    print(f"[docker TP=2 start, by step] {summary[0].strip()}")
    ranks = state(bed)
    assert ranks[1]["node"] == w1 and ranks[0]["node"] == "local"
    assert all(len(r["container"]) == 64 for r in ranks.values())
    assert containers(bed, "head") == ["glm-sparks-rank0 running"]
    assert containers(bed, "w1") == ["glm-sparks-rank1 running"]
    assert len(engines(bed)) >= 2  # what assert_nothing_left looks for, seen running
    kernels = list(bed.path_on("w1", "cache/kernels").iterdir())
    assert len(kernels) == 1 and len(kernels[0].name) == 12  # one kernel cache, named by the image

    chat = run_on_head(bed, [PYTHON, "-c", CHAT], docker_env)
    assert chat.returncode == 0 and "REPLY" in chat.stdout, chat.stdout + chat.stderr

    status = run_on_head(bed, [SPARKS, "status"], docker_env)
    assert status.returncode == 0 and w1 in status.stdout and status.stdout.count("running") >= 2

    stopped = run_on_head(bed, [str(REPO / "stop.sh")], docker_env)
    assert stopped.returncode == 0 and "Stopped every rank." in stopped.stdout
    assert f"rank 1 on {w1} (container {ranks[1]['container'][:12]}): stopped" in stopped.stdout
    assert_nothing_left(bed)
    rank1_log = sorted(bed.path_on("head", "logs").glob("*-rank1.log.gz"))[-1]
    assert b"following rank 0" in gzip.decompress(rank1_log.read_bytes())  # the worker's log, brought home


def test_killed_worker_container_ends_rank_0_and_status_names_it(bed, docker_env) -> None:
    w1 = f"root@{bed.nodes['w1'].address}"
    # A container an interrupted run left under rank 1's name: start saves its log, then removes it.
    left = on_node(bed, "w1", "docker run --name glm-sparks-rank1 glm-sparks-engine:0.1 echo crash evidence")
    assert left.returncode == 0, left.stderr
    done = run_on_head(bed, [SPARKS, "start"], docker_env, timeout_s=START_TIMEOUT_S)
    assert done.returncode == 0 and "is LIVE" in done.stdout, done.stdout + done.stderr
    assert f"Removed the previous container glm-sparks-rank1 on {w1}" in done.stdout
    evidence = sorted(bed.path_on("head", "logs").glob("*-rank1.log.gz"))[-1]
    assert gzip.decompress(evidence.read_bytes()) == b"crash evidence\n"
    assert on_node(bed, "w1", "docker kill glm-sparks-rank1").returncode == 0
    killed = time.monotonic()
    deadline = killed + 60
    while time.monotonic() < deadline and "glm-sparks-rank0 running" in containers(bed, "head"):
        time.sleep(1)
    assert "glm-sparks-rank0 exited" in containers(bed, "head"), "rank 0 kept running after its peer died"
    print(f"[peer watch] rank 0's container exited {time.monotonic() - killed:.1f}s after rank 1's was killed")
    status = run_on_head(bed, [SPARKS, "status"], docker_env)
    rank1 = state(bed)[1]["container"][:12]
    assert status.returncode == 3 and f"rank 1 on {w1} (container {rank1}) has exited" in status.stdout

    stopped = run_on_head(bed, [str(REPO / "stop.sh")], docker_env)
    assert stopped.returncode == 0
    assert_nothing_left(bed)
    rank0_log = sorted(bed.path_on("head", "logs").glob("*-rank0.log.gz"))[-1]
    assert b"the engine stopped: a rank stopped answering" in gzip.decompress(rank0_log.read_bytes())


def test_partial_set_is_stopped_then_started(bed, docker_env) -> None:
    # Rank 0 frozen (SIGSTOP: its container still runs, it cannot notice anything), then rank 1 killed: a partial
    # set that peer watch cannot end. Start must stop what runs (rank 0, killed after STOP_TIMEOUT), then start all.
    env = {**docker_env, "STOP_TIMEOUT": "3"}
    done = run_on_head(bed, [SPARKS, "start"], env, timeout_s=START_TIMEOUT_S)
    assert done.returncode == 0 and "is LIVE" in done.stdout, done.stdout + done.stderr
    head_netns = os.stat(f"/run/netns/{bed.nodes['head'].netns}").st_ino
    rank0 = [
        p
        for p in engines(bed)
        if os.stat(f"/proc/{p}/ns/net").st_ino == head_netns
        and b"docker-init" not in Path(f"/proc/{p}/cmdline").read_bytes()
    ]
    assert len(rank0) == 1
    os.kill(rank0[0], signal.SIGSTOP)  # an engine process this test bed's dockerd started
    assert on_node(bed, "w1", "docker kill glm-sparks-rank1").returncode == 0
    status = run_on_head(bed, [SPARKS, "status"], env)
    assert status.returncode == 3 and "has exited" in status.stdout and "running" in status.stdout

    again = run_on_head(bed, [SPARKS, "start"], env, timeout_s=START_TIMEOUT_S)
    assert again.returncode == 0 and "is LIVE" in again.stdout, again.stdout + again.stderr
    assert "only some ranks of the last run are running: stopping them first" in again.stdout
    assert "rank 0: killed" in again.stdout  # frozen, it outlived STOP_TIMEOUT
    assert sorted(containers(bed, "head") + containers(bed, "w1")) == [
        "glm-sparks-rank0 running",
        "glm-sparks-rank1 running",
    ]
    stopped = run_on_head(bed, [str(REPO / "stop.sh")], env)
    assert stopped.returncode == 0
    assert_nothing_left(bed)


def test_foreground_follows_rank_0_and_stops_every_rank_when_a_worker_dies(bed, docker_env) -> None:
    lines: list[str] = []
    cli = bed.on_head([SPARKS, "start"], {**docker_env, "FOREGROUND": "1"}, wait=False)
    reader = threading.Thread(target=lambda: lines.extend(cli.stdout), daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline and not any("ready: serving" in line for line in lines):
            assert cli.poll() is None, "".join(lines)
            time.sleep(0.5)
        assert any("ready: serving" in line for line in lines), "".join(lines)  # rank 0's own log, followed
        assert on_node(bed, "w1", "docker kill glm-sparks-rank1").returncode == 0
        code = cli.wait(timeout=120)
    finally:
        if cli.poll() is None:
            os.killpg(cli.pid, signal.SIGTERM)  # the session this test started
            cli.wait(timeout=60)
    reader.join(timeout=10)
    output = "".join(lines)
    print(output)
    assert code == 1 and "rank 0 exited with code 1: stopping the others" in output
    assert_nothing_left(bed)


def test_rank_exiting_while_loading_stops_every_container(bed, docker_env) -> None:
    # Same-size edit of the worker's config.json: start does not copy, rank 1 refuses to join, rank 0 is stopped.
    done = start_with_a_refusing_worker(bed, docker_env, START_TIMEOUT_S)
    assert "refused" in done.stderr  # the ranks' own last lines, read with docker logs
    assert state(bed) == {}
    assert_nothing_left(bed)


def test_unreachable_worker_is_refused_before_anything_stops(bed, docker_env) -> None:
    done = run_on_head(bed, [SPARKS, "start"], docker_env, timeout_s=START_TIMEOUT_S)
    assert done.returncode == 0 and "is LIVE" in done.stdout, done.stdout + done.stderr
    before = state(bed)
    # w1's sshd now refuses connections; the recipe's shared connection is closed so the next command must connect.
    rule = ["INPUT", "-p", "tcp", "--dport", "22", "-j", "REJECT", "--reject-with", "tcp-reset"]
    bed._close_ssh_masters()
    bed.in_node("w1", "iptables", "-A", *rule)
    try:
        restart = run_on_head(bed, [SPARKS, "restart"], docker_env, timeout_s=120)
        assert restart.returncode != 0 and "ssh" in restart.stderr
        assert containers(bed, "head") == ["glm-sparks-rank0 running"]  # nothing was stopped
        assert state(bed) == before
    finally:
        bed.in_node("w1", "iptables", "-D", *rule)
    assert containers(bed, "w1") == ["glm-sparks-rank1 running"]
    stopped = run_on_head(bed, [str(REPO / "stop.sh")], docker_env)
    assert stopped.returncode == 0
    assert_nothing_left(bed)


def test_three_nodes_with_start_tp3_and_a_refit_window(bed, docker_env) -> None:
    w1, w2 = (f"root@{bed.nodes[n].address}" for n in ("w1", "w2"))
    # 210 KiB of cache per rank (~256 bytes a token with MTP drafts) cannot hold an 8192-token window: rank 0 names
    # the largest that fits.
    env = {**docker_env, "WORKER2": w2, "KV_POOL_GIB": "0.0002"}
    env.pop("TP")  # ./start-tp3.sh sets it
    done = run_on_head(bed, [str(REPO / "start-tp3.sh")], env, timeout_s=START_TIMEOUT_S)
    assert done.returncode == 0 and "is LIVE" in done.stdout, done.stdout + done.stderr
    assert "starting again with --context" in done.stdout + done.stderr
    ranks = state(bed)
    assert [ranks[i]["node"] for i in (0, 1, 2)] == ["local", w1, w2]
    assert containers(bed, "w2") == ["glm-sparks-rank2 running"]

    chat = run_on_head(bed, [PYTHON, "-c", CHAT], env)
    assert chat.returncode == 0 and "REPLY" in chat.stdout, chat.stdout + chat.stderr

    stopped = run_on_head(bed, [str(REPO / "stop.sh")], env)
    assert stopped.returncode == 0
    assert f"rank 2 on {w2} (container {ranks[2]['container'][:12]}): stopped" in stopped.stdout
    assert_nothing_left(bed)
