"""make-demo: deterministic files, the real HF layout (transformers loads it), tokenizer and chat template."""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path

import pytest

from engine.checkpoint.demo import write_demo
from engine.checkpoint.tokenizer_build import SPECIAL_TOKENS, build_tokenizer
from engine.server.template import load_chat_template, render_chat

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather for a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
]
CALL_TURN = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Weather in Paris?"},
    {
        "role": "assistant",
        "content": None,
        "reasoning_content": "I need the tool.",
        "tool_calls": [
            {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}}
        ],
    },
    {"role": "tool", "content": "sunny"},
    {"role": "tool", "content": "22 C"},
]


def _hashes(directory: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(directory.iterdir())}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_demo(tmp_path_factory.mktemp("tiny") / "ckpt", seed=0, size="tiny")


def test_same_seed_gives_byte_identical_files_and_another_seed_other_weights(tiny: Path, tmp_path: Path) -> None:
    start = time.perf_counter()
    again = write_demo(tmp_path / "again", seed=0, size="tiny")
    assert time.perf_counter() - start < 10
    assert _hashes(again) == _hashes(tiny)
    other = _hashes(write_demo(tmp_path / "other", seed=1, size="tiny"))
    first = _hashes(tiny)
    shards = [n for n in first if n.endswith(".safetensors")]
    assert len(shards) >= 2 and all(other[n] != first[n] for n in shards)
    assert other["tokenizer.json"] == first["tokenizer.json"] and other["config.json"] == first["config.json"]


def test_config_follows_the_released_layout(tiny: Path) -> None:
    config = json.loads((tiny / "config.json").read_text())
    text = config["text_config"]
    assert config["model_type"] == "glm5_next" and config["architectures"] == ["Glm5NextForConditionalGeneration"]
    assert set(text["layer_types"]) == {"linear_attention", "full_attention"}  # loads in transformers 5.17 and 5.24
    assert text["num_nextn_predict_layers"] == 1 and text["tie_word_embeddings"] is False
    tokenizer = build_tokenizer()
    assert text["eos_token_id"] == [tokenizer.token_to_id(t) for t in ("<|endoftext|>", "<|user|>", "<|observation|>")]
    assert tokenizer.get_vocab_size() <= text["vocab_size"] and 0 <= text["pad_token_id"] < text["vocab_size"]
    index = json.loads((tiny / "model.safetensors.index.json").read_text())
    mtp = f"model.language_model.layers.{text['num_hidden_layers']}."
    assert {mtp + "eh_proj.weight", mtp + "enorm.weight", mtp + "hnorm.weight"} <= set(index["weight_map"])


def test_transformers_loads_every_weight_and_gives_finite_logits(tiny: Path) -> None:
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    model, loading = transformers.Glm5NextForConditionalGeneration.from_pretrained(
        tiny, dtype=torch.float32, output_loading_info=True
    )
    assert loading["missing_keys"] == set() or not loading["missing_keys"]
    assert all(".layers.6." in k for k in loading["unexpected_keys"])  # only the MTP layer is skipped
    assert model.model.language_model.layers[0].self_attn.forget_gate.dt_bias.dtype == torch.float32
    tokenizer = transformers.AutoTokenizer.from_pretrained(tiny)
    ids = tokenizer("The server reads the prompt and the scheduler waits for the next batch " * 3, return_tensors="pt")[
        "input_ids"
    ]
    assert ids.shape[1] > 19  # longer than index_topk + kpool - 1: the sparse selection runs
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0]
    assert torch.isfinite(logits).all() and logits[-1].std() > 0.5


def test_tokenizer_round_trips_and_special_tokens_are_single_ids(tiny: Path) -> None:
    tokenizer = build_tokenizer()
    for text in ("Hello, world!", "def add(a, b):\n    return a + b\n", "Grüße aus Köln — 東京 🌊", " two  spaces "):
        assert tokenizer.decode(tokenizer.encode(text).ids, skip_special_tokens=False) == text
    for token in SPECIAL_TOKENS:
        assert tokenizer.encode(token).ids == [tokenizer.token_to_id(token)]
    transformers = pytest.importorskip("transformers")
    hf = transformers.AutoTokenizer.from_pretrained(tiny)
    prompt = render_chat(CALL_TURN, tools=TOOLS)
    assert hf(prompt, add_special_tokens=False)["input_ids"] == tokenizer.encode(prompt).ids


