"""Structured outputs below HTTP: the formats the server builds (engine/server/formats.py) accept what they must and
refuse what they must, compiled by the real xgrammar against the trained demo's tokenizer; and replies under formats
through the real Scheduler + StepExecutor obey them, with drafts equal to without, and batched equal to alone."""

from __future__ import annotations

import json
import re
import threading

import jsonschema
import pytest
import torch
from test_drafts import demo  # noqa: F401  (the trained demo model, its tokenizer and end tokens)
from test_mtp import demo_mtp  # noqa: F401  (the same with its MTP layer)
from test_scheduler import Collector

from engine.checkpoint.demo import TRAINED
from engine.parallel import ParallelGroup
from engine.runner.executor import StepExecutor
from engine.sampling import SamplingParams
from engine.scheduler import Finished, Request, Scheduler, Token
from engine.server import formats
from engine.server.protocol import Tool
from engine.structured import Constraint, FormatError, Grammars
from engine.train import synthetic

WEATHER = Tool.model_validate(synthetic.TOOLS["get_weather"])
EMAIL = Tool.model_validate(synthetic.TOOLS["send_email"])
SCHEMA = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 16},
        "days": {"type": "integer", "minimum": 0, "maximum": 30},
        "sunny": {"type": "boolean"},
        "unit": {"enum": ["celsius", "fahrenheit"]},
    },
    "required": ["city", "days", "sunny", "unit"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def grammars():
    from tokenizers import Tokenizer

    return Grammars(Tokenizer.from_file(str(TRAINED / "tokenizer.json")))


def follows(grammars: Grammars, fmt: dict, text: str) -> bool:
    """Whether `text` is a whole reply under `fmt` (the end token allowed right after it)."""
    import xgrammar

    matcher = xgrammar.GrammarMatcher(grammars.compile(formats.spec_text(fmt)))
    return bool(matcher.accept_string(text)) and bool(matcher.is_completed())


def test_a_forced_call_takes_only_arguments_that_fit_its_tool(grammars):
    named = formats.forced_call_format([WEATHER], "<tool_call>get_weather", parallel=False)
    assert follows(grammars, named, "<arg_key>city</arg_key><arg_value>Oslo</arg_value></tool_call>")
    assert follows(
        grammars,
        named,
        "<arg_key>city</arg_key><arg_value>Oslo</arg_value><arg_key>unit</arg_key><arg_value>celsius</arg_value>"
        "</tool_call>",
    )
    assert not follows(grammars, named, "<arg_key>unit</arg_key><arg_value>celsius</arg_value></tool_call>")  # no city
    assert not follows(  # a unit outside the enum
        grammars,
        named,
        "<arg_key>city</arg_key><arg_value>Oslo</arg_value><arg_key>unit</arg_key><arg_value>kelvin</arg_value>"
        "</tool_call>",
    )
    assert not follows(grammars, named, "<arg_key>town</arg_key><arg_value>Oslo</arg_value></tool_call>")
    # required among several: the model writes the name, then that tool's arguments; parallel: more calls may follow
    either = formats.forced_call_format([WEATHER, EMAIL], "<tool_call>", parallel=True)
    email = "send_email<arg_key>to</arg_key><arg_value>a@b.c</arg_value><arg_key>subject</arg_key><arg_value>hi</arg_value></tool_call>"
    assert follows(grammars, either, email)
    assert follows(
        grammars, either, email + "<tool_call>get_weather<arg_key>city</arg_key><arg_value>Rome</arg_value></tool_call>"
    )
    assert not follows(grammars, either, "send_email<arg_key>to</arg_key><arg_value>a@b.c</arg_value></tool_call>")
    assert not follows(grammars, either, "get_time<arg_key>timezone</arg_key><arg_value>UTC</arg_value></tool_call>")
    alone = formats.forced_call_format([WEATHER, EMAIL], "<tool_call>", parallel=False)
    assert not follows(
        grammars, alone, email + "<tool_call>get_weather<arg_key>city</arg_key><arg_value>Rome</arg_value></tool_call>"
    )


def test_content_formats_and_thinking_first(grammars):
    schema = formats.json_format(SCHEMA, "response_format")
    good = '{"city": "Oslo", "days": 3, "sunny": true, "unit": "celsius"}'
    assert follows(grammars, schema, good)
    assert not follows(grammars, schema, '{"city": "Oslo", "days": 31, "sunny": true, "unit": "celsius"}')
    assert not follows(grammars, schema, '{"city": "Oslo", "days": 3, "sunny": true}')
    assert follows(grammars, formats.after_thinking(schema), "cold up north</think>" + good)
    assert not follows(grammars, formats.after_thinking(schema), good)  # the think block must close first
    assert follows(grammars, formats.choice_format(["red", "green"]), "green")
    assert not follows(grammars, formats.choice_format(["red", "green"]), "blue")
    assert follows(grammars, {"type": "regex", "pattern": "(yes|no), [0-9]{3}"}, "no, 802")
    assert not follows(grammars, {"type": "regex", "pattern": "(yes|no), [0-9]{3}"}, "no, 80")
    assert follows(grammars, {"type": "grammar", "grammar": 'root ::= "A" [0-9]+ "B"'}, "A12B")
    # whitespace runs are capped (8), and disable_any_whitespace keeps single spaces
    assert follows(grammars, formats.json_format(None, "j"), '{\n    "a": [\n      1\n    ]\n}')
    assert not follows(grammars, formats.json_format(None, "j"), '{"a":          1}')
    assert not follows(grammars, formats.json_format(None, "j", whitespace=1), '{"a":  1}')
    # under tool_choice auto with tools, a response_format allows the content or calls instead
    either = {"type": "or", "elements": [schema, formats.calls_format([WEATHER])]}
    assert follows(grammars, either, good)
    assert follows(
        grammars, either, "<tool_call>get_weather<arg_key>city</arg_key><arg_value>Oslo</arg_value></tool_call>"
    )


def test_what_cannot_be_compiled_says_why(grammars):
    for fmt, words in (
        ({"type": "regex", "pattern": "(yes"}, "parenthesis is not closed"),
        (formats.json_format({"type": 5}, "j"), "Type should be a string"),
        ({"type": "grammar", "grammar": "root ::= "}, "EBNF parser error"),
    ):
        with pytest.raises(FormatError, match=re.escape(words)) as raised:
            grammars.compile(formats.spec_text(fmt))
        assert "/project/" not in str(raised.value)  # no C++ source positions in what a client reads


def test_the_compiled_grammar_cache_is_bounded():
    from tokenizers import Tokenizer

    small = Grammars(Tokenizer.from_file(str(TRAINED / "tokenizer.json")), cache_bytes=200_000)
    for i in range(40):
        schema = {"type": "object", "properties": {f"k{i}_{j}": {"type": "integer"} for j in range(6)}}
        small.compile(formats.spec_text(formats.json_format(schema, "j")))
    assert 0 < small.cached_bytes() <= 200_000


def test_a_constraint_masks_and_cuts_drafts(grammars):
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(TRAINED / "tokenizer.json"))
    end = tokenizer.token_to_id("<|endoftext|>")
    constraint = Constraint(grammars.compile(formats.spec_text(formats.choice_format(["yes", "no"]))), frozenset({end}))
    logits = torch.zeros(grammars.vocab_size + 7)  # a padded lm_head: ids past the tokenizer never allowed
    allowed = torch.isfinite(constraint.mask(logits)).nonzero().flatten().tolist()
    assert allowed and all(tokenizer.decode([t]) in ("y", "ye", "yes", "n", "no") for t in allowed)
    yes = tokenizer.encode("yes", add_special_tokens=False).ids
    assert constraint.admissible([*yes, end, end]) == len(yes) + 1  # nothing after the end token
    assert constraint.admissible(tokenizer.encode("maybe", add_special_tokens=False).ids) == 0
    for token in yes:  # admissible left the place unchanged: the whole word is still ahead
        assert constraint.accept(token)
    assert torch.isfinite(constraint.mask(logits)).nonzero().flatten().tolist() == [end]
    assert constraint.accept(end) and constraint.ended


