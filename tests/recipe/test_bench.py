"""`sparks bench` against a real 2-rank server on the tiny demo checkpoint (CPU, gloo), plus the arithmetic of its
figures on made-up timings."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from recipe_helpers import SETTING_NAMES
from test_api_live import LiveServer, demo_server  # tests/engine is on sys.path (tests/conftest.py)
from typer.testing import CliRunner

from recipe.bench.bench import run_bench
from recipe.bench.client import RequestTiming
from recipe.bench.options import BenchOptions, api_url, parse_sizes
from recipe.bench.result import DecodeRow, DecodeRun
from recipe.cli import app
from recipe.errors import RecipeError

KEY = "bench-key-7"
TOKENS = 8
CONTEXT = 2048


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    yield from demo_server(tmp_path_factory, ["--parallel", "4", "--context", str(CONTEXT), "--name", "demo"], KEY)


@pytest.fixture(scope="module")
def report(server: LiveServer, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One tiny bench through the CLI; URL, model and key come from the settings, as on a real head node."""
    out = tmp_path_factory.mktemp("bench")
    config_root = tmp_path_factory.mktemp("config-root")
    env: dict[str, str | None] = {name: None for name in SETTING_NAMES}
    env.update(
        SPARKS_CONFIG_ROOT=str(config_root),
        HOST="0.0.0.0",
        PORT=server.url.rsplit(":", 1)[1],
        SERVED_NAME="demo",
        API_KEY=KEY,
    )
    result = CliRunner().invoke(
        app,
        [
            "bench",
            "--concurrency",
            "1,2",
            "--tokens",
            str(TOKENS),
            "--prompt-sizes",
            "64,256,4k",
            "--reuse-sizes",
            "512,4k",
            "--repeats",
            "1",
            "--json",
            str(out / "bench.json"),
            "--plot",
            str(out / "bench.png"),
        ],
        env=env,
    )
    assert result.exit_code == 0, result.output
    return {
        "output": result.output,
        "json_text": (out / "bench.json").read_text(),
        "data": json.loads((out / "bench.json").read_text()),
        "png": (out / "bench.png").read_bytes(),
    }


