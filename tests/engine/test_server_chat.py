"""Chat without a server: thinking options, template rendering of tool turns, the reply splitter and GLM tool-call
parsing typed by the offered schema (fed in every possible split, as a stream would deliver it)."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from engine.server.chat import ReplyParser, render, starts_in_reasoning, thinking_options
from engine.server.errors import APIError
from engine.server.images import IMAGE_MARKUP, media_parts, prepare_media
from engine.server.protocol import ChatCompletionRequest
from engine.server.template import load_chat_template
from engine.server.tools import offered_tools, parse_call, type_value

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string"},
                "days": {"type": "integer"},
                "metric": {"type": "boolean"},
                "hours": {"type": "array"},
                "where": {"type": "object"},
                "note": {"type": ["string", "null"]},
            },
        },
    },
}
TOOLS = offered_tools([WEATHER])
CALL = (
    "<tool_call>get_weather<arg_key>city</arg_key><arg_value>Paris 42</arg_value><arg_key>days</arg_key>"
    "<arg_value>3</arg_value><arg_key>metric</arg_key><arg_value>False</arg_value><arg_key>hours</arg_key>"
    '<arg_value>[1, 2]</arg_value><arg_key>where</arg_key><arg_value>{"lat": 1.5}</arg_value></tool_call>'
)


def feed_in_pieces(parser: ReplyParser, text: str, cut: int) -> list:
    pieces = parser.feed(text[:cut]) + parser.feed(text[cut:]) + parser.finish()
    merged: dict[str, str] = {}
    for piece in pieces:
        if not piece.kind.startswith("call_"):
            merged[piece.kind] = merged.get(piece.kind, "") + piece.text
    return [merged, parser.calls]


def test_call_arguments_are_typed_by_the_schema() -> None:
    call = parse_call(CALL, TOOLS)
    assert call is not None and call.name == "get_weather" and call.id.startswith("call_") and len(call.id) == 29
    assert json.loads(call.arguments) == {
        "city": "Paris 42",
        "days": 3,
        "metric": False,
        "hours": [1, 2],
        "where": {"lat": 1.5},
    }


def test_a_call_to_a_tool_not_offered_stays_text() -> None:
    block = CALL.replace("get_weather", "delete_everything")
    assert parse_call(block, TOOLS) is None
    parser = ReplyParser(False, TOOLS)
    merged, calls = feed_in_pieces(parser, "Sure. " + block, 10)
    assert calls == [] and merged["content"] == "Sure. " + block


@pytest.mark.parametrize(
    "block,arguments",
    [
        # a value that does not fit its type goes on as the string it was (the grammar of a forced call prevents it)
        (CALL.replace("<arg_value>3</arg_value>", "<arg_value>three</arg_value>"), {"days": "three"}),
        (CALL.replace("</arg_key><arg_value>Paris 42", "</arg_key>Paris 42"), {"city": None}),  # a key with no value
        (CALL.replace("</arg_value><arg_key>days", "</arg_value> stray words <arg_key>days"), {}),  # stray text
    ],
)
def test_a_call_to_an_offered_tool_is_a_call_even_when_imperfect(block: str, arguments: dict) -> None:
    expected = {"city": "Paris 42", "days": 3, "metric": False, "hours": [1, 2], "where": {"lat": 1.5}}
    for key, value in arguments.items():
        if value is None:
            expected.pop(key)
        else:
            expected[key] = value
    call = parse_call(block, TOOLS)
    assert call is not None and json.loads(call.arguments) == expected


def streamed(text: str, cuts: list[int]) -> tuple[list, list]:
    parser = ReplyParser(False, TOOLS)
    bounds = [0, *cuts, len(text)]
    pieces = [p for a, b in zip(bounds, bounds[1:]) for p in parser.feed(text[a:b])] + parser.finish()
    return pieces, parser.calls


def test_arguments_stream_as_they_are_written_at_every_boundary() -> None:
    whole = json.loads(parse_call(CALL, TOOLS).arguments)
    text = "Let me look. " + CALL + CALL.replace("Paris 42", 'Köln "Süd"\n')  # two calls in one reply
    for cut in range(len(text) + 1):
        pieces, calls = streamed(text, [cut])
        kinds = [p.kind for p in pieces if p.kind.startswith("call_")]
        assert kinds[0] == "call_open" and kinds.count("call_open") == kinds.count("call_close") == 2, cut
        for index, call in enumerate(calls):
            deltas = "".join(p.text for p in pieces if p.kind == "call_args" and p.index == index)
            assert deltas == call.arguments, cut
            opened = next(p for p in pieces if p.kind == "call_open" and p.index == index)
            assert (opened.call.id, opened.call.name) == (call.id, call.name)
        assert json.loads(calls[0].arguments) == whole
        assert json.loads(calls[1].arguments) == {**whole, "city": 'Köln "Süd"\n'}


def test_a_string_argument_streams_before_its_value_closes() -> None:
    parser = ReplyParser(False, TOOLS)
    pieces = parser.feed("<tool_call>get_weather<arg_key>city</arg_key><arg_value>Par")
    assert [p.kind for p in pieces] == ["call_open", "call_args"] and pieces[-1].text == '{"city": "Par'
    assert parser.feed("is</arg_va")[0].text == "is"  # the start of </arg_value> is held back
    assert parser.feed("lue><arg_key>days</arg_key><arg_value>1")[0].text == '", "days": '  # a number: once whole
    assert parser.feed("2</arg_value></tool_call>")[0].text == "12}"


def test_a_reply_that_ends_inside_a_call_closes_it() -> None:
    for text in (
        "<tool_call>get_weather<arg_key>city</arg_key><arg_value>Par",
        "<tool_call>get_weather<arg_key>days</arg_key><arg_value>4",
        "<tool_call>get_weather<arg_key>ci",
        "<tool_call>get_weather\n",
    ):
        pieces, calls = streamed(text, [len(text) // 2])
        assert len(calls) == 1 and isinstance(json.loads(calls[0].arguments), dict), text
        assert "".join(p.text for p in pieces if p.kind == "call_args") == calls[0].arguments
    _, calls = streamed("<tool_call>get_wea", [5])  # the name never completed: text
    assert calls == []


def test_type_value_edge_cases() -> None:
    assert type_value("None", {"type": ["string", "null"]}) == (True, None)
    assert type_value("null", {"type": "string"}) == (True, "null")
    assert type_value("2.0", {"type": "integer"}) == (True, 2)
    assert type_value("true", {"type": "integer"}) == (False, None)
    assert type_value('{"a": 1}', None) == (True, {"a": 1})
    assert type_value("plain words", None) == (True, "plain words")


def test_reply_splits_reasoning_content_and_calls_at_every_boundary() -> None:
    text = "I should check the weather.</think>Let me look.\n" + CALL
    for cut in range(len(text) + 1):
        merged, calls = feed_in_pieces(ReplyParser(True, TOOLS), text, cut)
        assert merged == {"reasoning": "I should check the weather.", "content": "Let me look.\n"}, cut
        assert [c.name for c in calls] == ["get_weather"]


def test_without_tools_a_call_is_text_and_an_unclosed_think_is_reasoning() -> None:
    merged, calls = feed_in_pieces(ReplyParser(False, {}), "Hi " + CALL, 5)
    assert calls == [] and merged == {"content": "Hi " + CALL}
    merged, _ = feed_in_pieces(ReplyParser(True, TOOLS), "thinking until the end </thi", 7)
    assert merged == {"reasoning": "thinking until the end </thi"}


def test_thinking_options_map_effort_and_respect_explicit_switches() -> None:
    assert thinking_options(True, None, None) == {"enable_thinking": True}
    assert thinking_options(True, "medium", None) == {"enable_thinking": True, "reasoning_effort": "high"}
    assert thinking_options(True, "xhigh", None)["reasoning_effort"] == "max"
    assert thinking_options(True, "none", None) == {"enable_thinking": False}
    assert thinking_options(False, "low", None)["enable_thinking"] is False
    assert thinking_options(False, None, {"enable_thinking": True}) == {"enable_thinking": True}
    assert thinking_options(True, None, {"reasoning_effort": "xhigh"})["reasoning_effort"] == "max"
    with pytest.raises(APIError):
        thinking_options(True, "extreme", None)
    with pytest.raises(APIError):  # regression: the string "no" is truthy and used to turn thinking on
        thinking_options(False, None, {"enable_thinking": "no"})


def test_tool_round_trip_renders_the_call_and_the_observation() -> None:
    body = ChatCompletionRequest.model_validate(
        {
            "messages": [
                {"role": "developer", "content": "Be brief."},
                {"role": "user", "content": "Weather in Paris?"},
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {
                            "id": "call_1",
                            "type": "function",
                            "function": {"name": "get_weather", "arguments": '{"city": "Paris", "days": 2}'},
                        }
                    ],
                },
                {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 21 C"},
            ],
            "tools": [WEATHER],
        }
    )
    prompt = render(load_chat_template(), body.messages, body.tools, True, "low", None)
    assert "<|system|>Be brief." in prompt and "None" not in prompt.split("<|user|>")[1]
    assert (
        "<tool_call>get_weather<arg_key>city</arg_key><arg_value>Paris</arg_value><arg_key>days</arg_key>"
        "<arg_value>2</arg_value></tool_call>"
    ) in prompt
    assert "<|observation|><tool_response>sunny, 21 C</tool_response>" in prompt
    assert "Reasoning Effort: Low" in prompt and starts_in_reasoning(prompt)
    off = render(load_chat_template(), body.messages, body.tools, True, "none", None)
    assert not starts_in_reasoning(off) and off.endswith("</think>")


def test_image_parts_render_as_markup_and_other_parts_are_refused() -> None:
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
    text = {"type": "text", "text": "what is this?"}
    body = ChatCompletionRequest.model_validate({"messages": [{"role": "user", "content": [image, text]}]})
    prompt = render(load_chat_template(), body.messages, None, True, None, None)
    assert "<|user|>" + IMAGE_MARKUP + "what is this?" in prompt
    # without VISION the image is refused (400), whatever the rest of the request
    with pytest.raises(APIError) as refused:
        prepare_media(None, media_parts(body.messages))
    assert refused.value.status == 400 and "VISION=0" in refused.value.message
    audio = {"type": "input_audio", "input_audio": {"data": "", "format": "wav"}}
    with pytest.raises(ValidationError, match="input_audio"):  # a 400 naming the part's type (server/errors.py)
        ChatCompletionRequest.model_validate({"messages": [{"role": "user", "content": [audio]}]})


def test_parallel_tool_calls_false_keeps_the_first_call_only() -> None:
    text = "Two things. " + CALL + " and then " + CALL.replace("Paris 42", "Rome")
    for cut in (0, len(text) // 2, len(text) - 3):
        parser = ReplyParser(False, TOOLS, single_call=True)
        pieces = parser.feed(text[:cut]) + parser.feed(text[cut:]) + parser.finish()
        assert [c.name for c in parser.calls] == ["get_weather"] and "Paris 42" in parser.calls[0].arguments
        assert "".join(p.text for p in pieces if p.kind == "content") == "Two things. "
