"""Running Triton kernels on the CPU: Triton reads TRITON_INTERPRET when it is first imported, so a test file that
checks kernels runs itself as a script in a child process with it set, prints its figures as JSON on the last line,
and asserts on them (tests/engine/test_exl3_triton.py, test_fused_decode_triton.py)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def figures_of(script: str, timeout_s: float = 300) -> dict:
    """Run `script` (a test file's own path) under Triton's interpreter; the JSON its last line printed. Skips where
    Triton is not installed (./test.sh installs it on a CPU machine)."""
    if importlib.util.find_spec("triton") is None:
        pytest.skip("triton is not installed (scripts/bootstrap.sh adds it to the dev set-up on a CPU machine)")
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [sys.executable, script], env=env, cwd=ROOT, capture_output=True, text=True, timeout=timeout_s
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])
