"""POST /v1/messages (Anthropic's Messages API) through a live 2-rank server with the `anthropic` SDK: replies as
content blocks, the streamed event sequence, tools with tool_use / tool_result, thinking, count_tokens, x-api-key,
and errors in Anthropic's shape."""

from __future__ import annotations

from collections.abc import Iterator

import anthropic
import httpx
import pytest
from test_api_live import KEY, SERVER_FLAGS, LiveServer, demo_server


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    yield from demo_server(tmp_path_factory, SERVER_FLAGS)


@pytest.fixture(scope="module")
def client(server: LiveServer) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=server.url, api_key=KEY, max_retries=0)


WEATHER = {
    "name": "get_weather",
    "description": "The weather in a city",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}


def test_a_message_and_its_stream_agree(client: anthropic.Anthropic) -> None:
    ask = {
        "model": "demo",
        "max_tokens": 24,
        "extra_body": {"temperature": 0.0},  # this SDK no longer sends sampling fields; the API still takes them
        "system": "You are terse.",
        "messages": [{"role": "user", "content": "Say something."}],
        "thinking": {"type": "disabled"},
    }
    reply = client.messages.create(**ask)
    assert reply.type == "message" and reply.role == "assistant" and reply.model == "demo"
    assert reply.stop_reason in ("end_turn", "max_tokens") and reply.usage.output_tokens > 0
    text = "".join(block.text for block in reply.content if block.type == "text")
    counted = client.messages.count_tokens(**{k: v for k, v in ask.items() if k not in ("max_tokens", "extra_body")})
    # usage counts tokens read from kept prompt states apart, as Anthropic counts cache reads
    assert counted.input_tokens == reply.usage.input_tokens + (reply.usage.cache_read_input_tokens or 0) > 0
    kinds = []
    with client.messages.stream(**ask) as stream:
        for event in stream:
            kinds.append(event.type)
        final = stream.get_final_message()
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop" and "message_delta" in kinds
    assert "".join(block.text for block in final.content if block.type == "text") == text
    assert final.stop_reason == reply.stop_reason and final.usage.output_tokens == reply.usage.output_tokens


def test_thinking_comes_back_as_a_thinking_block(client: anthropic.Anthropic) -> None:
    reply = client.messages.create(
        model="demo",
        max_tokens=32,
        extra_body={"temperature": 0.0},
        thinking={"type": "enabled", "budget_tokens": 16},
        messages=[{"role": "user", "content": "Think, then answer."}],
    )
    assert reply.content and reply.content[0].type == "thinking"  # the template opens the reply in a think block


def test_a_forced_tool_call_and_its_result(client: anthropic.Anthropic) -> None:
    messages = [{"role": "user", "content": "Weather in Paris?"}]
    reply = client.messages.create(
        model="demo",
        max_tokens=48,
        extra_body={"temperature": 0.0},
        tools=[WEATHER],
        tool_choice={"type": "tool", "name": "get_weather"},
        messages=messages,
    )
    calls = [block for block in reply.content if block.type == "tool_use"]
    if reply.stop_reason == "tool_use":  # the random demo may run out of tokens inside the call's arguments
        assert calls and calls[0].name == "get_weather" and isinstance(calls[0].input, dict)
        messages += [
            {"role": "assistant", "content": [block.model_dump() for block in reply.content]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": calls[0].id, "content": "sunny"}]},
        ]
    else:
        assert reply.stop_reason == "max_tokens"
        messages += [{"role": "assistant", "content": "..."}, {"role": "user", "content": "And now?"}]
    follow = client.messages.create(model="demo", max_tokens=8, tools=[WEATHER], messages=messages)
    assert follow.type == "message"
    with client.messages.stream(
        model="demo",
        max_tokens=48,
        extra_body={"temperature": 0.0},
        tools=[WEATHER],
        tool_choice={"type": "tool", "name": "get_weather"},
        messages=[{"role": "user", "content": "Weather in Paris?"}],
    ) as stream:
        final = stream.get_final_message()
    assert [b.type for b in final.content] == [b.type for b in reply.content]


def test_errors_have_anthropic_shape(server: LiveServer, client: anthropic.Anthropic) -> None:
    with pytest.raises(anthropic.NotFoundError) as missing:
        client.messages.create(model="claude-x", max_tokens=8, messages=[{"role": "user", "content": "hi"}])
    assert missing.value.body["type"] == "error" and missing.value.body["error"]["type"] == "not_found_error"
    with pytest.raises(anthropic.BadRequestError) as bad:
        client.messages.create(model="demo", max_tokens=8, messages=[])
    assert bad.value.body["error"]["type"] == "invalid_request_error"
    with pytest.raises(anthropic.BadRequestError) as long:
        client.messages.create(model="demo", max_tokens=5000, messages=[{"role": "user", "content": "hi"}])
    assert long.value.body["error"]["code"] == "context_length_exceeded"
    anonymous = anthropic.Anthropic(base_url=server.url, api_key="wrong", max_retries=0)
    with pytest.raises(anthropic.AuthenticationError):
        anonymous.messages.create(model="demo", max_tokens=8, messages=[{"role": "user", "content": "hi"}])
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"}}
    reply = httpx.post(
        server.url + "/v1/messages",
        headers={"x-api-key": KEY},
        json={"model": "demo", "max_tokens": 8, "messages": [{"role": "user", "content": [image]}]},
    )
    assert reply.status_code == 400 and reply.json()["type"] == "error"
