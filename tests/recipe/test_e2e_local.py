"""End to end on this machine, through the README's wrappers and the real engine: a fresh ./start.sh reaches LIVE,
the openai client chats through both ranks, ./start.sh again changes nothing, ./start.sh restart starts new
ranks, ./stop.sh leaves no process behind."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest
from runs import local_env, run_dir, run_script

from recipe.launch.runstate import is_alive
from recipe.net.ports import port_is_free
from recipe.settings import REPO_ROOT

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        not (REPO_ROOT / "engine" / "serve.py").is_file(),
        reason="engine/serve.py (`python -m engine serve`) has not landed yet",
    ),
]
STEP_TIMEOUT_S = 900


def wrapper(script: str, env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    return run_script(env, script, *args, timeout=STEP_TIMEOUT_S)


def recorded(log_dir: Path) -> list[tuple[int, int]]:
    path = run_dir(log_dir) / "state.json"
    if not path.is_file():
        return []
    return [(r["pid"], r["start_ticks"]) for r in json.loads(path.read_text())["ranks"]]


def processes_mentioning(text: str) -> list[int]:
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if text.encode() in cmdline.read_bytes():
                found.append(int(cmdline.parent.name))
        except OSError:
            continue
    return found


@pytest.fixture
def local_run(tmp_path: Path):
    env = local_env(tmp_path, WAIT_TIMEOUT="600", STOP_TIMEOUT="20")
    yield env, tmp_path
    wrapper("stop.sh", env)  # whatever happened above, leave nothing running


def test_start_chat_noop_restart_stop(local_run) -> None:
    from openai import OpenAI

    env, tmp = local_run
    started = time.monotonic()
    first = wrapper("start.sh", env)
    cold_s = time.monotonic() - started
    assert first.returncode == 0 and "is LIVE" in first.stdout, first.stdout + first.stderr
    ranks = recorded(tmp / "logs")
    assert len(ranks) == 2 and all(is_alive(*r) for r in ranks)

    client = OpenAI(base_url=f"http://127.0.0.1:{env['PORT']}/v1", api_key="unused", timeout=300, max_retries=0)
    reply = client.chat.completions.create(
        model="GLM-5.3-Flash-demo",
        max_tokens=8,
        messages=[{"role": "user", "content": "Say something."}],
        extra_body={"chat_template_kwargs": {"enable_thinking": False}},
    )
    assert reply.choices[0].message.content and reply.usage.completion_tokens > 0
    assert all(is_alive(*r) for r in ranks)  # TP=2: the reply needed both ranks, and both still run

    again = wrapper("start.sh", env)
    assert again.returncode == 0 and "already running" in again.stdout and recorded(tmp / "logs") == ranks

    started = time.monotonic()
    restarted = wrapper("start.sh", env, "restart")
    warm_s = time.monotonic() - started
    assert restarted.returncode == 0 and "is LIVE" in restarted.stdout, restarted.stdout + restarted.stderr
    new_ranks = recorded(tmp / "logs")
    assert len(new_ranks) == 2 and new_ranks != ranks and not any(is_alive(*r) for r in ranks)

    stopped = wrapper("stop.sh", env)
    assert stopped.returncode == 0 and "Stopped every rank" in stopped.stdout, stopped.stdout + stopped.stderr
    assert not any(is_alive(*r) for r in new_ranks)
    assert processes_mentioning(str(tmp)) == []
    assert port_is_free(int(env["PORT"])) and port_is_free(int(env["MASTER_PORT"]))
    assert len(list((tmp / "logs").glob("*-rank*.log.gz"))) == 4  # two runs x two ranks, saved
    print(f"\nfresh start to LIVE: {cold_s:.1f}s (demo checkpoint made); restart to LIVE: {warm_s:.1f}s")