@pytest.mark.slow
def test_report_names_the_run_and_the_server(report: dict[str, Any], server: LiveServer) -> None:
    data = report["data"]
    assert data["schema"] == "sparks-bench/1" and data["model"] == "demo" and data["host"]
    assert data["url"] == server.url + "/v1"  # HOST=0.0.0.0 is reached over loopback
    assert datetime.fromisoformat(data["date"]).tzinfo is not None
    assert data["server"]["context_length"] == CONTEXT and data["server"]["streams"]["max"] == 4
    assert data["client"]["sparks"] and data["client"]["python"] and data["client"]["commit"]
    assert data["config"]["tokens"] == TOKENS and data["config"]["concurrency"] == [1, 2]
    assert KEY not in report["json_text"] and "api_key" not in data["config"]
    assert data["warnings"] == []
    assert data["skipped"] == [
        f"prefill 4096: over the server's window of {CONTEXT} tokens",
        f"reuse 4096: over the server's window of {CONTEXT} tokens",
    ]
    assert "Decode" in report["output"] and "Prefill" in report["output"] and "Prompt reuse" in report["output"]
    assert "skipped: prefill 4096" in report["output"]
    assert report["png"][:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.slow
def test_every_reply_has_the_requested_length_and_the_server_agrees(report: dict[str, Any]) -> None:
    data = report["data"]
    requests = [q for row in data["decode"] for run in row["runs"] for q in run["requests"]]
    assert len(requests) == 2 * (1 + 2)  # two kinds, at 1 and at 2 at once
    assert all(q["completion_tokens"] == TOKENS for q in requests)
    # every token the server generated during the bench went to the bench's own requests
    assert data["server_completion_tokens"] == data["client_completion_tokens"] > len(requests) * TOKENS


@pytest.mark.slow
def test_decode_figures_are_positive_and_consistent(report: dict[str, Any]) -> None:
    rows = {(row["kind"], row["concurrency"]): row for row in report["data"]["decode"]}
    assert set(rows) == {("prose", 1), ("prose", 2), ("structured", 1), ("structured", 2)}
    for (kind, n), row in rows.items():
        (run,) = row["runs"]
        assert len(run["requests"]) == n
        for q in run["requests"]:
            assert q["prompt_tokens"] > 0 and q["decode_tok_s"] > 0 and 0 < q["ttft_s"] <= q["total_s"]
        assert row["aggregate_tok_s"] > 0 and row["per_request_tok_s"] > 0 and row["ttft_s"] > 0
        if n == 1:
            assert row["aggregate_tok_s"] == pytest.approx(row["per_request_tok_s"], abs=0.02)
        else:  # two requests decoded together: more tokens a second in all than either gets alone
            assert row["aggregate_tok_s"] >= row["per_request_tok_s"], (kind, row)


@pytest.mark.slow
def test_prefill_sweep_hits_its_sizes(report: dict[str, Any]) -> None:
    prefill = report["data"]["prefill"]
    assert [row["target_tokens"] for row in prefill] == [64, 256]
    for row in prefill:
        assert row["prompt_tokens"] == pytest.approx(row["target_tokens"], rel=0.2)
        (run,) = row["runs"]
        assert run["completion_tokens"] == 1 and run["cached_tokens"] == 0
        assert row["prefill_tok_s"] == pytest.approx(run["prompt_tokens"] / run["ttft_s"], rel=0.01)


@pytest.mark.slow
def test_a_wrong_key_or_model_says_what_to_pass(server: LiveServer) -> None:
    options = BenchOptions(
        url=server.url + "/v1", model="demo", api_key="wrong", concurrency=(1,), tokens=2, prompt_sizes=(), repeats=1
    )
    with pytest.raises(RecipeError, match="HTTP 401") as error:
        run_bench(options)
    assert "--api-key" in error.value.fix
    with pytest.raises(RecipeError, match="not 'other'") as error:
        run_bench(BenchOptions(url=server.url + "/v1", model="other", api_key=KEY))
    assert error.value.fix == "pass --model demo"


def test_nothing_listening_is_named_with_the_fix(tmp_path: Path) -> None:
    from recipe_helpers import free_port

    url = f"http://127.0.0.1:{free_port()}/v1"
    with pytest.raises(RecipeError, match="no answer from") as error:
        run_bench(BenchOptions(url=url, model="demo", request_timeout_s=5))
    assert "--url" in error.value.fix


def test_aggregate_counts_the_tokens_of_every_request_over_their_common_span() -> None:
    # request A decodes 10 tokens after its first in 1 s, B the same in 2 s; both start at t=1
    a = RequestTiming(
        sent=0.0, first_token=1.0, last_token=2.0, done=2.0, prompt_tokens=5, completion_tokens=11, cached_tokens=0
    )
    b = RequestTiming(
        sent=0.0, first_token=1.0, last_token=3.0, done=3.0, prompt_tokens=5, completion_tokens=11, cached_tokens=0
    )
    run = DecodeRun((a, b))
    assert run.aggregate_tok_s == 10.0  # 20 tokens over 2 s
    assert run.end_to_end_tok_s == pytest.approx(22 / 3)
    row = DecodeRow("prose", 2, (run,))
    assert row.per_request_tok_s == 7.5 and row.ttft_s == 1.0  # medians of (10, 5) and (1, 1)


def test_sizes_and_urls_parse_as_written() -> None:
    assert parse_sizes("512, 2k,32K", "--prompt-sizes") == (512, 2048, 32768)
    with pytest.raises(RecipeError, match="--concurrency has 'two'"):
        parse_sizes("1,two", "--concurrency")
    assert api_url("", "0.0.0.0", 8888) == "http://127.0.0.1:8888/v1"
    assert api_url("", "10.0.0.5", 9000) == "http://10.0.0.5:9000/v1"
    assert api_url("http://spark:8888/", "0.0.0.0", 1) == "http://spark:8888/v1"
    assert api_url("http://spark:8888/v1", "0.0.0.0", 1) == "http://spark:8888/v1"
    with pytest.raises(RecipeError, match="--tokens"):
        BenchOptions(url="http://x/v1", model="m", tokens=1).check()


def test_plot_without_matplotlib_says_how_to_install_it(monkeypatch: pytest.MonkeyPatch) -> None:
    from recipe.bench.plot import require_matplotlib

    monkeypatch.setitem(sys.modules, "matplotlib", None)  # an import of it now fails
    with pytest.raises(RecipeError, match="needs matplotlib") as error:
        require_matplotlib()
    assert "[bench]" in error.value.fix


@pytest.mark.slow
def test_reuse_section_resends_and_shares_a_system_prompt(report: dict[str, Any]) -> None:
    """The server keeps prompt states (PROMPT_REUSE's default, prefill chunks of 128): a resent prompt resumes
    from its end (nothing prefilled), a new conversation under the same system prompt from the one before the user's
    message; the cold sends reuse nothing (each run's text is its own)."""
    rows = {row["kind"]: row for row in report["data"]["reuse"]}
    assert set(rows) == {"resent", "system"} and all(row["target_tokens"] == 512 for row in rows.values())
    (resent,) = rows["resent"]["runs"]
    assert resent["cold"]["cached_tokens"] == 0 and resent["cold"]["prompt_tokens"] == resent["warm"]["prompt_tokens"]
    assert resent["warm"]["cached_tokens"] == resent["warm"]["prompt_tokens"] > 0
    (system,) = rows["system"]["runs"]
    assert (
        system["cold"]["cached_tokens"] == 0
        and 256 <= system["warm"]["cached_tokens"] < system["warm"]["prompt_tokens"]
    )
    for (
        row
    ) in rows.values():  # the ratio of the unrounded times; the times are rounded to 0.1 ms (a warm one may be ~1 ms)
        half = 5e-5
        warm, cold = row["warm_ttft_s"], row["cold_ttft_s"]
        assert (warm - half) / (cold + half) - half <= row["ratio"] <= (warm + half) / (cold - half) + half
