"""What the cluster serving tests share: the CLI and Python of this checkout, the chat a client sends from inside
the head's namespace, running a command on the head, the trained demo checkpoint on the head, and finding the
engine processes of this test bed."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PYTHON = str(REPO / ".venv" / "bin" / "python")
SPARKS = str(REPO / ".venv" / "bin" / "sparks")
CHAT = """
import pytest
from openai import OpenAI
client = OpenAI(base_url="http://127.0.0.1:8888/v1", api_key="unused", timeout=120, max_retries=0)
reply = client.chat.completions.create(model=client.models.list().data[0].id, max_tokens=24, temperature=0,
    messages=[{"role": "user", "content": "Reply with OK."}],
    extra_body={"chat_template_kwargs": {"enable_thinking": False}})
print("REPLY", repr(reply.choices[0].message.content), reply.usage.completion_tokens)
"""


def run_on_head(bed, argv: list[str], env: dict, timeout_s: float = 180) -> subprocess.CompletedProcess:
    """A command in the head's namespace, echoed with its output (pytest -s shows the CLI's own lines)."""
    done = bed.on_head(argv, env, timeout_s=timeout_s)
    print(
        f"$ {' '.join(Path(a).name if a.startswith('/') else a for a in argv[:2])} → {done.returncode}\n"
        f"{done.stdout}{done.stderr}"
    )
    return done


def demo_on_head(bed) -> str:
    """The trained demo checkpoint in the head's data folder (made once), as the nodes see its path."""
    demo = bed.path_on("head", "data/demo")
    if not (demo / "config.json").is_file():
        subprocess.run(
            [PYTHON, "-m", "engine", "make-demo", str(demo), "--size", "trained"],
            check=True,
            capture_output=True,
            timeout=180,
        )
    return str(bed.root / "node" / "data" / "demo")


def engines(bed) -> list[int]:
    """Engine processes in this test bed's nodes. Every process (containers' too) is visible in /proc from here;
    other sessions' are told apart by their network namespace."""
    ours = {os.stat(f"/run/netns/{node.netns}").st_ino for node in bed.nodes.values()}
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            text = cmdline.read_bytes()
            netns = os.stat(cmdline.parent / "ns" / "net").st_ino
        except OSError:
            continue
        if netns in ours and b"engine" in text and b"serve" in text:
            found.append(int(cmdline.parent.name))
    return found


def start_with_a_refusing_worker(bed, env: dict, timeout_s: float) -> subprocess.CompletedProcess:
    """`sparks start` with worker w1's config.json changed in place at the same size: the file lists agree, so start
    does not copy it, and rank 1 refuses to join with different settings (restored afterwards). Checks that start
    failed naming both ranks and stopped every one; skips without the worker's copy from an earlier test."""
    config = bed.path_on("w1", "data/demo/config.json")
    if not config.is_file():
        pytest.skip("needs the worker's copy from the first test")
    original = config.read_bytes()
    config.write_bytes(original.replace(b"{", b"[", 1) if b"{" in original else original[::-1])
    try:
        done = run_on_head(bed, [SPARKS, "start"], env, timeout_s=timeout_s)
    finally:
        config.write_bytes(original)
    assert done.returncode != 0
    assert "exited before the server was ready" in done.stderr
    assert "rank 0 here" in done.stderr and f"rank 1 on root@{bed.nodes['w1'].address}" in done.stderr
    assert "every rank was stopped" in done.stderr
    return done
