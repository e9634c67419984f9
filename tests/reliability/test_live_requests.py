"""Issue 13 against a live 2-rank server (tiny demo checkpoint, gloo on the CPU, real HTTP): a hostile request never
stops a rank, an abandoned non-streamed request gives its lane back, invalid Unicode is a 400 everywhere, error
texts are the product's words, and the rendezvous listens on loopback only."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from test_api_live import LiveServer, demo_server

from engine.checkpoint.demo import write_demo

pytestmark = pytest.mark.slow
KEY = "reliability-key"
HEADERS = {"Authorization": f"Bearer {KEY}"}
FLAGS = [
    "--parallel",
    "2",
    "--max-queued",
    "4",
    "--context",
    "4096",
    "--max-tokens",
    "64",
    "--prefill-chunk",
    "64",
    "--name",
    "demo",
    "--keepalive-s",
    "1",
]
HELLO = [{"role": "user", "content": "Reply with OK."}]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    yield from demo_server(tmp_path_factory, FLAGS, KEY)


def post(server: LiveServer, path: str, body: dict | bytes, timeout: float = 60.0) -> httpx.Response:
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    return httpx.post(
        server.url + path, content=content, timeout=timeout, headers={**HEADERS, "Content-Type": "application/json"}
    )


def assert_serving(server: LiveServer) -> None:
    assert all(p.poll() is None for p in server.procs), "a rank exited"
    health = httpx.get(server.url + "/health", timeout=10)
    assert health.status_code == 200 and health.json()["ok"] is True, health.text
    reply = post(server, "/v1/chat/completions", {"messages": HELLO, "max_tokens": 4, "temperature": 0})
    assert reply.status_code == 200, reply.text


EXTREME = [
    {"temperature": 1e-308, "min_p": 0.5},  # the reported request
    {"temperature": 5e-324, "top_k": 3},
    {"temperature": 1e-308, "top_p": 1e-300},
    {"temperature": 2.0, "min_p": 1.0, "top_p": 0.0, "top_k": -1},
    {"temperature": 1e-12, "min_p": 1.0, "seed": 2**64 - 1},
]


@pytest.mark.parametrize("params", EXTREME)
def test_extreme_sampling_parameters_are_served_and_stop_nothing(server: LiveServer, params: dict) -> None:
    chat = post(server, "/v1/chat/completions", {"messages": HELLO, "max_tokens": 4, **params})
    assert chat.status_code == 200, chat.text
    with httpx.stream(
        "POST",
        server.url + "/v1/completions",
        headers=HEADERS,
        timeout=60,
        json={"prompt": "Hello", "max_tokens": 4, "stream": True, **params},
    ) as streamed:
        text = "".join(streamed.iter_text())
    assert streamed.status_code == 200 and "data: [DONE]" in text and '"error"' not in text, text
    assert_serving(server)


SURROGATE_BODIES = {
    "/v1/chat/completions": [
        b'{"messages":[{"role":"user","content":"\\ud800"}]}',
        b'{"messages":[{"role":"user","content":[{"type":"text","text":"a\\udfffb"}]}]}',
        b'{"messages":[{"role":"system","content":"\\ud800"},{"role":"user","content":"hi"}]}',
        b'{"messages":[{"role":"user","content":"hi"}],"tools":[{"type":"function","function":{"name":"f",'
        b'"description":"\\ud800"}}]}',
        b'{"messages":[{"role":"user","content":"\\ud800"}],"stream":true}',
        b'{"messages":[{"role":"user","content":"hi"}],"stop":["\\udc00"]}',
        b'{"messages":[{"role":"user","content":"hi"}],"chat_template_kwargs":{"\\ud800":1}}',
    ],
    "/v1/completions": [b'{"prompt":"\\ud800"}', b'{"prompt":"x","stream":true,"stop":"\\ud800"}'],
    "/tokenize": [b'{"prompt":"\\ud800"}', b'{"messages":[{"role":"user","content":"\\ud800"}]}'],
    "/v1/tokenize": [b'{"prompt":"\\ud800"}'],
}


@pytest.mark.parametrize("path,body", [(p, b) for p, bodies in SURROGATE_BODIES.items() for b in bodies])
def test_a_lone_surrogate_is_a_400_naming_where(server: LiveServer, path: str, body: bytes) -> None:
    reply = post(server, path, body)
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert "lone UTF-16 surrogate" in error["message"] and error["type"] == "invalid_request_error"
    assert "\\ud" not in json.dumps(error["param"] or "")


def test_valid_astral_text_still_passes(server: LiveServer) -> None:
    reply = post(server, "/tokenize", b'{"prompt":"emoji \\ud83d\\ude00 ok"}')
    assert reply.status_code == 200 and reply.json()["count"] > 0


def _hang_up_after(server: LiveServer, body: dict, seconds: float) -> None:
    """A non-streamed request whose client gives up: send, wait, close the socket without reading."""
    payload = json.dumps(body).encode()
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        sock.sendall(
            b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Authorization: Bearer "
            + KEY.encode()
            + b"\r\nContent-Length: "
            + str(len(payload)).encode()
            + b"\r\n\r\n"
            + payload
        )
        time.sleep(seconds)


def _running(server: LiveServer) -> int:
    return int(httpx.get(server.url + "/health", timeout=10).json()["requests_running"])


def test_abandoned_non_streamed_requests_give_their_lanes_back(server: LiveServer) -> None:
    long = {"prompt": "Once upon a time", "max_tokens": 4000, "ignore_eos": True, "temperature": 0.7}
    for _ in range(2):  # both lanes, each for thousands of tokens
        _hang_up_after(server, long, 0.5)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and _running(server) > 0:
        time.sleep(0.1)
    assert _running(server) == 0, "a hung-up request still holds its lane"
    started = time.monotonic()
    assert_serving(server)
    assert time.monotonic() - started < 10
    metrics = httpx.get(server.url + "/metrics", headers=HEADERS, timeout=10).text
    assert "disconnect" in metrics


def test_errors_from_a_stopped_engine_are_in_product_words(tmp_path: Path) -> None:
    """A request cut by a peer that died gets one clean sentence: no doubled prefix, no gloo text."""
    checkpoint = tmp_path / "demo"
    write_demo(checkpoint, seed=0, size="tiny")
    live = LiveServer(checkpoint, tmp_path, FLAGS, key=KEY)
    try:
        with httpx.stream(
            "POST",
            live.url + "/v1/completions",
            headers=HEADERS,
            timeout=60,
            json={"prompt": "Once", "max_tokens": 4000, "ignore_eos": True, "stream": True},
        ) as cut:
            lines = cut.iter_lines()
            assert next(lines).startswith("data: ")
            live.procs[0].kill()  # rank 1 dies mid-stream
            text = "\n".join(lines)
        error = json.loads(next(line for line in text.splitlines() if '"error"' in line)[len("data: ") :])["error"]
        assert error["message"].startswith("the engine stopped while this request ran: a rank stopped answering")
        for internal in ("gloo", "Connection reset", "RuntimeError", "the engine stopped: the engine stopped"):
            assert internal not in error["message"]
        later = post(live, "/v1/chat/completions", {"messages": HELLO, "max_tokens": 4}, timeout=10)
        assert later.status_code == 503
        assert later.json()["error"]["message"] == (
            "the engine is not serving (a rank stopped answering); retry once the server is back"
        )
        health = httpx.get(live.url + "/health", timeout=10)
        assert health.status_code == 503 and health.json()["error"] == "the engine stopped: a rank stopped answering"
        assert live.procs[1].wait(30) == 1  # rank 0 exits by itself
    finally:
        live.stop()


def _listeners(port: int) -> list[str]:
    """Local addresses listening on `port` (from /proc/net/tcp and tcp6), as hex address strings."""
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            address, hex_port = local.split(":")
            if state == "0A" and int(hex_port, 16) == port:
                found.append(address)
    return found


def test_the_rendezvous_listens_on_loopback_only(server: LiveServer) -> None:
    master = int(next(a for a in server.procs[1].args if a.startswith("127.0.0.1:")).split(":")[1])
    addresses = _listeners(master)
    assert addresses, "nothing listens on the rendezvous port"
    assert addresses == ["0100007F"], f"the rendezvous listens beyond loopback: {addresses}"


@pytest.mark.parametrize(
    "field,value,param",
    [
        ("guided_whitespace_pattern", "[ ]*", "guided_whitespace_pattern"),  # not honoured: refused, not ignored
        ("guided_regex", "(a", "guided_regex"),  # a regex that does not compile
        ("structured_outputs", {"json": {"type": 5}}, "structured_outputs.json"),  # nor a schema
        ("guided_grammar", "root ::= ", "guided_grammar"),  # nor a grammar
    ],
)
def test_a_format_that_cannot_be_followed_is_a_400_naming_it(
    server: LiveServer, field: str, value: object, param: str
) -> None:
    """Accepting them would return text that ignores what the client asked for: a 400 naming the field, and the
    server goes on serving formats."""
    reply = post(server, "/v1/chat/completions", {"messages": HELLO, "max_tokens": 4, field: value})
    assert reply.status_code == 400 and reply.json()["error"]["param"] == param, reply.text
    plain = post(
        server,
        "/v1/chat/completions",
        {
            "messages": HELLO,
            "max_tokens": 8,
            "guided_choice": ["yes", "no"],
            "response_format": {"type": "text"},
            "reasoning_effort": "none",  # the random demo would think past max_tokens
        },
    )
    assert plain.status_code == 200 and plain.json()["choices"][0]["message"]["content"] in ("yes", "no"), plain.text
