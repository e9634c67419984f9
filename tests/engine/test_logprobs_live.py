"""Log-probabilities through a live 2-rank server (gloo, real HTTP, the `openai` SDK): chat `logprobs` /
`top_logprobs`, completions `logprobs` with `echo` (the prompt's own, as lm-eval-harness's loglikelihood tasks read
them), streamed and not. The values are checked against the model run in this process (TP=1, the same checkpoint,
teacher-forced): the log-softmax of its logits at each position."""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest
import torch
from test_api_live import KEY, SERVER_FLAGS, LiveServer, serve_checkpoint

from engine.checkpoint.demo import write_demo
from engine.models.glm5_next.model import Glm5NextForCausalLM

TOL = 2e-3  # TP=2 (gloo, bf16 cache rows) against TP=1 fp32 in this process


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("demo")
    write_demo(path, seed=0, size="tiny")
    return path


@pytest.fixture(scope="module")
def server(checkpoint: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    yield from serve_checkpoint(checkpoint, tmp_path_factory, [*SERVER_FLAGS, "--kv", "fp32"])


@pytest.fixture(scope="module")
def client(server: LiveServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key=KEY, max_retries=0)


@pytest.fixture(scope="module")
def reference(checkpoint: Path):
    model = Glm5NextForCausalLM.load(checkpoint)

    def logprobs(ids: list[int]) -> torch.Tensor:
        """Row i: the log-softmax of the logits after ids[: i + 1]."""
        with torch.no_grad():
            seq = model.new_sequence(model.make_pool(len(ids) + 1, "fp32"))
            return torch.log_softmax(model.prefill(seq, ids, all_logits=True).double(), dim=-1)

    return logprobs


def test_completion_echo_gives_the_prompts_logprobs(client: openai.OpenAI, reference) -> None:
    prompt = [5, 17, 300, 42, 99, 1000, 7]
    reply = client.completions.create(
        model="demo",
        prompt=prompt,
        max_tokens=6,
        temperature=0,
        echo=True,
        logprobs=3,
        extra_body={"return_token_ids": True, "ignore_eos": True},
    )
    choice = reply.choices[0]
    reply_ids = choice.model_extra["token_ids"]
    ids = prompt + reply_ids
    expected = reference(ids)
    lp = choice.logprobs
    assert len(lp.tokens) == len(ids) and lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    for i in range(1, len(ids)):
        assert abs(lp.token_logprobs[i] - float(expected[i - 1, ids[i]])) < TOL, i
        assert len(lp.top_logprobs[i]) <= 3 and lp.token_logprobs[i] <= 0
    for i in range(len(prompt), len(ids)):  # greedy: the chosen token is the most likely one
        assert max(lp.top_logprobs[i].values()) == pytest.approx(lp.token_logprobs[i], abs=1e-9)
    assert lp.text_offset[0] == 0 and lp.text_offset == sorted(lp.text_offset)


def test_chat_logprobs_and_their_stream_agree(client: openai.OpenAI) -> None:
    ask = dict(
        model="demo",
        messages=[{"role": "user", "content": "Hello"}],
        max_tokens=12,
        temperature=0.7,
        seed=3,
        logprobs=True,
        top_logprobs=2,
    )
    whole = client.chat.completions.create(**ask)
    entries = whole.choices[0].logprobs.content
    assert entries and all(e.logprob <= 0 and len(e.top_logprobs) == 2 for e in entries)
    assert all(math.exp(e.top_logprobs[0].logprob) + math.exp(e.top_logprobs[1].logprob) <= 1 + 1e-9 for e in entries)
    streamed = []
    for chunk in client.chat.completions.create(**ask, stream=True):
        if chunk.choices and chunk.choices[0].logprobs is not None:
            streamed += chunk.choices[0].logprobs.content
    assert [(e.token, e.logprob) for e in streamed] == [(e.token, e.logprob) for e in entries]


def test_streamed_completion_logprobs_cover_every_token(client: openai.OpenAI) -> None:
    ask = dict(model="demo", prompt="one two three", max_tokens=10, temperature=0, logprobs=1, echo=True)
    whole = client.completions.create(**ask).choices[0].logprobs
    tokens, values = [], []
    for chunk in client.completions.create(**ask, stream=True):
        if chunk.choices and chunk.choices[0].logprobs is not None:
            tokens += chunk.choices[0].logprobs.tokens
            values += chunk.choices[0].logprobs.token_logprobs
    assert tokens == whole.tokens and values == whole.token_logprobs
