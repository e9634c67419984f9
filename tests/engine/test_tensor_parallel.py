"""TP=2 and TP=3 as real gloo processes: same greedy tokens as TP=1, and every rank holds identical logits, on the
plain path and on the serving path's static decode step (eager on the CPU; the step CUDA graphs capture on GPUs)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from ports import free_port  # tests/ is on sys.path (tests/conftest.py)
from reference import make_reference

WORKER = Path(__file__).with_name("tp_worker.py")
ROOT = Path(__file__).resolve().parents[2]


def run_ranks(
    checkpoint: Path, world: int, out_dir: Path, device: str = "cpu", timeout_s: float = 180, dense: str = "bf16"
) -> list[dict]:
    """Run `world` tp_worker.py ranks to the end (`dense`: the DENSE mode they load with). A rank still running after `timeout_s` gets SIGABRT first, so its
    Python stacks (faulthandler, every thread) land in the captured stderr and show where it waits."""
    port = free_port()
    env = dict(os.environ, PYTHONPATH=f"{ROOT}:{ROOT / 'tests' / 'engine'}")
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-X",
                "faulthandler",
                str(WORKER),
                str(checkpoint),
                str(world),
                str(r),
                str(port),
                str(out_dir / f"tp{world}-rank{r}.pt"),
                device,
                dense,
            ],
            env=env,
        )
        for r in range(world)
    ]
    deadline = time.monotonic() + timeout_s
    try:
        for p in procs:
            try:
                p.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        stuck = [r for r, p in enumerate(procs) if p.poll() is None]
        for r in stuck:
            procs[r].send_signal(signal.SIGABRT)
            try:
                procs[r].wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    assert not stuck, f"ranks {stuck} of {world} did not exit within {timeout_s:.0f} s (their stacks are in stderr)"
    assert [p.returncode for p in procs] == [0] * world
    return [torch.load(out_dir / f"tp{world}-rank{r}.pt") for r in range(world)]


def assert_nccl_tp2_equals_cpu(checkpoint: Path, out_dir: Path) -> None:
    """Two ranks over NCCL (one GPU each) give the single CPU rank's greedy tokens, and identical logits on both
    ranks (tests/gpu: the bf16 and EXL3 checkpoints)."""
    ranks = run_ranks(checkpoint, 2, out_dir, device="cuda")
    cpu = run_ranks(checkpoint, 1, out_dir)[0]
    for r in ranks:
        assert r["tokens"] == cpu["tokens"]
    assert torch.equal(ranks[0]["logits"], ranks[1]["logits"])


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("tp")
    make_reference(path, "kda3_dsa1", seed=2)  # 6 heads, widths divisible by 2 and 3; vocab 97 splits unevenly
    return path


@pytest.fixture(scope="module")
def single(checkpoint, tmp_path_factory) -> dict:
    return run_ranks(checkpoint, 1, tmp_path_factory.mktemp("tp1"))[0]


@pytest.fixture(scope="module", params=[2, 3], ids=["tp2", "tp3"])
def ranks(request, checkpoint, tmp_path_factory) -> list[dict]:
    """One real run per group size, shared by the tests below (each rank: plain path, static step, agreements)."""
    return run_ranks(checkpoint, request.param, tmp_path_factory.mktemp(f"tp{request.param}"))


def test_tp_matches_single_rank(single, ranks):
    for r in ranks:
        assert r["tokens"] == single["tokens"]
        assert (r["logits"] - single["logits"]).abs().max() < 1e-4
    for r in ranks[1:]:
        assert torch.equal(r["logits"], ranks[0]["logits"]), "ranks must hold bit-identical logits"


def test_tp_static_step_matches_single_rank_decode(single, ranks):
    """The lanes' static step at TP=world (padded spans, lanes 2 and 0) gives TP=1 `model.decode`'s greedy tokens
    and logits; ranks bit-identical; no host read in the step, collectives included; graphs off on the CPU."""
    for r in ranks:
        assert not r["uses_graphs"]
        assert r["lane_tokens"] == single["tokens"]
        assert (r["lane_logits"] - single["logits"]).abs().max() < 1e-4
        assert r["host_reads"] == [], "the TP static step reads a device value on the host (breaks a capture)"
    for r in ranks[1:]:
        assert torch.equal(r["lane_logits"], ranks[0]["lane_logits"]), "ranks must hold bit-identical logits"
    assert single["lane_tokens"] == single["tokens"] and single["host_reads"] == []


def test_all_agree_is_false_everywhere_when_one_rank_says_no(ranks):
    """The agreement behind the lock-step fallback from CUDA graphs: one rank's failure is every rank's."""
    assert [r["agree"] for r in ranks] == [[True, False]] * len(ranks)
