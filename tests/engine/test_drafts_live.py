"""MTP and copy drafts (mtp+copy) through a live 2- and 3-rank server (gloo, real HTTP) on the trained demo, whose MTP
layer is trained and whose copy-heavy prompts get copy drafts accepted: `"draft": true` (the default) against
`"draft": false` must give the same token ids, with the `openai` SDK, greedy and sampled, alone and in a burst, and
under structured outputs (where the MTP layer's first draft takes the format's mask, which each step's plan carries
to every rank); /health and /metrics count drafted and accepted tokens, by drafter too; each reply's usage has its
own counts."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import httpx
import openai
import pytest
from test_api_live import KEY, LiveServer, serve_checkpoint

from engine.checkpoint.demo import TRAINED

WORDS = "alpha beta gamma delta epsilon zeta eta theta iota kappa".split()


@pytest.fixture(scope="module", params=[2, 3], ids=["tp2", "tp3"])
def server(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    flags = ["--drafter", "mtp+copy", "--draft-tokens", "3", "--parallel", "4", "--max-queued", "4", "--context", "512"]
    yield from serve_checkpoint(TRAINED, tmp_path_factory, flags, tp=request.param)


def prompt(i: int) -> str:
    listing = " ".join(WORDS[i:] + WORDS[:i])
    return f"<|user|>repeat: {listing}. again: {listing}. and once more: {listing}<|assistant|></think>"


SAMPLINGS = [{"temperature": 0.0}, {"temperature": 0.8, "seed": 11}, {"temperature": 0.6, "top_p": 0.9}]


def test_drafted_equals_draft_false_through_the_api(server: LiveServer) -> None:
    client = openai.OpenAI(base_url=server.url + "/v1", api_key=KEY, max_retries=0)
    cases = [(i, s) for i in range(4) for s in SAMPLINGS]

    predicted: dict[bool, list[tuple[int, int]]] = {True: [], False: []}  # (accepted, rejected) by "draft"

    def ids(i: int, sampling: dict, draft: bool) -> list[int]:
        reply = client.completions.create(
            model="GLM-5.3-Flash",
            prompt=prompt(i),
            max_tokens=40,
            extra_body={"draft": draft, "return_token_ids": True},
            **sampling,
        )
        details = reply.usage.completion_tokens_details
        predicted[draft].append((details.accepted_prediction_tokens, details.rejected_prediction_tokens))
        return reply.choices[0].model_extra["token_ids"]

    serial = [ids(i, s, False) for i, s in cases]
    drafted: dict[int, list[int]] = {}

    def one(k: int) -> None:
        drafted[k] = ids(*cases[k], True)

    for burst in range(0, len(cases), 6):
        threads = [threading.Thread(target=one, args=(k,)) for k in range(burst, min(burst + 6, len(cases)))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(180)
    assert [drafted.get(k) for k in range(len(cases))] == serial
    # each reply's usage carries its own draft counts (OpenAI's predicted-output names); none without drafts
    assert set(predicted[False]) == {(0, 0)}
    assert sum(a for a, _ in predicted[True]) > 0 and sum(r for _, r in predicted[True]) > 0
    with httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {KEY}"}) as http:
        drafts = http.get("/health").json()["drafts"]
        assert drafts["drafter"] == "mtp+copy" and drafts["tokens_per_step"] > 1.0, drafts
        assert all(drafts["by_drafter"][name]["accepted"] > 0 for name in ("mtp", "copy")), drafts
        metrics = http.get("/metrics").text
    assert 'vllm:spec_decode_num_accepted_tokens_per_pos_total{position="0"}' in metrics
    assert 'sparks:draft_accepted_tokens_total{drafter="mtp"}' in metrics


FORMATS = [
    {"structured_outputs": {"regex": "(yes|no), [0-9]{3}"}},
    {"response_format": {"type": "json_object"}},
    {"structured_outputs": {"choice": ["alpha beta", "gamma delta", "epsilon"]}},
]


def test_drafted_equals_draft_false_under_formats(server: LiveServer) -> None:
    client = openai.OpenAI(base_url=server.url + "/v1", api_key=KEY, max_retries=0)
    before = httpx.get(server.url + "/health", headers={"Authorization": f"Bearer {KEY}"}).json()["drafts"]

    def ids(k: int, draft: bool) -> list[int]:
        fmt = FORMATS[k % len(FORMATS)]
        reply = client.chat.completions.create(
            model="GLM-5.3-Flash",
            messages=[{"role": "user", "content": f"Say {WORDS[k]} {WORDS[k + 1]}"}],
            max_tokens=32,
            temperature=0.0 if k % 2 == 0 else 0.8,
            seed=k,
            extra_body={"draft": draft, "return_token_ids": True, **fmt},
        )
        return reply.choices[0].model_extra["token_ids"]

    cases = range(6)
    assert [ids(k, True) for k in cases] == [ids(k, False) for k in cases]
    after = httpx.get(server.url + "/health", headers={"Authorization": f"Bearer {KEY}"}).json()["drafts"]
    assert after["by_drafter"]["mtp"]["drafted"] > before["by_drafter"]["mtp"]["drafted"], (before, after)
