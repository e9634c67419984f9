"""A rank that stops answering is seen within seconds, and the run ends within --peer-timeout-s (issue 13, 5).

The live tests freeze a real rank with SIGSTOP (what a hung machine looks like to its peers: the process exists, its
sockets stay open, nothing answers) on a 2-rank server over gloo."""

from __future__ import annotations

import datetime
import signal
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
import torch.distributed as dist
from test_api_live import LiveServer

from engine.checkpoint.demo import write_demo
from engine.peer_watch import PeerWatch

KEY = "watch-key"
HEADERS = {"Authorization": f"Bearer {KEY}"}
PEER_TIMEOUT_S = 8
FLAGS = [
    "--parallel",
    "2",
    "--context",
    "4096",
    "--max-tokens",
    "32",
    "--name",
    "demo",
    "--peer-timeout-s",
    str(PEER_TIMEOUT_S),
]


def _store() -> tuple[dist.TCPStore, int]:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    return dist.TCPStore("127.0.0.1", port, 2, True, datetime.timedelta(seconds=5), wait_for_workers=False), port


def test_silence_is_reported_then_lost_once_and_beats_bring_it_back() -> None:
    server, port = _store()
    lost: list[tuple[int, float]] = []
    rank0 = PeerWatch.connect(
        "127.0.0.1", port, 0, 2, on_lost=lambda r, s: lost.append((r, s)), silent_s=0.3, lost_s=0.8
    )
    rank1 = PeerWatch.connect("127.0.0.1", port, 1, 2, on_lost=lambda r, s: None, silent_s=0.3, lost_s=0.8)
    for _ in range(3):
        rank1.beat()
        rank0.beat()
    assert rank0.describe() is None
    time.sleep(0.4)
    rank0.beat()  # rank 1 has not beaten since
    assert rank0.describe() is not None and rank0.describe().startswith("rank 1 has not answered for")
    rank1.beat()
    rank0.beat()
    assert rank0.describe() is None  # it came back
    time.sleep(0.9)
    rank0.beat()
    rank0.check()
    rank0.check()
    assert len(lost) == 1 and lost[0][0] == 1 and lost[0][1] >= 0.8
    assert rank1.peers == [0] and rank0.peers == [1]
    del server


def _health(server: LiveServer) -> tuple[int, dict]:
    reply = httpx.get(server.url + "/health", timeout=5)
    return reply.status_code, reply.json()


def _until(check: Callable[[], bool], seconds: float) -> float:
    """Seconds until `check()` held (polling), or fail."""
    started = time.monotonic()
    while time.monotonic() - started < seconds:
        if check():
            return time.monotonic() - started
        time.sleep(0.1)
    raise AssertionError(f"not within {seconds} s")


@pytest.fixture()
def live(tmp_path: Path):
    checkpoint = tmp_path / "demo"
    write_demo(checkpoint, seed=0, size="tiny")
    server = LiveServer(checkpoint, tmp_path, FLAGS, key=KEY)
    yield server
    for proc in server.procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGCONT)
    server.stop()


@pytest.mark.slow
def test_a_frozen_worker_turns_health_503_within_seconds_and_ends_the_run(live: LiveServer) -> None:
    rank1, rank0 = live.procs
    assert _health(live)[0] == 200
    rank1.send_signal(signal.SIGSTOP)
    seen = _until(lambda: _health(live)[0] == 503, 5.0)
    status, body = _health(live)
    assert body["error"].startswith("rank 1 has not answered for"), body
    print(f"[peer watch] /health 503 {seen:.1f} s after SIGSTOP")
    rank1.send_signal(signal.SIGCONT)
    _until(lambda: _health(live)[0] == 200, 5.0)  # it answers again: so does /health

    replies: list[httpx.Response] = []
    rank1.send_signal(signal.SIGSTOP)
    stopped_at = time.monotonic()
    caller = threading.Thread(
        target=lambda: replies.append(
            httpx.post(
                live.url + "/v1/chat/completions",
                headers=HEADERS,
                timeout=60,
                json={"messages": [{"role": "user", "content": "Reply with OK."}], "max_tokens": 32},
            )
        )
    )
    caller.start()
    assert rank0.wait(PEER_TIMEOUT_S + 15) == 1
    ended = time.monotonic() - stopped_at
    caller.join(10)
    assert replies and replies[0].status_code == 503, replies
    message = replies[0].json()["error"]["message"]
    assert message.startswith("the engine stopped while this request ran: rank 1 stopped answering"), message
    print(f"[peer watch] rank 0 exited {ended:.1f} s after the worker froze (--peer-timeout-s {PEER_TIMEOUT_S})")
    assert ended < PEER_TIMEOUT_S + 14
    rank1.send_signal(signal.SIGCONT)  # thawed with rank 0 gone: it leaves by itself
    assert rank1.wait(PEER_TIMEOUT_S + 10) == 1
    assert "rank 1 has not answered" in live.logs[1].read_text() or "stopped answering" in live.logs[1].read_text()


@pytest.mark.slow
def test_a_frozen_rank0_ends_the_worker_within_the_peer_timeout(live: LiveServer) -> None:
    rank1, rank0 = live.procs
    rank0.send_signal(signal.SIGSTOP)
    frozen = time.monotonic()
    assert rank1.wait(PEER_TIMEOUT_S + 10) == 1
    print(f"[peer watch] rank 1 exited {time.monotonic() - frozen:.1f} s after rank 0 froze")
    assert "rank 0 has not answered for" in live.logs[0].read_text()
    rank0.send_signal(signal.SIGCONT)  # rank 0 finds its peer gone and ends too
    assert rank0.wait(PEER_TIMEOUT_S + 15) == 1
