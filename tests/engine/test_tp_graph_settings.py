"""Ranks must agree on CUDA graphs (with TP the graphs hold the collectives: one rank replaying while another steps
eagerly would deadlock), so --cuda-graphs is part of the settings every rank compares before loading."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from test_api_live import ROOT, free_port

from engine.checkpoint.demo import write_demo

pytestmark = pytest.mark.slow


def test_ranks_with_different_cuda_graphs_refuse_to_start(tmp_path: Path) -> None:
    write_demo(tmp_path, seed=0, size="tiny")
    master = f"127.0.0.1:{free_port()}"
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "engine",
                "serve",
                str(tmp_path),
                "--port",
                str(free_port()),
                "--tp",
                "2",
                "--rank",
                str(rank),
                "--master",
                master,
                "--cuda-graphs",
                graphs,
            ],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for rank, graphs in ((1, "0"), (0, "1"))
    ]
    try:
        outs = [p.communicate(timeout=120)[0] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(timeout=10)
    for proc, out in zip(procs, outs):
        assert proc.returncode == 3, out
        assert "cuda_graphs: rank 0=True, rank 1=False" in out and "loading:" not in out