def test_the_text_a_format_forces_is_drafted(grammars):
    """`Constraint.forced`: the tokens a format forces from here (a JSON key once its quote is open, a tool call's
    closing markup), capped at the room given, none once the format is complete; the place is unchanged."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(TRAINED / "tokenizer.json"))
    end = tokenizer.token_to_id("<|endoftext|>")
    schema = {"type": "object", "properties": {"forecast": {"type": "string"}}, "required": ["forecast"]}
    constraint = Constraint(grammars.compile(formats.spec_text(formats.json_format(schema, "j"))), frozenset({end}))
    assert constraint.forced(3) == []  # whitespace may come before the opening brace
    for token in tokenizer.encode('{"', add_special_tokens=False).ids:
        assert constraint.accept(token)
    forced = constraint.forced(8)
    assert forced and tokenizer.decode(forced) == "forecast"[: len(tokenizer.decode(forced))], forced
    assert constraint.forced(1) == forced[:1] and constraint.forced(0) == []
    for token in forced:  # forced() left the place unchanged: the key is still ahead, and takes the forced tokens
        assert constraint.accept(token)
    choice = Constraint(grammars.compile(formats.spec_text(formats.choice_format(["alpha beta"]))), frozenset({end}))
    whole = choice.forced(16)
    assert whole and "alpha beta".startswith(tokenizer.decode(whole))
    for token in tokenizer.encode("alpha beta", add_special_tokens=False).ids:
        assert choice.accept(token)
    assert choice.forced(4) == []  # only the end token may follow, and it is never drafted as forced text
    assert choice.accept(end) and choice.ended and choice.forced(4) == []


# -- the serving path: Scheduler + StepExecutor with formats, drafted ≡ serial and batched ≡ alone ----------------


def cases(tokenizer):
    """(prompt ids, format, check on the reply's text) — chat prompts of the demo's kinds under each kind of format;
    a prompt that opens a think block gets the format after it, as the server does, and its check reads what
    follows the block's end (the first `</think>`: a JSON string may hold that text too)."""
    prompts = [synthetic.prompt(e) for e in synthetic.examples("eval", 11, 6)]
    checks = [
        (formats.json_format(SCHEMA, "j"), lambda text: jsonschema.validate(json.loads(text), SCHEMA) is None),
        ({"type": "regex", "pattern": "(yes|no), [0-9]{3}"}, lambda text: re.fullmatch("(yes|no), [0-9]{3}", text)),
        (
            formats.choice_format(["alpha beta", "gamma", "delta delta delta"]),
            lambda text: text in ("alpha beta", "gamma", "delta delta delta"),
        ),
        (formats.json_format(None, "j"), lambda text: json.loads(text) is not None or text == "null"),
    ]
    out = []
    for i, text in enumerate(prompts * 2):
        fmt, check = checks[i % len(checks)]
        thinking = text.rstrip().endswith("<think>")
        content = (lambda reply, c=check: c(reply.split("</think>", 1)[1])) if thinking else check
        out.append((tokenizer.encode(text).ids, formats.after_thinking(fmt) if thinking else fmt, content))
    return out


def serve_formats(
    model, eos, grammars, todo, draft: bool, parallel: int, graphs: bool = False, drafter: str = "copy"
) -> tuple[list[list[int]], dict]:
    executor = StepExecutor(model, model.make_pool(4096, "fp32"), lanes=parallel, window=4, graphs=graphs)
    sched = Scheduler(
        executor, ParallelGroup.single(), parallel=parallel, max_queued=len(todo), prefill_chunk=32,
        heartbeat_s=0.05, drafter=drafter, draft_tokens=3,
    )  # fmt: skip
    sched.start()
    sinks = []
    try:
        for i, (ids, fmt, _) in enumerate(todo):
            sink = Collector()
            params = SamplingParams(temperature=0.0 if i % 3 == 0 else 0.9, seed=i, max_tokens=120)
            constraint = Constraint(grammars.compile(formats.spec_text(fmt)), eos)
            sched.submit(Request(f"r{i}", ids, params, sink, eos, draft=draft, constraint=constraint))
            sinks.append(sink)
        for sink in sinks:
            assert sink.done.wait(300)
            assert isinstance(sink.end, Finished) and sink.end.reason == "stop", sink.end
    finally:
        sched.stop()
    return [sink.tokens for sink in sinks], sched.stats()["drafts"]


@torch.no_grad()
def test_replies_under_formats_obey_them_drafted_equal_serial_batched_equal_alone(
    demo,  # noqa: F811
    grammars,
    graphs: bool = False,
):
    model, tokenizer, eos = demo
    todo = cases(tokenizer)
    alone, _ = serve_formats(model, eos, grammars, todo, draft=False, parallel=1, graphs=graphs)
    batched, _ = serve_formats(model, eos, grammars, todo, draft=False, parallel=4, graphs=graphs)
    drafted, counts = serve_formats(model, eos, grammars, todo, draft=True, parallel=4, graphs=graphs)
    assert counts["accepted"] > 0, counts  # drafts were verified under formats, and some were kept
    assert counts["by_drafter"]["format"]["accepted"] > 0, counts  # forced text among them
    for i, ((_, _, check), a, b, c) in enumerate(zip(todo, alone, batched, drafted)):
        assert a == b == c, f"case {i}"
        text = tokenizer.decode([t for t in a if t not in eos], skip_special_tokens=False)
        assert check(text), (i, text)


@torch.no_grad()
def test_forced_text_and_mtp_drafts_share_steps_under_formats(demo_mtp, grammars):  # noqa: F811
    """mtp+copy under formats: a lane whose format forces text drafts it (however short) while lanes with free text
    draft with the MTP layer in the same steps; every reply is the one served without drafts."""
    model, tokenizer, eos = demo_mtp
    todo = cases(tokenizer)
    serial, _ = serve_formats(model, eos, grammars, todo, draft=False, parallel=4, drafter="mtp+copy")
    drafted, counts = serve_formats(model, eos, grammars, todo, draft=True, parallel=4, drafter="mtp+copy")
    assert serial == drafted
    accepted = {name: c["accepted"] for name, c in counts["by_drafter"].items()}
    assert accepted["format"] > 0 and accepted["mtp"] > 0, counts


def test_words_are_the_allowed_tokens_and_none_past_the_vocabulary(demo, grammars):  # noqa: F811
    """`Constraint.words` (the MTP layer's draft-1 mask) allows exactly what `allowed` does — for a format that
    allows nearly everything (free thinking text before a JSON reply: xgrammar sets the last word's bits past the
    tokenizer's vocabulary, which the demo's 2,657 tokens leave unaligned) and for a narrow one — and is None where
    the format allows every token."""
    import numpy as np

    _, tokenizer, eos = demo
    think = formats.after_thinking(formats.json_format(SCHEMA, "j"))
    cases = [(think, []), ({"type": "regex", "pattern": "(yes|no), [0-9]{3}"}, []), (think, ["</think>"])]
    for fmt, text in cases:
        constraint = Constraint(grammars.compile(formats.spec_text(fmt)), eos)
        for token in tokenizer.encode("".join(text), add_special_tokens=False).ids:
            assert constraint.accept(token)
        allowed, words = constraint.allowed(), constraint.words()
        assert constraint.vocab % 32 and not bool(allowed.all())  # a last word the trim matters for
        assert words is not None
        bits = np.unpackbits(words.view(np.uint8), bitorder="little")
        assert torch.equal(torch.from_numpy(bits[: constraint.vocab].astype(bool)), allowed), fmt
        assert not bits[constraint.vocab :].any()


def test_a_place_in_the_format_fills_its_bitmask_once(demo, grammars):  # noqa: F811
    """An MTP step's plan (`words`) and its first row's sample (`allowed`) stand at the same place in the format:
    one fill of the bitmask serves both; a token taken (or tried, by `admissible`) means a fill again."""
    _, tokenizer, eos = demo
    constraint = Constraint(
        grammars.compile(formats.spec_text({"type": "regex", "pattern": "(yes|no), [0-9]{3}"})), eos
    )
    fills = []

    class Counting:
        def __init__(self, matcher):
            self.matcher = matcher

        def fill_next_token_bitmask(self, bitmask):
            fills.append(1)
            return self.matcher.fill_next_token_bitmask(bitmask)

        def __getattr__(self, name):
            return getattr(self.matcher, name)

    constraint._matcher = Counting(constraint._matcher)
    words = constraint.words()
    allowed = constraint.allowed()
    assert len(fills) == 1 and words is not None and 0 < int(allowed.sum()) < constraint.vocab
    token = int(allowed.nonzero()[0])
    assert constraint.admissible([token]) == 1 and constraint.allowed().equal(allowed) and len(fills) == 2
    assert constraint.accept(token) and not constraint.allowed().equal(allowed) and len(fills) == 3


@torch.no_grad()
def test_the_mtp_layers_first_draft_is_one_the_format_allows(
    demo_mtp,  # noqa: F811
    grammars,
    monkeypatch,
    graphs: bool = False,
):
    """Under a format, where the MTP layer drafts (no forced text), its first draft is a token the format allows
    after the pending one: the step's plan carries the format's mask to the layer. Checked at every MTP window as
    the scheduler takes it (on the GPU with graphs: tests/gpu/test_mtp_gpu.py); the replies are the ones served
    without drafts."""
    model, tokenizer, eos = demo_mtp
    todo = cases(tokenizer)[:8]
    checked: list[int] = []
    take = Scheduler._take_window

    def checking(self, req, logits, verified, *drawn):
        if req.window_by == "mtp" and req.constraint is not None and not req.constraint.ended:
            checked.append(req.constraint.admissible(req.window[1:2]))
        return take(self, req, logits, verified, *drawn)

    monkeypatch.setattr(Scheduler, "_take_window", checking)
    drafted, counts = serve_formats(model, eos, grammars, todo, True, 4, graphs, drafter="mtp")
    assert len(checked) > 20 and all(checked), checked
    monkeypatch.setattr(Scheduler, "_take_window", take)
    serial, _ = serve_formats(model, eos, grammars, todo, False, 4, graphs, drafter="mtp")
    assert drafted == serial
    assert counts["by_drafter"]["mtp"]["accepted"] > 0, counts


@torch.no_grad()
def test_a_format_complete_before_any_token_ends_the_reply_cleanly(demo, grammars):  # noqa: F811
    """A choice of "" is complete at once: with end tokens the reply is one end token; with none (ignore_eos) it is
    empty. Either way a clean stop, never a failed request (schemathesis found the second as a 503)."""
    model, tokenizer, eos = demo
    executor = StepExecutor(model, model.make_pool(1024, "fp32"), lanes=2, window=4)
    sched = Scheduler(executor, ParallelGroup.single(), parallel=2, max_queued=4, heartbeat_s=0.05)
    sched.start()
    try:
        sinks = []
        for i, stop_ids in enumerate((eos, frozenset())):
            sink = Collector()
            constraint = Constraint(grammars.compile(formats.spec_text(formats.choice_format([""]))), stop_ids)
            prompt = tokenizer.encode("<|user|>hi<|assistant|></think>").ids
            sched.submit(Request(f"e{i}", prompt, SamplingParams(max_tokens=8), sink, stop_ids, constraint=constraint))
            sinks.append(sink)
        for sink in sinks:
            assert sink.done.wait(60)
    finally:
        sched.stop()
    with_end, without = sinks
    assert isinstance(with_end.end, Finished) and with_end.end.reason == "stop" and with_end.end.completion_tokens == 1
    assert isinstance(without.end, Finished) and without.end.reason == "stop" and without.tokens == []


@torch.no_grad()
def test_a_formats_first_row_drawn_with_the_steps_rows_gives_the_same_replies(demo, grammars, monkeypatch):  # noqa: F811
    """The GPU's draw of a step through the scheduler, on the CPU (`Scheduler._draw` with `batch_host_rows`, the
    rows-together form for `sample_rows`): a lane under a format has its first row drawn with the step's other rows,
    under the format's mask (its later rows, after forced-text drafts, a row at a time). The replies are the ones
    sampled a row at a time, with and without drafts, and passes held several formats' rows."""
    from engine import sampling
    from engine import scheduler as scheduler_module

    model, tokenizer, eos = demo
    todo = cases(tokenizer)[:8]
    alone, _ = serve_formats(model, eos, grammars, todo, draft=False, parallel=1)
    passes: list[int] = []

    def together(rows, params, positions, graphs):
        passes.append(len(params))
        return sampling._device_rows(rows, params, positions, graphs)

    monkeypatch.setattr(Scheduler, "batch_host_rows", True)
    monkeypatch.setattr(scheduler_module, "sample_rows", together)
    batched, _ = serve_formats(model, eos, grammars, todo, draft=False, parallel=4)
    assert max(passes) == 4  # every lane's first row in one pass, each under its own format
    drafted, counts = serve_formats(model, eos, grammars, todo, draft=True, parallel=4)
    assert counts["by_drafter"]["format"]["accepted"] > 0, counts
    assert alone == batched == drafted
    passes.clear()
    mixed = [serve_mixed(model, eos, grammars, todo, draft) for draft in (False, True)]
    assert max(passes) > 1
    monkeypatch.setattr(Scheduler, "batch_host_rows", False)
    assert mixed == [serve_mixed(model, eos, grammars, todo, False)] * 2


def serve_mixed(model, eos, grammars, todo, draft: bool) -> list[list[tuple]]:
    """Formats beside plain lanes, log-probabilities asked by some of each (a format's are the model's own, from the
    unmasked row): each request's token events as (id, log-probability, alternatives)."""
    executor = StepExecutor(model, model.make_pool(4096, "fp32"), lanes=4, window=4)
    sched = Scheduler(
        executor, ParallelGroup.single(), parallel=4, max_queued=len(todo), prefill_chunk=32, heartbeat_s=0.05,
        drafter="copy", draft_tokens=3,
    )  # fmt: skip
    events: list[list[tuple]] = [[] for _ in todo]
    ends = [threading.Event() for _ in todo]

    def sink(i: int):
        def take(event: object) -> None:
            if isinstance(event, Token):
                events[i].append((event.id, event.logprob, event.top))
            else:
                assert isinstance(event, Finished), event
                ends[i].set()

        return take

    sched.start()
    try:
        for i, (ids, fmt, _) in enumerate(todo):
            params = SamplingParams(temperature=0.0 if i % 3 == 0 else 0.9, seed=i, max_tokens=40)
            constraint = Constraint(grammars.compile(formats.spec_text(fmt)), eos) if i % 2 == 0 else None
            logprobs = (None, 2, 0, 4)[i % 4]
            sched.submit(Request(f"m{i}", ids, params, sink(i), eos, draft=draft, constraint=constraint,
                                 logprobs=logprobs))  # fmt: skip
        assert all(end.wait(300) for end in ends)
    finally:
        sched.stop()
    assert any(e[1] is not None for e in events[2]) and all(len(e[2]) == 4 for e in events[3])
    return events
