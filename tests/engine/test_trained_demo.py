"""The trained demo model: its synthetic data, reproducible training, and the committed checkpoint's behaviour in
this engine (greedy, fp32, CPU)."""

from __future__ import annotations

import json

import pytest
import torch

from engine.checkpoint.demo import TRAINED, write_demo
from engine.models.glm5_next.model import Glm5NextForCausalLM
from engine.server.template import render_chat
from engine.train import synthetic
from engine.train.evaluate import Reply, generate, parse_calls, score
from engine.train.export import weights_hash


def _texts(split: str, seed: int) -> list[str]:
    return [synthetic.prompt(e) + synthetic.completion(e) for e in synthetic.examples(split, seed, 40)]


def test_generator_is_reproducible_and_splits_differ():
    assert _texts("train", 3) == _texts("train", 3)
    assert _texts("train", 3) != _texts("train", 4)
    assert _texts("train", 0) != _texts("eval", 0)


def test_every_kind_appears_with_thinking_on_and_off():
    seen = {(e.kind, e.thinking) for e in synthetic.examples("train", 0, 400)}
    assert seen == {(k, t) for k in synthetic.KINDS for t in (True, False)}


def test_completion_is_what_the_template_renders_for_that_turn():
    for example in synthetic.examples("train", 1, 120):
        text = synthetic.prompt(example)
        assert text.endswith("<|assistant|><think>" if example.thinking else "<|assistant|></think>")
        if not example.thinking:
            continue
        turn = {
            "role": "assistant",
            "content": example.content,
            "reasoning_content": example.reasoning,
            "tool_calls": [{"type": "function", "function": {"name": n, "arguments": a}} for n, a in example.calls],
        }
        options = {"reasoning_effort": example.effort} if example.effort else {}
        whole = render_chat(
            example.messages + [turn], tools=example.tools, add_generation_prompt=False, enable_thinking=True, **options
        )
        assert text + synthetic.completion(example) == whole + synthetic.CALL_END * bool(
            example.calls
        ) + synthetic.ANSWER_END * (not example.calls)


def test_tool_calls_follow_the_offered_schema():
    calls = [e for e in synthetic.examples("train", 2, 200) if e.kind == "tool_call"]
    assert len(calls) > 20
    for example in calls:
        assert example.calls[0][0] in {t["function"]["name"] for t in example.tools}
        assert parse_calls(synthetic.completion(example), example.tools) == example.calls


def test_scoring_rejects_malformed_replies():
    example = next(e for e in synthetic.examples("eval", 0, 50) if e.kind == "ok" and e.thinking)
    assert score(example, Reply("Short.</think>OK", True)).correct
    assert not score(example, Reply("Short.</think>OK", False)).well_formed  # cut at the length limit
    assert not score(example, Reply("Short. OK", True)).well_formed  # think block never closed
    assert not score(example, Reply("a</think>b</think>OK", True)).well_formed
    tool = next(e for e in synthetic.examples("eval", 0, 50) if e.kind == "tool_call")
    name, args = tool.calls[0]
    assert not score(tool, Reply(synthetic.format_call(name, {**args, "bogus": 1}), True)).call_valid
    assert not score(tool, Reply(synthetic.format_call("not_offered", args), True)).call_valid


def _mtp_tensors(directory) -> dict[str, torch.Tensor]:
    """The MTP layer's tensors in a checkpoint: the layer numbered after the last main layer."""
    from safetensors.torch import load_file

    from engine.checkpoint.layout import PREFIX
    from engine.models.glm5_next.config import TextConfig

    prefix = f"{PREFIX}layers.{TextConfig.from_file(directory).num_hidden_layers}."
    out: dict[str, torch.Tensor] = {}
    for path in sorted(directory.glob("*.safetensors")):
        out.update({n: t for n, t in load_file(str(path)).items() if n.startswith(prefix)})
    return out


def test_short_training_run_is_reproducible(tmp_path):
    """`train-demo`'s path (main model, then its MTP layer, then export) twice gives the same bytes, and the
    exported MTP layer is the trained one, not the seeded start."""
    pytest.importorskip("transformers")
    from engine.train.export import write_trained
    from engine.train.trainer import TrainSettings, train

    settings = TrainSettings(seed=5, steps=2, tokens_per_step=512, mtp_steps=2)
    outs = []
    for name in ("a", "b"):
        result = train(settings)
        assert len(result.mtp_losses) == settings.mtp_steps
        outs.append(write_trained(result.model, tmp_path / name, seed=5, preset="chat", mtp=result.mtp))
    assert weights_hash(outs[0]) == weights_hash(outs[1])
    start = write_demo(tmp_path / "start", seed=5, size="chat")
    assert weights_hash(outs[0]) != weights_hash(start)  # training moved weights
    trained, drawn = _mtp_tensors(outs[0]), _mtp_tensors(start)
    assert trained.keys() == drawn.keys() and len(trained) > 0
    moved = {n.rsplit("layers.", 1)[1].split(".", 1)[1] for n in trained if not torch.equal(trained[n], drawn[n])}
    assert {"eh_proj.weight", "self_attn.q_b_proj.weight", "self_attn.o_proj.weight", "mlp.gate.weight"} <= moved


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    path = write_demo(tmp_path_factory.mktemp("trained"), size="trained")
    return path, Glm5NextForCausalLM.load(path)


def test_committed_checkpoint_matches_its_record(trained):
    path, _ = trained
    record = json.loads((TRAINED / "training.json").read_text())
    assert weights_hash(path) == record["weights_sha256"]
    assert sum(f.stat().st_size for f in TRAINED.iterdir()) < 5_000_000


def _reply(trained, messages, tools=None, **options) -> Reply:
    path, model = trained
    from tokenizers import Tokenizer

    torch.set_num_threads(1)
    tokenizer = Tokenizer.from_file(str(path / "tokenizer.json"))
    return generate(model, tokenizer, [render_chat(messages, tools=tools, **options)], max_new_tokens=64)[0]


@pytest.mark.parametrize("thinking", [False, True])
def test_trained_model_replies_ok(trained, thinking):
    reply = _reply(trained, [{"role": "user", "content": "Reply with OK."}], enable_thinking=thinking)
    assert reply.stopped
    assert reply.text.count("</think>") == int(thinking)
    assert reply.content == "OK"


def test_trained_model_calls_an_offered_tool(trained):
    tools = [synthetic.TOOLS["get_time"], synthetic.TOOLS["get_weather"]]
    reply = _reply(
        trained, [{"role": "user", "content": "What is the weather in Berlin?"}], tools=tools, enable_thinking=True
    )
    assert reply.stopped and reply.text.count("</think>") == 1
    calls = parse_calls(reply.text, tools)  # None for a call that does not fit the offered schema
    assert len(calls) == 1 and calls[0] is not None and calls[0][0] == "get_weather", reply


def test_trained_model_on_held_out_examples(trained):
    path, model = trained
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(path / "tokenizer.json"))
    examples = [e for e in synthetic.examples("eval", 1, 40) if e.kind in ("ok", "tool_call")][:6]
    replies = generate(model, tokenizer, [synthetic.prompt(e) for e in examples])
    scores = [score(e, r) for e, r in zip(examples, replies)]
    assert all(s.well_formed for s in scores), replies
    assert all(s.correct for s in scores if s.kind == "ok"), replies
    assert all(s.call_valid for s in scores if s.kind == "tool_call"), replies
