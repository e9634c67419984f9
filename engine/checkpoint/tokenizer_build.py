"""The demo checkpoint's tokenizer: a byte-level BPE trained here on `tokenizer_corpus`, plus GLM's special tokens.

Byte-level means every UTF-8 string round-trips, whatever the corpus lacked. The special tokens are added after
training, so they take the ids after the learned vocabulary (as in GLM, where they sit at the top of the vocab) and
each encodes as exactly one id. Training takes well under a second and is cached per process.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers

from engine.checkpoint.tokenizer_corpus import corpus_lines
from engine.server.template import load_chat_template

# GLM's conversation and tool markup; the order fixes their ids.
SPECIAL_TOKENS = (
    "<|endoftext|>",
    "[MASK]",
    "[gMASK]",
    "[sMASK]",
    "<sop>",
    "<eop>",
    "<|system|>",
    "<|user|>",
    "<|assistant|>",
    "<|observation|>",
    "<|begin_of_image|>",
    "<|end_of_image|>",
    "<|begin_of_video|>",
    "<|end_of_video|>",
    "<|image|>",
    "<|video|>",
    "<think>",
    "</think>",
    "<tool_call>",
    "</tool_call>",
    "<tool_response>",
    "</tool_response>",
    "<arg_key>",
    "</arg_key>",
    "<arg_value>",
    "</arg_value>",
)
# Generation stops on these (GLM: end of text, the user's turn, a tool result awaited after a call).
EOS_TOKENS = ("<|endoftext|>", "<|user|>", "<|observation|>")
PAD_TOKEN = "<|endoftext|>"
LEARNED_VOCAB = 4000  # bytes + merges; the corpus saturates a little below this


@functools.lru_cache(maxsize=1)
def _trained_json() -> str:
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=LEARNED_VOCAB,
        min_frequency=2,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tokenizer.train_from_iterator(corpus_lines(), trainer=trainer)
    tokenizer.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS])
    return tokenizer.to_str(pretty=True)


def build_tokenizer() -> Tokenizer:
    """A fresh copy of the trained tokenizer (callers may mutate it)."""
    return Tokenizer.from_str(_trained_json())


def token_ids(names: tuple[str, ...] | list[str]) -> list[int]:
    tokenizer = build_tokenizer()
    ids = [tokenizer.token_to_id(name) for name in names]
    missing = [name for name, found in zip(names, ids) if found is None]
    if missing:
        raise KeyError(f"the demo tokenizer has no token {missing[0]!r}")
    return [int(found) for found in ids if found is not None]


def write_tokenizer(directory: Path, model_max_length: int) -> int:
    """Write tokenizer.json, tokenizer_config.json, special_tokens_map.json and chat_template.jinja; returns the
    tokenizer's size (learned vocabulary + special tokens)."""
    tokenizer = build_tokenizer()
    (directory / "tokenizer.json").write_text(_trained_json() + "\n")
    template = load_chat_template()
    (directory / "chat_template.jinja").write_text(template)
    added = {
        str(tokenizer.token_to_id(t)): {
            "content": t,
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": True,
        }
        for t in SPECIAL_TOKENS
    }
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "added_tokens_decoder": added,
        "additional_special_tokens": [t for t in SPECIAL_TOKENS if t not in (PAD_TOKEN,)],
        "eos_token": PAD_TOKEN,
        "pad_token": PAD_TOKEN,
        "clean_up_tokenization_spaces": False,
        "do_lower_case": False,
        "model_max_length": model_max_length,
        "padding_side": "left",
        "remove_space": False,
        "chat_template": template,
    }
    (directory / "tokenizer_config.json").write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n")
    special_map = {
        "eos_token": PAD_TOKEN,
        "pad_token": PAD_TOKEN,
        "additional_special_tokens": config["additional_special_tokens"],
    }
    (directory / "special_tokens_map.json").write_text(json.dumps(special_map, indent=2) + "\n")
    return tokenizer.get_vocab_size(with_added_tokens=True)
