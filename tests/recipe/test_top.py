"""`sparks top` against a real 2-rank server on the tiny demo checkpoint (CPU, gloo), run as the user runs it
(`.venv/bin/sparks top --once --json`); plus the quantile arithmetic, the parser on the engine's own /metrics text
and the rates on made-up samples, with exact expectations."""

from __future__ import annotations

import json
import math
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client import generate_latest
from recipe_helpers import clean_environ, free_port
from test_api_live import LiveServer, demo_server, wait_idle  # tests/engine is on sys.path (tests/conftest.py)

from engine.server.metrics import Metrics
from recipe.top.prometheus import Histogram, histogram, parse_samples, quantile
from recipe.top.top import TTFT_MIN_WINDOW, History, Sample

KEY = "top-key-5"
PARALLEL = 3
SPARKS = Path(sys.executable).parent / "sparks"  # .venv/bin/sparks
slow = pytest.mark.slow


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    yield from demo_server(tmp_path_factory, ["--parallel", str(PARALLEL), "--context", "512", "--name", "demo"], KEY)


@pytest.fixture(scope="module")
def http(server: LiveServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {KEY}"}, timeout=60) as client:
        yield client


@pytest.fixture
def config_root(tmp_path: Path) -> Path:
    """No .env nor scripts/local.sh: only what a test passes reaches the settings."""
    (tmp_path / "scripts").mkdir()
    return tmp_path


def sparks_top(config_root: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(SPARKS), "top", *args], capture_output=True, text=True, timeout=60, env=top_environ(config_root, **env)
    )


def top_environ(config_root: Path, **env: str) -> dict[str, str]:
    environ = clean_environ(SPARKS_CONFIG_ROOT=str(config_root))
    environ.pop("SPARKS_API_KEY", None)
    return {**environ, **env}


def complete(http: httpx.Client, max_tokens: int) -> None:
    reply = http.post(
        "/v1/completions",
        json={"model": "demo", "prompt": "Once upon a time", "max_tokens": max_tokens, "ignore_eos": True},
    )
    assert reply.status_code == 200, reply.text


def snapshot(config_root: Path, *args: str, **env: str) -> dict[str, Any]:
    result = sparks_top(config_root, "--once", "--json", *args, **env)
    assert result.returncode == 0, result.stdout + result.stderr
    return json.loads(result.stdout)


@slow
def test_once_json_after_requests_agrees_with_health(server: LiveServer, http: httpx.Client, config_root: Path) -> None:
    for _ in range(4):
        complete(http, max_tokens=8)
    wait_idle(http, within_s=10)
    data = snapshot(config_root, "--url", server.url + "/v1", SPARKS_API_KEY=KEY)  # .../v1 is accepted
    health = http.get("/health").json()
    assert data["url"] == server.url and data["answering"] and data["ok"] is True and data["error"] is None
    assert data["model"] == "demo" and 0 < data["uptime_s"] <= health["uptime_s"]
    assert data["streams"] == {"decoding": 0, "prefilling": 0, "max": PARALLEL, "busy": 0, "free": PARALLEL}
    assert data["requests"] == {"running": 0, "waiting": 0}
    pool = data["pool_tokens"]
    assert pool["total"] == health["pool_tokens"] and pool["free"] == health["pool_free_tokens"] == pool["total"]
    assert pool["used"] == 0
    assert data["totals"]["completion_tokens"] == health["totals"]["completion_tokens"] >= 4 * 8
    for rate in (data["decode_tok_s"], data["prefill_tok_s"]):
        assert rate["last_second"] == rate["last_minute"] == 0.0  # idle while it sampled
        assert 0.9 <= rate["minute_span_s"] < 5  # --once: two samples ~1 s apart
    ttft = data["ttft_s"]
    assert ttft["observations"] >= 4 and ttft["window"] == "since start"
    assert 0 < ttft["p50"] <= ttft["p95"] <= 640
    assert data["metrics_problem"] is None
    reuse = data["prompt_reuse"]  # the same short prompt four times: the later three resumed from its end
    assert reuse == health["prompt_reuse"] and reuse["hits_tokens"] >= 3 and reuse["states"] >= 1
    if "ranks" in health:
        assert [r["rank"] for r in data["ranks"]] == [0, 1] and all(r["live"] for r in data["ranks"])
    else:
        assert data["ranks"] is None


