"""The trained demo model behind a live 2-rank server (what `./start.sh` serves), through the official `openai`
client: "Reply with OK.", reasoning on and off, a streamed reply with reasoning deltas, a tool-call round trip, and
each finish_reason where it applies."""

from __future__ import annotations

import json
from collections.abc import Iterator

import openai
import pytest
from test_api_live import LiveServer

from engine.checkpoint.demo import write_demo
from engine.train import synthetic

pytestmark = pytest.mark.slow
WEATHER = synthetic.TOOLS["get_weather"]
OK = [{"role": "user", "content": "Reply with OK."}]


@pytest.fixture(scope="module")
def client(tmp_path_factory) -> Iterator[openai.OpenAI]:
    checkpoint = write_demo(tmp_path_factory.mktemp("trained"), size="trained")
    live = LiveServer(
        checkpoint,
        tmp_path_factory.mktemp("logs"),
        ["--parallel", "2", "--context", "1024", "--max-tokens", "96", "--name", "demo"],
        key=None,
    )
    yield openai.OpenAI(base_url=live.url + "/v1", api_key="unused", max_retries=0, timeout=120)
    live.stop()


def chat(client: openai.OpenAI, messages, **options):
    return client.chat.completions.create(model="demo", messages=messages, temperature=0, **options)


def test_reply_with_ok_thinking_on_and_off(client):
    on = chat(client, OK).choices[0]
    assert "OK" in on.message.content and on.finish_reason == "stop"
    assert getattr(on.message, "reasoning_content", None)
    off = chat(client, OK, extra_body={"chat_template_kwargs": {"enable_thinking": False}}).choices[0]
    assert "OK" in off.message.content and off.finish_reason == "stop"
    assert not getattr(off.message, "reasoning_content", None)


def test_streamed_reply_has_reasoning_deltas_then_content(client):
    stream = chat(client, OK, stream=True)
    reasoning, content, finish = [], [], None
    for chunk in stream:
        if not chunk.choices:
            continue
        delta = chunk.choices[0].delta
        reasoning.append(getattr(delta, "reasoning_content", None) or "")
        content.append(delta.content or "")
        finish = chunk.choices[0].finish_reason or finish
    assert "".join(reasoning) and "OK" in "".join(content) and finish == "stop"


def test_tool_call_round_trip(client):
    messages = [{"role": "user", "content": "What is the weather in Berlin?"}]
    first = chat(client, messages, tools=[WEATHER]).choices[0]
    assert first.finish_reason == "tool_calls"
    call = first.message.tool_calls[0]
    arguments = json.loads(call.function.arguments)
    assert call.function.name == "get_weather" and isinstance(arguments["city"], str)
    assert set(arguments) <= {"city", "unit"}
    messages += [
        {"role": "assistant", "content": first.message.content, "tool_calls": [call.model_dump()]},
        {
            "role": "tool",
            "tool_call_id": call.id,
            "content": json.dumps({"city": arguments["city"], "temperature": 21, "condition": "sunny"}),
        },
    ]
    final = chat(client, messages, tools=[WEATHER]).choices[0]
    assert final.finish_reason == "stop" and final.message.content and not final.message.tool_calls


def test_length_when_the_budget_runs_out(client):
    choice = chat(client, OK, max_tokens=2).choices[0]
    assert choice.finish_reason == "length"


@pytest.mark.parametrize("choice", [{"type": "function", "function": {"name": "get_weather"}}, "required"])
def test_tool_choice_named_or_required_forces_a_call(client, choice):
    # "Reply with OK." alone never calls a tool; a forced choice makes the reply start with the call (thinking off).
    reply = chat(client, OK, tools=[WEATHER], tool_choice=choice, max_tokens=48).choices[0]
    assert reply.finish_reason == "tool_calls", reply.message
    call = reply.message.tool_calls[0]
    assert call.function.name == "get_weather" and isinstance(json.loads(call.function.arguments), dict)
    assert not getattr(reply.message, "reasoning_content", None)
    streamed = [
        c for c in chat(client, OK, tools=[WEATHER], tool_choice=choice, max_tokens=48, stream=True) if c.choices
    ]
    calls = [d for c in streamed for d in (c.choices[0].delta.tool_calls or [])]
    assert [c.function.name for c in calls if c.function.name] == ["get_weather"]  # the first delta names it
    assert "".join(c.function.arguments or "" for c in calls) == call.function.arguments  # the rest stream them
    assert streamed[-1].choices[0].finish_reason == "tool_calls"
    free = chat(client, OK, tools=[WEATHER], tool_choice="auto").choices[0]
    assert free.finish_reason == "stop" and not free.message.tool_calls


def test_tool_choice_required_among_several_starts_the_reply_with_a_call(client):
    tools = [WEATHER, synthetic.TOOLS["get_time"]]
    # the grammar lets the model choose only among the offered tools, with arguments their schemas accept
    reply = chat(client, OK, tools=tools, tool_choice="required", max_tokens=64).choices[0]
    assert reply.finish_reason == "tool_calls", reply.message
    call = reply.message.tool_calls[0]
    required = {"get_weather": "city", "get_time": "timezone"}[call.function.name]
    assert required in json.loads(call.function.arguments)
