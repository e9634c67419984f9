"""Structured outputs through a live 2-rank server on the trained demo (copy drafts on), with the official `openai`
and `anthropic` SDKs: 20 of 20 json_schema replies validate, regex / choice / grammar are obeyed in
chat and completions (json_object's free strings may run to max_tokens on the demo: its grammar is
checked in test_structured.py), forced tool calls always carry arguments their tool's schema accepts, Anthropic's
output_config.format shapes the text — and batched replies equal the same requests sent alone.

The demo cannot really answer in JSON (it was never trained to): what these show is that the grammar holds whatever
the model would rather write, which is the promise structured outputs make."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import anthropic
import jsonschema
import openai
import pytest
from test_api_live import LiveServer
from test_structured import SCHEMA

from engine.checkpoint.demo import write_demo
from engine.train import synthetic

pytestmark = pytest.mark.slow
ASK = [{"role": "user", "content": "What is the weather in Berlin? Answer in JSON."}]
TOOLS = [synthetic.TOOLS[name] for name in ("get_weather", "send_email", "convert_currency")]


@pytest.fixture(scope="module")
def live(tmp_path_factory) -> Iterator[LiveServer]:
    checkpoint = write_demo(tmp_path_factory.mktemp("trained"), size="trained")
    flags = ["--parallel", "4", "--context", "1024", "--max-tokens", "200", "--name", "demo", "--drafter", "copy"]
    server = LiveServer(checkpoint, tmp_path_factory.mktemp("logs"), flags, key=None)
    yield server
    server.stop()


@pytest.fixture(scope="module")
def client(live) -> openai.OpenAI:
    return openai.OpenAI(base_url=live.url + "/v1", api_key="unused", max_retries=0, timeout=180)


def json_reply(client: openai.OpenAI, seed: int):
    return client.chat.completions.create(
        model="demo",
        messages=ASK,
        response_format={"type": "json_schema", "json_schema": {"name": "weather", "schema": SCHEMA, "strict": True}},
        seed=seed,
        temperature=0.0 if seed == 0 else 0.9,
        extra_body={"return_token_ids": True},
    )


def test_twenty_json_schema_replies_validate_and_batched_equals_alone(client):
    with ThreadPoolExecutor(4) as pool:  # four lanes busy at once
        batched = list(pool.map(lambda seed: json_reply(client, seed), range(20)))
    for reply in batched:
        choice = reply.choices[0]
        assert choice.finish_reason == "stop", choice
        jsonschema.validate(json.loads(choice.message.content), SCHEMA)
        assert choice.message.reasoning_content  # thinking ran first, free; the format held after it
    for seed in (0, 7, 13):  # alone, the same tokens
        assert json_reply(client, seed).choices[0].token_ids == batched[seed].choices[0].token_ids


def test_regex_choice_and_grammar_in_chat_and_completions(client):
    hello = [{"role": "user", "content": "Hello"}]
    for seed in range(4):
        options = {"model": "demo", "messages": hello, "seed": seed, "temperature": 0.9, "max_tokens": 64}
        regex = client.chat.completions.create(
            **options, extra_body={"structured_outputs": {"regex": "(yes|no), [0-9]{3}"}}
        )
        assert re.fullmatch("(yes|no), [0-9]{3}", regex.choices[0].message.content)
        choice = client.chat.completions.create(**options, extra_body={"guided_choice": ["red", "green", "blue"]})
        assert choice.choices[0].message.content in ("red", "green", "blue")
        grammar = client.chat.completions.create(**options, extra_body={"guided_grammar": 'root ::= "A" [0-9]+ "B"'})
        assert re.fullmatch("A[0-9]+B", grammar.choices[0].message.content)
        completion = client.completions.create(
            model="demo",
            prompt="The year was",
            max_tokens=8,
            seed=seed,
            temperature=0.9,
            extra_body={"guided_regex": "[0-9]{4}"},
        )
        assert re.fullmatch("[0-9]{4}", completion.choices[0].text)


@pytest.mark.parametrize("choice", ["required", "named"])
def test_forced_tool_calls_always_carry_valid_arguments(client, choice):
    schemas = {tool["function"]["name"]: tool["function"]["parameters"] for tool in TOOLS}
    ask = [{"role": "user", "content": "Send an email to ana@example.com about lunch."}]
    for seed in range(6):
        tool_choice = (
            "required" if choice == "required" else {"type": "function", "function": {"name": "convert_currency"}}
        )
        reply = client.chat.completions.create(
            model="demo", messages=ask, tools=TOOLS, tool_choice=tool_choice, seed=seed, temperature=1.0, max_tokens=160
        ).choices[0]
        assert reply.finish_reason == "tool_calls" and reply.message.tool_calls, reply
        for call in reply.message.tool_calls:
            jsonschema.validate(json.loads(call.function.arguments), schemas[call.function.name])
            if choice == "named":
                assert call.function.name == "convert_currency"


def test_anthropic_output_config_format_shapes_the_text(live):
    client = anthropic.Anthropic(base_url=live.url, api_key="unused", max_retries=0, timeout=180)
    for where in ("output_config", "output_format"):
        fmt = {"type": "json_schema", "schema": SCHEMA}
        reply = client.messages.create(
            model="demo",
            max_tokens=200,
            messages=ASK,
            thinking={"type": "enabled", "budget_tokens": 1024},
            extra_body={where: {"format": fmt} if where == "output_config" else fmt},
        )
        assert reply.stop_reason == "end_turn", reply
        assert [block.type for block in reply.content][0] == "thinking"
        text = "".join(block.text for block in reply.content if block.type == "text")
        jsonschema.validate(json.loads(text), SCHEMA)
    with pytest.raises(anthropic.BadRequestError) as refused:
        client.messages.create(
            model="demo",
            max_tokens=8,
            messages=ASK,
            extra_body={"output_config": {"format": {"type": "json_schema", "schema": {"type": 5}}}},
        )
    assert refused.value.body["error"]["type"] == "invalid_request_error"
    assert "output_config.format" in refused.value.body["error"]["message"]


def test_tool_arguments_stream_as_they_are_written_in_every_api(client, live):
    """Chat, Responses and Messages stream a forced call's arguments in several deltas that add up to the arguments
    the non-streamed reply carries (the same request, greedy)."""
    ask = [{"role": "user", "content": "Send an email to ana@example.com about lunch."}]
    email = synthetic.TOOLS["send_email"]
    named = {"type": "function", "function": {"name": "send_email"}}
    whole = client.chat.completions.create(
        model="demo", messages=ask, tools=[email], tool_choice=named, temperature=0, max_tokens=120
    )
    arguments = whole.choices[0].message.tool_calls[0].function.arguments
    deltas, heads = [], []
    for chunk in client.chat.completions.create(
        model="demo", messages=ask, tools=[email], tool_choice=named, temperature=0, max_tokens=120, stream=True
    ):
        for call in (chunk.choices[0].delta.tool_calls or []) if chunk.choices else []:
            if call.id:
                heads.append((call.index, call.function.name))
            deltas.append(call.function.arguments or "")
    assert heads == [(0, "send_email")] and len([d for d in deltas if d]) > 2
    assert "".join(deltas) == arguments and set(json.loads(arguments)) >= {"to", "subject"}

    function = {"type": "function", "name": "send_email", "parameters": email["function"]["parameters"]}
    events = list(
        client.responses.create(
            model="demo", input=ask, tools=[function], tool_choice={"type": "function", "name": "send_email"},
            temperature=0, max_output_tokens=120, stream=True,
        )
    )  # fmt: skip
    pieces = [e.delta for e in events if e.type == "response.function_call_arguments.delta"]
    done = next(e for e in events if e.type == "response.function_call_arguments.done")
    assert len(pieces) > 2 and "".join(pieces) == done.arguments == arguments

    anthropic_client = anthropic.Anthropic(base_url=live.url, api_key="unused", max_retries=0, timeout=180)
    tool = {"name": "send_email", "description": "Send an email.", "input_schema": email["function"]["parameters"]}
    with anthropic_client.messages.stream(
        model="demo", max_tokens=120, messages=ask, tools=[tool], tool_choice={"type": "tool", "name": "send_email"},
        extra_body={"temperature": 0.0},
    ) as stream:  # fmt: skip
        partial = [
            e.delta.partial_json
            for e in stream
            if e.type == "content_block_delta" and e.delta.type == "input_json_delta"
        ]
        final = stream.get_final_message()
    assert len(partial) > 2 and json.loads("".join(partial)) == json.loads(arguments)
    assert [b.input for b in final.content if b.type == "tool_use"] == [json.loads(arguments)]


def test_the_trained_demo_through_responses_and_messages(client, live):
    """The plain paths on the trained demo: Responses answers "Reply with OK." and continues with
    previous_response_id; Messages answers it after a thinking block, and count_tokens counts its prompt."""
    first = client.responses.create(model="demo", input="Reply with OK.", temperature=0, max_output_tokens=96)
    assert first.status == "completed" and "OK" in first.output_text
    assert [item.type for item in first.output][0] == "reasoning"
    second = client.responses.create(
        model="demo", input="Reply with OK.", previous_response_id=first.id, temperature=0, max_output_tokens=96
    )
    assert "OK" in second.output_text and second.usage.input_tokens > first.usage.input_tokens
    anthropic_client = anthropic.Anthropic(base_url=live.url, api_key="unused", max_retries=0, timeout=180)
    ask = {"model": "demo", "messages": [{"role": "user", "content": "Reply with OK."}]}
    reply = anthropic_client.messages.create(
        **ask, max_tokens=96, thinking={"type": "enabled", "budget_tokens": 1024}, extra_body={"temperature": 0.0}
    )
    assert [block.type for block in reply.content] == ["thinking", "text"] and "OK" in reply.content[1].text
    assert reply.stop_reason == "end_turn"
    counted = anthropic_client.messages.count_tokens(**ask, thinking={"type": "enabled", "budget_tokens": 1024})
    assert counted.input_tokens == reply.usage.input_tokens + (reply.usage.cache_read_input_tokens or 0)