@slow
def test_decode_rate_moves_while_replies_stream(server: LiveServer, http: httpx.Client, config_root: Path) -> None:
    stop = threading.Event()

    def load() -> None:
        while not stop.is_set():
            complete(http, max_tokens=48)

    workers = [threading.Thread(target=load) for _ in range(2)]
    for worker in workers:
        worker.start()
    try:
        time.sleep(0.5)
        data = snapshot(config_root, "--url", server.url, "--api-key", KEY)
    finally:
        stop.set()
        for worker in workers:
            worker.join(60)
    assert data["decode_tok_s"]["last_second"] > 0 and data["decode_tok_s"]["last_minute"] > 0
    assert data["prefill_tok_s"]["last_minute"] >= 0
    assert data["streams"]["busy"] + data["streams"]["free"] == PARALLEL
    assert data["pool_tokens"]["used"] + data["pool_tokens"]["free"] == data["pool_tokens"]["total"]


@slow
def test_url_and_key_come_from_the_settings(server: LiveServer, http: httpx.Client, config_root: Path) -> None:
    complete(http, max_tokens=4)  # a first-token time to report, whichever tests ran before this one
    data = snapshot(config_root, HOST="0.0.0.0", PORT=server.url.rsplit(":", 1)[1], API_KEY=KEY)
    assert data["url"] == server.url  # HOST=0.0.0.0 is reached over loopback
    assert data["metrics_problem"] is None and data["ttft_s"]["p50"] is not None


@slow
def test_without_the_key_metrics_are_named_and_health_still_shows(server: LiveServer, config_root: Path) -> None:
    data = snapshot(config_root, "--url", server.url)
    assert "API key" in data["metrics_problem"] and data["ttft_s"] is None
    assert data["streams"]["max"] == PARALLEL and data["decode_tok_s"]["last_second"] is not None


