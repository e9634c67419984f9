"""schemathesis, every check, over every route of the published OpenAPI document of a live 2-rank server: no 5xx,
no status / content type / body / header the document does not promise, schema-invalid data refused, schema-valid
data accepted (except the two rules JSON Schema cannot state: schemathesis_hooks.py). Bounded in examples and time.

Fixed seed, so CI sees the same cases each run; widen locally with SCHEMATHESIS_EXAMPLES=500 and any seed."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from test_api_fuzz import FLAGS  # the same small server the property fuzzing drives
from test_api_live import LiveServer, demo_server

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]
KEY = "schema-key"
EXAMPLES = int(os.environ.get("SCHEMATHESIS_EXAMPLES", "25"))
SEED = os.environ.get("SCHEMATHESIS_SEED", "20261201")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    yield from demo_server(tmp_path_factory, FLAGS, KEY, seed=1)


def test_every_route_conforms_to_the_published_schema(server: LiveServer, tmp_path: Path) -> None:
    command = [
        str(Path(sys.executable).with_name("st")),
        "run",
        f"{server.url}/openapi.json",
        "--checks",
        "all",
        "--exclude-checks",
        "positive_data_acceptance",
        "-H",
        f"Authorization: Bearer {KEY}",
        "--max-examples",
        str(EXAMPLES),
        "--seed",
        SEED,
        "--max-time",
        "240",
        "--no-color",
        "--report",
        "junit",
        "--report-dir",
        str(tmp_path),
    ]
    env = {**os.environ, "SCHEMATHESIS_HOOKS": "tests.reliability.schemathesis_hooks", "PYTHONPATH": str(ROOT)}
    run = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=420)
    summary = run.stdout[-6000:]
    assert run.returncode == 0, summary
    assert "Selected: 11/11" in summary and " passed" in summary and "failures" not in summary, summary
    assert all(p.poll() is None for p in server.procs), "a rank exited under the fuzzing"
    health = httpx.get(server.url + "/health", timeout=10).json()
    assert health["ok"] is True
