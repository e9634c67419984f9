"""The sh scripts a worker runs (start a rank detached, stop ranks by PID + start time, bring the log home), run
here through a LocalNode: the same commands ssh hands a worker's shell. The cluster tests run them over real ssh."""

from __future__ import annotations

import gzip
import sys
from pathlib import Path

from recipe.launch import remote
from recipe.launch.runstate import RankProcess, is_alive, ranks_alive
from recipe.net.nodes import LocalNode
from recipe.plan.parts import RankPlan

STUBBORN = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('up', flush=True); time.sleep(60)"
POLITE = "import time; print('up', flush=True); time.sleep(60)"


def rank(tmp_path: Path, number: int, code: str) -> RankPlan:
    return RankPlan(
        rank=number,
        node="local",
        runtime="process",
        argv=(sys.executable, "-c", code),
        env={"RANK_NOTE": f"rank {number}"},
        log=str(tmp_path / "run" / f"rank{number}.log"),
    )


def test_spawn_records_pid_and_start_time_then_stop_terms_kills_and_fetches(tmp_path: Path) -> None:
    node = LocalNode()
    polite = remote.spawn(node, rank(tmp_path, 1, POLITE))
    stubborn = remote.spawn(node, rank(tmp_path, 2, STUBBORN))
    assert is_alive(polite.pid, polite.start_ticks) and is_alive(stubborn.pid, stubborn.start_ticks)
    assert ranks_alive([polite, stubborn]) == {1: True, 2: True}

    stale = RankProcess(3, polite.pid, polite.start_ticks + 1, str(tmp_path / "run" / "rank3.log"))  # a reused PID
    stops = remote.stop_ranks(node, [polite, stubborn, stale], 1, tmp_path / "logs", keep=5)
    assert [(s.rank, s.outcome) for s in stops] == [(1, "stopped"), (2, "killed"), (3, "was not running")]
    assert not is_alive(polite.pid, polite.start_ticks) and not is_alive(stubborn.pid, stubborn.start_ticks)
    assert gzip.decompress(stops[0].saved_log.read_bytes()) == b"up\n"
    assert not Path(polite.log).exists()  # removed on the node once it is home


def test_a_rank_that_cannot_start_is_reported_with_a_fix(tmp_path: Path) -> None:
    broken = RankPlan(
        rank=1,
        node="local",
        runtime="process",
        argv=("/nonexistent/python", "-m", "engine", "serve"),
        env={},
        log=str(tmp_path / "run" / "rank1.log"),
    )
    try:
        remote.spawn(LocalNode(), broken)
    except remote.RemoteError as error:
        assert "could not start rank 1" in error.message and "by hand" in error.fix
    else:
        raise AssertionError("a rank whose interpreter does not exist was reported as started")
