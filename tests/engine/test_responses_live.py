"""POST /v1/responses (OpenAI's Responses API) through a live 2-rank server with the `openai` SDK: output items,
the streamed events and their order, function tools with function_call / function_call_output items, reasoning,
previous_response_id and store: false, and text.format (structured outputs)."""

from __future__ import annotations

import json
from collections.abc import Iterator

import openai
import pytest
from test_api_live import KEY, SERVER_FLAGS, LiveServer, demo_server


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    yield from demo_server(tmp_path_factory, SERVER_FLAGS)


@pytest.fixture(scope="module")
def client(server: LiveServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key=KEY, max_retries=0)


WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}


def test_a_response_and_its_stream_agree(client: openai.OpenAI) -> None:
    ask = dict(model="demo", input="Say something.", instructions="Be terse.", max_output_tokens=24, temperature=0)
    reply = client.responses.create(**ask, reasoning={"effort": "none"})
    assert reply.object == "response" and reply.status in ("completed", "incomplete")
    assert reply.usage.output_tokens > 0 and reply.usage.input_tokens > 0
    kinds, text = [], ""
    for event in client.responses.create(**ask, reasoning={"effort": "none"}, stream=True):
        kinds.append(event.type)
        if event.type == "response.output_text.delta":
            text += event.delta
        if event.type in ("response.completed", "response.incomplete"):
            final = event.response
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert kinds[-1] in ("response.completed", "response.incomplete")
    assert text == reply.output_text == final.output_text
    assert [item.type for item in final.output] == [item.type for item in reply.output]


def test_reasoning_comes_back_as_a_reasoning_item(client: openai.OpenAI) -> None:
    reply = client.responses.create(
        model="demo", input="Think, then answer.", max_output_tokens=32, temperature=0, reasoning={"effort": "high"}
    )
    assert reply.output and reply.output[0].type == "reasoning"


def test_function_calls_and_previous_response_id(client: openai.OpenAI) -> None:
    first = client.responses.create(
        model="demo",
        input="Weather in Paris?",
        tools=[WEATHER],
        tool_choice={"type": "function", "name": "get_weather"},
        max_output_tokens=48,
        temperature=0,
    )
    calls = [item for item in first.output if item.type == "function_call"]
    if calls:  # the random demo may run out of tokens inside the call's arguments
        assert calls[0].name == "get_weather" and calls[0].arguments.startswith("{")
        follow_up = [{"type": "function_call_output", "call_id": calls[0].call_id, "output": "sunny"}]
    else:
        assert first.status == "incomplete"
        follow_up = "And now?"
    second = client.responses.create(
        model="demo", previous_response_id=first.id, input=follow_up, tools=[WEATHER], max_output_tokens=8
    )
    assert second.previous_response_id == first.id and second.usage.input_tokens > first.usage.input_tokens
    unstored = client.responses.create(model="demo", input="hi", max_output_tokens=4, store=False)
    with pytest.raises(openai.NotFoundError):
        client.responses.create(model="demo", input="again", previous_response_id=unstored.id, max_output_tokens=4)


def test_text_format_json_schema_shapes_the_output_text(client: openai.OpenAI) -> None:
    schema = {
        "type": "object",
        "properties": {"answer": {"type": "integer", "minimum": 0, "maximum": 99}, "sure": {"type": "boolean"}},
        "required": ["answer", "sure"],
        "additionalProperties": False,
    }
    text = {"format": {"type": "json_schema", "name": "answer", "schema": schema, "strict": True}}
    reply = client.responses.create(
        model="demo", input="hi", max_output_tokens=96, text=text, temperature=0, reasoning={"effort": "none"}
    )
    assert reply.status == "completed", reply
    parsed = json.loads(reply.output_text)
    assert set(parsed) == {"answer", "sure"} and 0 <= parsed["answer"] <= 99 and isinstance(parsed["sure"], bool)
    assert reply.text.format.type == "json_schema"
    with pytest.raises(openai.BadRequestError) as refused:
        client.responses.create(
            model="demo",
            input="hi",
            max_output_tokens=4,
            text={"format": {"type": "json_schema", "name": "x", "schema": {"type": 5}}},
        )
    assert refused.value.body["param"] == "text.format" and refused.value.body["code"] == "invalid_format"
