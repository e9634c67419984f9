"""A live 2-rank server on the tiny demo checkpoint (real model, gloo on the CPU), driven through HTTP and the
official `openai` client. One server for the whole module: parallel 3, queue 2, window 384, API key required."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from ports import free_port  # tests/ is on sys.path (tests/conftest.py)

from engine.checkpoint.demo import write_demo

ROOT = Path(__file__).resolve().parents[2]
KEY = "test-key-123"
pytestmark = pytest.mark.slow


class LiveServer:
    def __init__(self, checkpoint: Path, logs: Path, flags: list[str], key: str | None = KEY, tp: int = 2) -> None:
        self.port, master = free_port(), free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        env.pop("SPARKS_API_KEY", None)
        if key:
            env["SPARKS_API_KEY"] = key
        common = [
            sys.executable,
            "-m",
            "engine",
            "serve",
            str(checkpoint),
            "--tp",
            str(tp),
            "--master",
            f"127.0.0.1:{master}",
            "--port",
            str(self.port),
            "--host",
            "127.0.0.1",
            *flags,
        ]
        ranks = [*range(1, tp), 0]  # rank 0 last: self.logs[-1] and self.procs[-1] are its
        self.logs = [logs / f"rank{rank}.log" for rank in ranks]
        self.procs = [
            subprocess.Popen(
                [*common, "--rank", str(rank)], cwd=ROOT, env=env, stdout=open(log, "w"), stderr=subprocess.STDOUT
            )
            for rank, log in zip(ranks, self.logs)
        ]
        self._wait_ready()

    def _wait_ready(self, timeout_s: float = 120.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if "ready: serving" in self.logs[-1].read_text():
                return
            if any(p.poll() is not None for p in self.procs):
                break
            time.sleep(0.2)
        self.stop()
        raise RuntimeError("server did not start:\n" + "\n".join(log.read_text()[-2000:] for log in self.logs))

    def stop(self) -> None:
        rank0 = self.procs[-1]
        if rank0.poll() is None:
            rank0.send_signal(signal.SIGTERM)
        for proc in (rank0, *self.procs[:-1]):
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)


SERVER_FLAGS = [
    "--drafter",  # every live test runs with copy drafts, at TP=2: replies must be those without them
    "copy",
    "--draft-tokens",
    "3",
    "--parallel",
    "3",
    "--max-queued",
    "2",
    "--context",
    "384",
    "--max-tokens",
    "48",
    "--prefill-chunk",
    "16",
    "--name",
    "demo",
    "--keepalive-s",
    "1",
]


def demo_server(
    factory: pytest.TempPathFactory, flags: list[str], key: str | None = KEY, seed: int = 0
) -> Iterator[LiveServer]:
    """A live 2-rank server on a fresh tiny demo checkpoint, stopped afterwards (the body of the live tests'
    module-scoped `server` fixtures)."""
    checkpoint = factory.mktemp("demo")
    write_demo(checkpoint, seed=seed, size="tiny")
    yield from serve_checkpoint(checkpoint, factory, flags, key)


def serve_checkpoint(
    checkpoint: Path, factory: pytest.TempPathFactory, flags: list[str], key: str | None = KEY, tp: int = 2
) -> Iterator[LiveServer]:
    """A live `tp`-rank server on `checkpoint`, stopped afterwards (the body of a module-scoped `server` fixture)."""
    live = LiveServer(checkpoint, factory.mktemp("logs"), flags, key=key, tp=tp)
    try:
        yield live
    finally:
        live.stop()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    yield from demo_server(tmp_path_factory, SERVER_FLAGS)


@pytest.fixture(scope="module")
def http(server: LiveServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {KEY}"}, timeout=60) as client:
        yield client


@pytest.fixture(scope="module")
def client(server: LiveServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key=KEY, max_retries=0)


def wait_idle(http: httpx.Client, within_s: float) -> dict[str, Any]:
    deadline = time.monotonic() + within_s
    while True:
        health = http.get("/health").json()
        if (
            health["requests_running"] == health["requests_waiting"] == 0
            and health["pool_free_tokens"] == health["pool_tokens"]
        ):
            return health
        if time.monotonic() > deadline:
            return health
        time.sleep(0.02)


def test_models_and_chat_with_the_openai_client(client: openai.OpenAI) -> None:
    assert [m.id for m in client.models.list().data] == ["demo"]
    reply = client.chat.completions.create(
        model="demo", messages=[{"role": "user", "content": "Hello!"}], max_tokens=12, seed=5
    )
    choice = reply.choices[0]
    assert choice.finish_reason in ("stop", "length") and reply.usage.completion_tokens <= 12
    assert reply.usage.completion_tokens_details.reasoning_tokens == reply.usage.completion_tokens
    assert choice.message.model_extra.get("reasoning_content")  # thinking is on: the reply starts in <think>
    again = client.chat.completions.create(
        model="demo", messages=[{"role": "user", "content": "Hello!"}], max_tokens=12, seed=5
    )
    assert again.choices[0].message.model_extra == choice.message.model_extra


def test_streaming_matches_the_whole_reply(client: openai.OpenAI) -> None:
    kwargs: dict[str, Any] = dict(
        model="demo", messages=[{"role": "user", "content": "Tell me a story."}], max_tokens=20, reasoning_effort="none"
    )
    whole = client.chat.completions.create(**kwargs)
    chunks = list(client.chat.completions.create(stream=True, stream_options={"include_usage": True}, **kwargs))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == (whole.choices[0].message.content or "")
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == whole.choices[0].finish_reason
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens


def test_tool_call_round_trip(client: openai.OpenAI, http: httpx.Client) -> None:
    tools = [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
            },
        }
    ]
    messages = [
        {"role": "user", "content": "Weather in Paris?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_abc",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_abc", "content": "sunny"},
    ]
    reply = client.chat.completions.create(
        model="demo", messages=messages, tools=tools, max_tokens=8, tool_choice="auto"
    )
    assert reply.choices[0].finish_reason in ("stop", "length", "tool_calls")
    rendered = http.post("/tokenize", json={"messages": messages, "tools": tools}).json()
    text = http.post("/detokenize", json={"tokens": rendered["tokens"]}).json()["prompt"]
    assert "<tool_call>get_weather<arg_key>city</arg_key><arg_value>Paris</arg_value></tool_call>" in text
    assert (
        "<|observation|><tool_response>sunny</tool_response>" in text and rendered["count"] == reply.usage.prompt_tokens
    )
    named = client.chat.completions.create(
        model="demo",
        messages=messages[:1],
        tools=tools,
        max_tokens=4,
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
    )
    assert named.choices[0].finish_reason in ("stop", "length", "tool_calls")


def test_completions_string_and_token_prompts(client: openai.OpenAI) -> None:
    text = client.completions.create(model="demo", prompt="The weather today", max_tokens=6, temperature=0)
    assert text.choices[0].finish_reason in ("stop", "length") and text.usage.prompt_tokens > 0
    ids = client.completions.create(model="demo", prompt=[5, 6, 7, 8], max_tokens=6, temperature=0)
    assert ids.usage.prompt_tokens == 4 and ids.usage.completion_tokens <= 6


PROMPTS = [list(range(10, 14)), list(range(100, 140)), [300] * 25, list(range(200, 209)), list(range(50, 81))]


def _completion(http: httpx.Client, i: int) -> list[int]:
    body = {
        "model": "demo",
        "prompt": PROMPTS[i],
        "max_tokens": 16 + i,
        "temperature": 0.9,
        "top_p": 0.95,
        "seed": 100 + i,
        "ignore_eos": True,
        "return_token_ids": True,
    }
    response = http.post("/v1/completions", json=body)
    assert response.status_code == 200, response.text
    return response.json()["choices"][0]["token_ids"]


def test_concurrent_equals_serial_staggered_and_burst(http: httpx.Client) -> None:
    alone = [_completion(http, i) for i in range(len(PROMPTS))]
    assert all(len(ids) == 16 + i for i, ids in enumerate(alone))
    for stagger in (0.15, 0.0):
        results: dict[int, list[int]] = {}

        def one(i: int) -> None:
            time.sleep(i * stagger)
            results[i] = _completion(http, i)

        threads = [threading.Thread(target=one, args=(i,)) for i in range(len(PROMPTS))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert [results.get(i) for i in range(len(PROMPTS))] == alone, f"stagger {stagger}"


def test_drafted_replies_equal_draft_false_at_tp2(http: httpx.Client) -> None:
    """With copy drafts on (a random demo seldom repeats itself, so drafts are rare here; tests/engine/
    test_drafts_live.py serves the trained demo, which does), against `"draft": false`: the same token ids, greedy
    and sampled, alone and in a burst; /health and /metrics report the drafter."""
    texts = [
        "one two three one two three one two three one two",
        "a b c d a b c d a b c d a b",
        "red green blue red green blue red green",
    ]
    samplings = [{"temperature": 0}, {"temperature": 0.9, "seed": 5}, {"temperature": 0.7, "top_p": 0.8}]

    def ids(text: str, sampling: dict, draft: bool) -> list[int]:
        body = {"model": "demo", "prompt": text, "max_tokens": 48, "ignore_eos": True, "return_token_ids": True}
        reply = http.post("/v1/completions", json={**body, **sampling, "draft": draft})
        assert reply.status_code == 200, reply.text
        return reply.json()["choices"][0]["token_ids"]

    before = http.get("/health").json()["drafts"]
    cases = [(t, s) for t in texts for s in samplings]
    serial = [ids(t, s, False) for t, s in cases]
    assert http.get("/health").json()["drafts"]["drafted"] == before["drafted"]  # draft: false drafts nothing
    drafted: dict[int, list[int]] = {}

    def one(i: int) -> None:
        drafted[i] = ids(*cases[i], True)

    for burst in range(0, len(cases), 4):  # 3 lanes + 2 queued: a burst of 4 is never refused
        threads = [threading.Thread(target=one, args=(i,)) for i in range(burst, min(burst + 4, len(cases)))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
    assert [drafted.get(i) for i in range(len(cases))] == serial
    after = http.get("/health").json()["drafts"]
    assert after["drafter"] == "copy" and after["draft_tokens"] == 3 and after["windows"] > before["windows"]
    metrics = http.get("/metrics").text
    for name in ("vllm:spec_decode_num_draft_tokens_total", "vllm:spec_decode_num_accepted_tokens_total"):
        assert name in metrics, name


def _open_stream(http: httpx.Client, stack: contextlib.ExitStack, max_tokens: int = 300) -> httpx.Response:
    body = {
        "model": "demo",
        "messages": [{"role": "user", "content": "Go on and on."}],
        "stream": True,
        "max_tokens": max_tokens,
        "ignore_eos": True,
    }
    return stack.enter_context(http.stream("POST", "/v1/chat/completions", json=body))


def test_disconnect_frees_the_lane_within_a_second(http: httpx.Client) -> None:
    with contextlib.ExitStack() as stack:
        response = _open_stream(http, stack)
        lines = response.iter_lines()
        got = [next(lines) for _ in range(8)]
        assert any(line.startswith("data: ") for line in got)
        assert http.get("/health").json()["requests_running"] == 1
    closed = time.monotonic()
    health = wait_idle(http, 1.0)
    assert health["requests_running"] == 0 and health["pool_free_tokens"] == health["pool_tokens"]
    assert time.monotonic() - closed < 1.0


def test_queue_cap_gives_429_with_retry_after(http: httpx.Client) -> None:
    with contextlib.ExitStack() as stack:
        streams = [_open_stream(http, stack) for _ in range(5)]  # 3 lanes + 2 queued
        assert all(s.status_code == 200 for s in streams)
        refused = http.post("/v1/completions", json={"prompt": "hi", "max_tokens": 2})
        assert refused.status_code == 429 and int(refused.headers["retry-after"]) > 0
        assert refused.json()["error"]["type"] == "rate_limit_error"
    health = wait_idle(http, 3.0)  # a queued stream notices its client is gone at the next keep-alive (1 s)
    assert health["requests_running"] == health["requests_waiting"] == 0


def test_context_length_exceeded_and_bad_requests(http: httpx.Client) -> None:
    over = http.post("/v1/completions", json={"prompt": [1] * 100, "max_tokens": 300})
    assert over.status_code == 400
    error = over.json()["error"]
    assert error["code"] == "context_length_exceeded" and "384" in error["message"] and "400" in error["message"]
    capped = http.post("/v1/completions", json={"prompt": [1] * 370, "ignore_eos": True})
    assert capped.status_code == 200 and capped.json()["usage"]["completion_tokens"] == 14
    for body in (
        {"messages": []},
        {"messages": [{"role": "user", "content": "x"}], "n": 2},
        {"messages": [{"role": "user", "content": "x"}], "top_logprobs": 21},
        {"messages": [{"role": "user", "content": "x"}], "temperature": "hot"},
    ):
        response = http.post("/v1/chat/completions", json=body)
        assert response.status_code == 400 and "message" in response.json()["error"], body
    unknown = http.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "x"}], "model": "other"})
    assert unknown.status_code == 404 and unknown.json()["error"]["code"] == "model_not_found"  # as OpenAI answers
    assert http.post("/v1/chat/completions", content=b"{not json").status_code == 400
    assert http.post("/v1/chat/completions", content=b"x" * (33 * 2**20)).status_code == 413
    assert http.get("/v1/nowhere").status_code == 404
    assert wait_idle(http, 1.0)["requests_running"] == 0


def test_api_key_required_except_health(server: LiveServer) -> None:
    assert httpx.get(server.url + "/health").status_code == 200
    assert httpx.get(server.url + "/v1/models").status_code == 401
    assert httpx.get(server.url + "/v1/models", headers={"x-api-key": KEY}).status_code == 200
    wrong = httpx.post(server.url + "/v1/completions", json={"prompt": "a"}, headers={"Authorization": "Bearer no"})
    assert wrong.status_code == 401 and wrong.json()["error"]["code"] == "invalid_api_key"


def test_health_and_metrics(http: httpx.Client) -> None:
    health = http.get("/health").json()
    assert health["ok"] and health["streams"]["max"] == 3 and health["context_length"] == 384
    assert health["totals"]["requests"] > 0 and health["pool_tokens"] == 3 * 384
    memory = health["memory"]  # rank 0's own bytes by kind (tests/engine/test_footprint.py checks the figures)
    assert memory["weights_bytes"]["total"] == sum(v for k, v in memory["weights_bytes"].items() if k != "total") > 0
    assert memory["pool_rows"] == "bf16" and memory["pool_bytes"] > 0 and memory["lane_state_bytes"] > 0
    metrics = http.get("/metrics").text
    for name in (
        "sparks:requests_total",
        "vllm:num_requests_running",
        "vllm:time_to_first_token_seconds_bucket",
        "sparks:generation_tokens_total",
        "vllm:kv_cache_usage_perc",
        "vllm:e2e_request_latency_seconds",
    ):
        assert name in metrics, name
    assert json.loads(http.post("/tokenize", json={"prompt": "hello"}).text)["count"] > 0


def test_without_vision_the_document_offers_no_images_and_they_are_refused(http: httpx.Client) -> None:
    from engine.server.openapi import IMAGE_SCHEMAS

    document = http.get("/openapi.json").text
    assert not [name for name in IMAGE_SCHEMAS if f'"{name}"' in document or f"/{name}" in document]
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
    answer = http.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": [image]}]})
    assert answer.status_code == 400 and "VISION=0" in answer.json()["error"]["message"], answer.text
    assert http.get("/health").json()["vision"] == {"enabled": False}
