"""`python -m engine quality` on the trained demo (CPU): the exact mode against itself is exact (KL 0, every top-1 and
every greedy token the same), a lossy mode (fp8 cache rows) shows a KL above zero, the JSON carries what the table
prints, and a mode that is not one is refused with the choices named."""

from __future__ import annotations

import argparse
import json

from engine import quality
from engine.checkpoint.demo import TRAINED


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    quality.add_arguments(parser)
    return parser.parse_args([str(TRAINED), *argv])


def test_quality_table_and_json(tmp_path, capsys):
    out = tmp_path / "q.json"
    args = parse("--tokens", "96", "--chunk", "32", "--continuation", "12", "--mode", "kv=fp32", "--mode", "kv=fp8")
    args.out = out
    assert quality.run(args) == 0
    result = json.loads(out.read_text())
    assert result["reference"] == "weights=fp32,dense=bf16,kv=fp32,kda=steps" and result["tokens"] == 96
    same, fp8 = result["modes"]
    assert same["mode"] == result["reference"]
    assert same["kl_mean"] == same["kl_p99"] == 0.0 and same["top1_agreement"] == 1.0 and same["greedy_same"] == 12
    assert 0.0 < fp8["kl_mean"] <= fp8["kl_p99"] and 0.5 < fp8["top1_agreement"] <= 1.0
    printed = capsys.readouterr().out
    assert "weights=fp32,dense=bf16,kv=fp8,kda=steps" in printed and "12 / 12" in printed


def test_a_mode_that_is_not_one_is_refused(capsys):
    assert quality.run(parse("--mode", "dense=int8")) == 2
    assert "dense=int8" in capsys.readouterr().out