def test_template_thinking_effort_and_generation_prompt() -> None:
    user = [{"role": "user", "content": "Hi"}]
    assert render_chat(user) == "[gMASK]<sop><|system|>Reasoning Effort: Max<|user|>Hi<|assistant|><think>"
    assert render_chat(user, reasoning_effort="low").startswith("[gMASK]<sop><|system|>Reasoning Effort: Low<|user|>")
    assert render_chat(user, reasoning_effort="HIGH").count("Reasoning Effort: High") == 1
    off = "[gMASK]<sop><|user|>Hi<|assistant|></think>"
    assert render_chat(user, enable_thinking=False) == off
    assert render_chat(user, thinking=False) == off
    assert render_chat(user, add_generation_prompt=False).endswith("<|user|>Hi")


def test_template_tools_calls_observations_and_none_content() -> None:
    text = render_chat(CALL_TURN, tools=TOOLS)
    assert "<|system|>\n# Tools\n" in text and json.dumps(TOOLS[0]["function"]) in text
    assert (
        "<|system|>Be brief.<|user|>Weather in Paris?<|assistant|><think>I need the tool.</think>"
        "<tool_call>get_weather<arg_key>city</arg_key><arg_value>Paris</arg_value>"
        "<arg_key>days</arg_key><arg_value>2</arg_value></tool_call>"
        "<|observation|><tool_response>sunny</tool_response><tool_response>22 C</tool_response>"
        "<|assistant|><think>"
    ) in text
    assert "None" not in text
    as_string = json.loads(json.dumps(CALL_TURN))
    as_string[2]["tool_calls"][0]["function"]["arguments"] = json.dumps({"city": "Paris", "days": 2})
    assert render_chat(as_string, tools=TOOLS) == text


def test_template_drops_reasoning_before_the_last_user_turn_unless_told_not_to() -> None:
    chat = [
        {"role": "user", "content": "a"},
        {"role": "assistant", "content": "b", "reasoning_content": "r1"},
        {"role": "user", "content": "c"},
        {"role": "assistant", "content": "<think>r2</think>d"},
    ]
    text = render_chat(chat, add_generation_prompt=False)
    assert "<|assistant|><think></think>b<|user|>c<|assistant|><think>r2</think>d" in text
    assert "<think>r1</think>b" in render_chat(chat, add_generation_prompt=False, clear_thinking=False)


@pytest.mark.parametrize(
    "kwargs", [{}, {"enable_thinking": False}, {"reasoning_effort": "high"}, {"clear_thinking": False}]
)
def test_transformers_apply_chat_template_matches_the_jinja_file(tiny: Path, kwargs: dict) -> None:
    transformers = pytest.importorskip("transformers")
    hf = transformers.AutoTokenizer.from_pretrained(tiny)
    chat = CALL_TURN + [{"role": "assistant", "content": "It is sunny."}, {"role": "user", "content": "Thanks"}]
    expected = hf.apply_chat_template(chat, tools=TOOLS, tokenize=False, add_generation_prompt=True, **kwargs)
    source = (tiny / "chat_template.jinja").read_text()
    assert source == load_chat_template()
    assert render_chat(chat, tools=TOOLS, template=source, **kwargs) == expected


@pytest.mark.slow
def test_small_demo_is_sharded_and_modest(tmp_path: Path) -> None:
    start = time.perf_counter()
    out = write_demo(tmp_path / "small", seed=0, size="small")
    assert time.perf_counter() - start < 60
    shards = sorted(out.glob("model-*.safetensors"))
    assert len(shards) >= 2
    assert sum(p.stat().st_size for p in shards) < 300e6
    text = json.loads((out / "config.json").read_text())["text_config"]
    for heads in (text["num_attention_heads"], text["linear_num_heads"]):
        assert heads % 2 == 0 and heads % 3 == 0
