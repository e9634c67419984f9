"""Prompt reuse through a live 2-rank server (gloo, real HTTP) on the trained demo, with the `openai` and
`anthropic` SDKs: a resent prompt and the next turn of a conversation resume from kept states (each rank its shard,
rank 0 deciding) and give the token ids of the same request with `"prompt_reuse": false`; usage reports the resumed
tokens in every API's own field; cache_salt separates tenants; /health and /metrics count kept states and hits. A
second server started with --prompt-reuse 0 keeps nothing."""

from __future__ import annotations

from collections.abc import Iterator

import anthropic
import httpx
import openai
import pytest
from test_api_live import KEY, LiveServer, serve_checkpoint

from engine.checkpoint.demo import TRAINED

pytestmark = pytest.mark.slow
CHUNK = 16
# a pool of 4096 x 2 rows: room for the burst's kept states beside the running requests (kept states give way to
# requests, so a smaller pool would evict some of them before they are resent)
FLAGS = ["--parallel", "2", "--context", "4096", "--max-tokens", "32", "--prefill-chunk", str(CHUNK), "--name", "demo"]
SYSTEM = "You are a helpful assistant. You are a concise assistant. Answer briefly. Answer as accurately as you can."


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    yield from serve_checkpoint(TRAINED, tmp_path_factory, FLAGS)


@pytest.fixture(scope="module")
def client(server: LiveServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key=KEY, max_retries=0)


def chat(client: openai.OpenAI, messages: list[dict], **extra: object) -> tuple[list[int], int, int]:
    """(reply token ids, prompt tokens, cached tokens)."""
    reply = client.chat.completions.create(
        model="demo",
        messages=messages,  # type: ignore[arg-type]
        max_tokens=24,
        temperature=0.7,
        seed=7,
        extra_body={"return_token_ids": True, **extra},
    )
    usage = reply.usage
    assert usage is not None and usage.prompt_tokens_details is not None
    return reply.choices[0].model_extra["token_ids"], usage.prompt_tokens, usage.prompt_tokens_details.cached_tokens


def test_resent_prompts_and_next_turns_resume_with_the_same_reply(server: LiveServer, client: openai.OpenAI) -> None:
    first = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "what is 2 plus 3?"}]
    cold, prompt, cached = chat(client, first, prompt_reuse=False)
    assert cached == 0
    ids, _, cached = chat(client, first)  # the opted-out request kept nothing: this one is cold too, and keeps
    assert ids == cold and cached == 0
    ids, _, cached = chat(client, first)
    assert ids == cold and cached == prompt  # nothing left to prefill
    reply = client.chat.completions.create(model="demo", messages=first, max_tokens=24, temperature=0.0)  # type: ignore[arg-type]
    second = [*first, {"role": "assistant", "content": reply.choices[0].message.content or ""}]
    second.append({"role": "user", "content": "and 4 plus 4?"})
    cold, _, _ = chat(client, second, prompt_reuse=False)
    ids, _, cached = chat(client, second)
    assert ids == cold and cached >= (prompt - 1) // CHUNK * CHUNK  # from the first turn's last boundary
    ids, _, cached = chat(client, first, cache_salt="tenant-b")  # another tenant's salt: nothing shared
    assert ids == chat(client, first, prompt_reuse=False)[0] and cached == 0
    assert chat(client, first, cache_salt="tenant-b")[2] > 0


def test_a_burst_of_the_demos_conversations_resumes_exactly_at_tp2(server: LiveServer, client: openai.OpenAI) -> None:
    """Twelve of the demo's conversations (tool calls, tool results, thinking on and off) sent at once through
    /v1/completions, three times: keeping states, resent (each resumes from its own end, on whichever lane is
    free, each rank its shard), and with "prompt_reuse": false. Greedy and seeded sampling; token ids must agree."""
    from concurrent.futures import ThreadPoolExecutor

    from engine.train import synthetic

    texts = [synthetic.prompt(e) for e in synthetic.examples("eval", 21, 12)]

    def one(k: int, reuse: bool) -> tuple[list[int], int, int]:
        sampling = {"temperature": 0.0} if k % 2 else {"temperature": 0.8, "seed": k}
        reply = client.completions.create(
            model="demo",
            prompt=texts[k],
            max_tokens=24,
            extra_body={"return_token_ids": True, "prompt_reuse": reuse},
            **sampling,  # type: ignore[arg-type]
        )
        usage = reply.usage
        assert usage is not None and usage.prompt_tokens_details is not None
        ids = reply.choices[0].model_extra["token_ids"]
        return ids, usage.prompt_tokens, usage.prompt_tokens_details.cached_tokens

    with ThreadPoolExecutor(6) as pool:
        kept = list(pool.map(lambda k: one(k, True), range(len(texts))))
        resent = list(pool.map(lambda k: one(k, True), range(len(texts))))
        cold = list(pool.map(lambda k: one(k, False), range(len(texts))))
    for k, (a, b, c) in enumerate(zip(kept, resent, cold)):
        assert a[0] == b[0] == c[0], f"conversation {k}"
        assert b[2] == b[1] and c[2] == 0  # the resend prefilled nothing; the opted-out one everything


