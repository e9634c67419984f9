"""Serving across namespaced nodes with RUNTIME=process: the head's `./start.sh` copies the checkpoint to the
worker, starts rank 1 there over ssh and rank 0 here; the real `openai` client chats from inside the head's
namespace; `./stop.sh` stops both and brings the worker's log home; a killed worker rank ends rank 0 (peer watch)
and `sparks status` names it; a rank that exits while loading takes the other down with it.

The worker runs the engine from this checkout's .venv at the same path: the namespaces share one filesystem, so
that path exists there. (On real Sparks the Docker runtime carries the environment; RUNTIME=process across
machines needs the same interpreter path on each.) The checkpoint, logs and run folder are each node's own.
"""

from __future__ import annotations

import json
import os
import re
import signal
import time
from pathlib import Path

import pytest
from headcli import CHAT, PYTHON, REPO, SPARKS, demo_on_head, engines, run_on_head, start_with_a_refusing_worker
from runs import RUN

START_TIMEOUT_S = 420


@pytest.fixture(scope="module")
def serving(bed):
    """The settings of a TP=2 process run across head and w1, with the trained demo checkpoint on the head only."""
    env = bed.environ(
        COLUMNS="200", RUNTIME="process", TP="2", CHECKPOINT=demo_on_head(bed), WAIT_TIMEOUT="300", STOP_TIMEOUT="15"
    )
    yield env
    bed.on_head([str(REPO / "stop.sh")], env, timeout_s=120)  # whatever happened, leave no rank anywhere


def state(bed) -> list[dict]:
    path = bed.path_on("head", f"logs/{RUN}/state.json")
    return json.loads(path.read_text())["ranks"] if path.is_file() else []


def ticks(pid: int) -> int | None:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return None if fields[0] == "Z" else int(fields[19])


def netns_of(pid: int) -> str:
    return os.readlink(f"/proc/{pid}/ns/net")


def test_start_chat_stop_across_two_nodes(bed, serving) -> None:
    w1 = f"root@{bed.nodes['w1'].address}"
    started = time.monotonic()
    done = run_on_head(bed, [str(REPO / "start.sh")], serving, timeout_s=START_TIMEOUT_S)
    print(f"[cold TP=2 start on the test bed: {time.monotonic() - started:.1f}s wall]")
    assert done.returncode == 0 and "is LIVE" in done.stdout, done.stdout + done.stderr
    assert f"{w1}: copied" in done.stdout  # the worker lacked the checkpoint
    assert re.search(r"Started in [0-9.]+s \(checks .*smoke [0-9.]+s\)", done.stdout)
    ranks = {r["rank"]: r for r in state(bed)}
    assert ranks[1]["node"] == w1 and ranks[0]["node"] == "local"
    # Rank 1 really runs inside w1's namespace (started by w1's sshd), rank 0 inside the head's.
    assert netns_of(ranks[1]["pid"]) == netns_of(bed.nodes["w1"].pids["sshd"])
    assert netns_of(ranks[1]["pid"]) != netns_of(ranks[0]["pid"])
    assert (bed.path_on("w1", "data/demo") / "model.safetensors").is_file() or any(
        bed.path_on("w1", "data/demo").glob("*.safetensors")
    )

    chat = run_on_head(bed, [PYTHON, "-c", CHAT], serving)
    assert chat.returncode == 0 and "REPLY" in chat.stdout, chat.stdout + chat.stderr
    assert all(ticks(r["pid"]) == r["start_ticks"] for r in ranks.values())  # the reply needed both

    status = run_on_head(bed, [SPARKS, "status"], serving)
    assert status.returncode == 0 and w1 in status.stdout and "running" in status.stdout

    stopped = run_on_head(bed, [str(REPO / "stop.sh")], serving)
    assert stopped.returncode == 0 and f"rank 1 on {w1}" in stopped.stdout and "Stopped every rank." in stopped.stdout
    assert engines(bed) == [], "an engine process outlived ./stop.sh"
    saved = sorted(bed.path_on("head", "logs").glob("*-rank1.log.gz"))
    assert saved, "the worker's log was not brought to the head"
    assert not bed.path_on("w1", f"logs/{RUN}/rank1.log").exists()


def test_killed_worker_rank_ends_rank_0_and_status_names_it(bed, serving) -> None:
    w1 = f"root@{bed.nodes['w1'].address}"
    done = run_on_head(bed, [SPARKS, "start"], serving, timeout_s=START_TIMEOUT_S)
    assert done.returncode == 0 and "is LIVE" in done.stdout, done.stdout + done.stderr
    ranks = {r["rank"]: r for r in state(bed)}
    assert ticks(ranks[1]["pid"]) == ranks[1]["start_ticks"]
    os.kill(ranks[1]["pid"], signal.SIGKILL)  # the rank this test bed's start made, checked by start time

    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and ticks(ranks[0]["pid"]) == ranks[0]["start_ticks"]:
        time.sleep(0.5)
    assert ticks(ranks[0]["pid"]) != ranks[0]["start_ticks"], "rank 0 kept running after its peer died"
    status = run_on_head(bed, [SPARKS, "status"], serving)
    assert status.returncode == 3
    assert f"rank 1 on {w1} (pid {ranks[1]['pid']}) has exited" in status.stdout

    stopped = run_on_head(bed, [str(REPO / "stop.sh")], serving)
    assert stopped.returncode == 0 and engines(bed) == []
    rank0_log = sorted(bed.path_on("head", "logs").glob("*-rank0.log.gz"))[-1]
    import gzip

    assert b"the engine stopped: a rank stopped answering" in gzip.decompress(rank0_log.read_bytes())


def test_rank_exiting_while_loading_stops_every_rank(bed, serving) -> None:
    # The worker's config.json is changed in place at the same size: the file lists agree, so start does not copy,
    # and rank 1 refuses to join with different settings. Start must print both ranks' last lines and stop rank 0.
    start_with_a_refusing_worker(bed, serving, START_TIMEOUT_S)
    assert engines(bed) == [] and state(bed) == []


def test_three_nodes_with_start_tp3(bed, serving) -> None:
    w1, w2 = (f"root@{bed.nodes[n].address}" for n in ("w1", "w2"))
    env = {**serving, "WORKER2": w2}
    env.pop("TP")  # ./start-tp3.sh sets it
    done = run_on_head(bed, [str(REPO / "start-tp3.sh")], env, timeout_s=START_TIMEOUT_S)
    assert done.returncode == 0 and "is LIVE" in done.stdout, done.stdout + done.stderr
    ranks = {r["rank"]: r for r in state(bed)}
    assert [ranks[i]["node"] for i in (0, 1, 2)] == ["local", w1, w2]
    assert netns_of(ranks[2]["pid"]) == netns_of(bed.nodes["w2"].pids["sshd"])

    chat = run_on_head(bed, [PYTHON, "-c", CHAT], env)
    assert chat.returncode == 0 and "REPLY" in chat.stdout, chat.stdout + chat.stderr
    assert all(ticks(r["pid"]) == r["start_ticks"] for r in ranks.values())

    stopped = run_on_head(bed, [str(REPO / "stop.sh")], env)
    assert stopped.returncode == 0 and engines(bed) == []
    assert f"rank 1 on {w1} (pid {ranks[1]['pid']}): stopped" in stopped.stdout
    assert f"rank 2 on {w2} (pid {ranks[2]['pid']}): stopped" in stopped.stdout