@slow
def test_live_dashboard_ends_cleanly_on_ctrl_c(server: LiveServer, config_root: Path) -> None:
    proc = subprocess.Popen(
        [str(SPARKS), "top", "--url", server.url, "--api-key", KEY, "--interval", "0.5"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=top_environ(config_root),
        # Ctrl-C as a terminal delivers it: a suite started in the background (`cmd &` without job control) runs
        # with SIGINT ignored, which a child inherits, and then no Ctrl-C reaches the dashboard
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    time.sleep(6)  # into the dashboard's loop (a fresh clone's first start compiles the recipe's modules)
    proc.send_signal(signal.SIGINT)
    try:
        out, err = proc.communicate(timeout=40)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        raise AssertionError(f"sparks top did not end within 40 s of Ctrl-C:\n{out}\n{err}") from None
    assert proc.returncode == 0, out + err
    assert "Traceback" not in out + err and "Streams" in out and "TTFT" in out


def test_unreachable_server_once_exits_3_with_one_line(config_root: Path) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    result = sparks_top(config_root, "--once", "--json", "--url", url)
    assert result.returncode == 3 and result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and f"{url} is not answering" in lines[0], result.stderr


# -- the arithmetic, on made-up numbers ---------------------------------------------------------------------------
BUCKETS = ((0.25, 2.0), (0.5, 6.0), (1.0, 8.0), (2.0, 8.0), (math.inf, 10.0))


@pytest.mark.parametrize(
    ("q", "expected"),
    [
        (0.0, 0.0),  # the first non-empty bucket's lower bound
        (0.1, 0.125),  # rank 1 of the first bucket's 2: halfway into (0, 0.25]
        (0.5, 0.4375),  # rank 5: 3 of the 4 in (0.25, 0.5]
        (0.8, 1.0),  # rank 8 ends (0.5, 1]; the empty (1, 2] is not entered
        (0.95, 2.0),  # in the +Inf bucket: the largest finite bound
        (1.0, 2.0),
    ],
)
def test_quantile_from_cumulative_buckets(q: float, expected: float) -> None:
    assert quantile(q, BUCKETS) == expected


def test_quantile_without_observations_is_none() -> None:
    assert quantile(0.5, ((0.25, 0.0), (math.inf, 0.0))) is None and quantile(0.5, ()) is None


def test_parser_reads_the_engines_own_metrics_text() -> None:
    metrics = Metrics()
    for seconds in (0.07, 0.2, 0.3, 3.0):
        metrics.ttft.observe(seconds)
    text = generate_latest(metrics.registry).decode()
    for name in ("sparks:time_to_first_token_seconds", "vllm:time_to_first_token_seconds"):
        found = histogram(parse_samples(text), name)
        assert found is not None and found.count == 4 and found.total == pytest.approx(3.57)
        assert dict(found.buckets) == {
            0.05: 0,
            0.1: 1,
            0.25: 2,
            0.5: 3,
            1: 3,
            2.5: 3,
            5: 4,
            10: 4,
            20: 4,
            40: 4,
            80: 4,
            160: 4,
            320: 4,
            640: 4,
            math.inf: 4,
        }
        assert quantile(0.5, found.buckets) == pytest.approx(0.25)  # rank 2 closes (0.1, 0.25]
    assert histogram(parse_samples(text), "sparks:no_such_histogram") is None


def health(completion: int, prompt: int, uptime: float) -> dict[str, Any]:
    return {"ok": True, "uptime_s": uptime, "totals": {"completion_tokens": completion, "prompt_tokens": prompt}}


def ttft_histogram(fast: int, slow_ones: int) -> Histogram:
    return Histogram(((0.5, float(fast)), (math.inf, float(fast + slow_ones))), float(fast + slow_ones), 0.0)


def test_rates_over_the_last_second_and_the_kept_minute() -> None:
    history = History()
    for at, completion in ((0.0, 0), (30.0, 600), (59.0, 1000), (60.0, 1200)):
        history.add(Sample(at, health(completion, 10, at + 5)))
    rate = history.rate("completion_tokens")
    assert rate is not None and rate.last_second == 200.0 and rate.last_minute == 20.0 and rate.minute_span_s == 60
    history.add(Sample(61.0, health(1300, 10, 66)))
    assert [s.at for s in history.samples] == [0.0, 30.0, 59.0, 60.0, 61.0]  # 0 s is the minute's base still
    history.add(Sample(91.0, health(1900, 10, 96)))  # now 30 s is: 0 s is no longer needed
    assert [s.at for s in history.samples] == [30.0, 59.0, 60.0, 61.0, 91.0]


def test_a_restart_clears_the_history() -> None:
    history = History()
    history.add(Sample(0.0, health(500, 50, 100)))
    history.add(Sample(1.0, health(520, 50, 101)))
    history.add(Sample(2.0, health(5, 3, 0.5)))  # counters went back: a new server
    rate = history.rate("completion_tokens")
    assert rate is not None and rate.last_second is None and len(history.samples) == 1


def test_ttft_uses_the_last_minute_once_it_has_enough_first_tokens() -> None:
    history = History()
    history.add(Sample(0.0, health(0, 0, 1), ttft_histogram(fast=0, slow_ones=100)))
    history.add(Sample(60.0, health(0, 0, 61), ttft_histogram(fast=TTFT_MIN_WINDOW - 1, slow_ones=100)))
    assert history.ttft().window == "since start"  # too few in the minute
    history.add(Sample(61.0, health(0, 0, 62), ttft_histogram(fast=TTFT_MIN_WINDOW + 1, slow_ones=100)))
    recent = history.ttft()
    assert recent.window == "last minute" and recent.observations == TTFT_MIN_WINDOW + 1
    assert recent.p95_s == pytest.approx(0.475)  # all in (0, 0.5]: the old slow ones are out


def test_the_reuse_row_says_what_health_reports() -> None:
    from recipe.top.view import reuse

    counts = {"enabled": True, "states": 3, "tokens": 1200, "queries_tokens": 4000, "hits_tokens": 1000}
    assert reuse(counts) == "3 kept states · 1,200 tokens held · 25 % of prompt tokens resumed [dim](1,000 of 4,000)[/]"
    assert reuse({"enabled": False}) == "off" and reuse(None) == "—"


def test_the_served_row_names_steps_out_of_gpu_memory_only_when_there_were_some() -> None:
    from recipe.top.view import served

    totals = {"requests": 1200, "prompt_tokens": 5000, "completion_tokens": 900, "out_of_memory": 0}
    assert served(totals) == "1,200 requests · 5,000 prompt tokens · 900 tokens generated"
    assert served({**totals, "out_of_memory": 2}).endswith(" · [red]2 steps out of GPU memory[/]")