def test_every_api_reports_resumed_tokens_in_its_own_field(server: LiveServer, client: openai.OpenAI) -> None:
    text = f"<|system|>{SYSTEM}<|user|>name three colours<|assistant|></think>"
    plain = dict(model="demo", prompt=text, max_tokens=8, temperature=0.0)
    client.completions.create(**plain)  # type: ignore[call-overload]
    again = client.completions.create(**plain)  # type: ignore[call-overload]
    assert again.usage is not None and again.usage.prompt_tokens_details is not None
    assert again.usage.prompt_tokens_details.cached_tokens == again.usage.prompt_tokens > 0

    ask = dict(model="demo", instructions=SYSTEM, input="name two animals", max_output_tokens=8)
    client.responses.create(**ask)  # type: ignore[call-overload]
    answer = client.responses.create(**ask)  # type: ignore[call-overload]
    assert answer.usage is not None and answer.usage.input_tokens_details.cached_tokens > 0

    claude = anthropic.Anthropic(base_url=server.url, api_key=KEY, max_retries=0)
    message = dict(model="demo", system=SYSTEM, max_tokens=8, messages=[{"role": "user", "content": "hello there"}])
    claude.messages.create(**message)  # type: ignore[call-overload]
    reply = claude.messages.create(**message)  # type: ignore[call-overload]
    counted = claude.messages.count_tokens(**{k: v for k, v in message.items() if k != "max_tokens"})  # type: ignore[arg-type]
    assert reply.usage.cache_read_input_tokens and reply.usage.cache_read_input_tokens > 0
    assert reply.usage.input_tokens + reply.usage.cache_read_input_tokens == counted.input_tokens


def test_health_and_metrics_count_kept_states_and_hits(server: LiveServer, client: openai.OpenAI) -> None:
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "count to three"}]
    chat(client, messages)
    chat(client, messages)
    with httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {KEY}"}, timeout=30) as http:
        reuse = http.get("/health").json()["prompt_reuse"]
        text = http.get("/metrics").text
    assert reuse["enabled"] and reuse["states"] > 0 and reuse["tokens"] > 0 and reuse["snapshot_bytes"] > 0
    assert 0 < reuse["hits_tokens"] < reuse["queries_tokens"] and 0 < reuse["hit_rate"] < 1
    values = {line.split()[0]: float(line.split()[1]) for line in text.splitlines() if not line.startswith("#")}
    assert values["vllm:prefix_cache_hits_total"] == reuse["hits_tokens"]
    assert values["vllm:prefix_cache_queries_total"] == reuse["queries_tokens"]
    assert values["sparks:prompt_reuse_states"] == reuse["states"]


def test_prompt_reuse_off_keeps_nothing(tmp_path_factory: pytest.TempPathFactory) -> None:
    live = LiveServer(TRAINED, tmp_path_factory.mktemp("logs"), [*FLAGS, "--prompt-reuse", "0"], key=KEY)
    try:
        client = openai.OpenAI(base_url=live.url + "/v1", api_key=KEY, max_retries=0)
        messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "what is 2 plus 3?"}]
        first, _, _ = chat(client, messages)
        again, _, cached = chat(client, messages)
        with httpx.Client(base_url=live.url, headers={"Authorization": f"Bearer {KEY}"}, timeout=30) as http:
            reuse = http.get("/health").json()["prompt_reuse"]
    finally:
        live.stop()
    assert again == first and cached == 0 and reuse == {"enabled": False}
