"""Structured outputs: a format the reply must follow, compiled by xgrammar and applied on rank 0 as a mask on each
row's logits just before the keyed sampler draws from them.

A format is an xgrammar structural tag in its JSON form (`{"type": "structural_tag", "format": {...}}`): JSON schemas
(plain or in GLM's `<arg_key>/<arg_value>` tool-call form), regexes, EBNF grammars, constant strings, sequences and
alternatives of them, and a tag that lets the reply think freely up to `</think>` first. The server builds that text
from a request (engine/server/formats.py); here it is compiled (once per distinct text, in a cache bounded in bytes)
and followed token by token.

Determinism: the mask depends only on the request's own tokens, and sampling runs on rank 0 alone, so a reply under
a grammar is the same whatever shares its steps, and the same at TP=N (no rank samples with the mask). Drafts the
grammar would reject are cut before the verify step, the text the grammar forces (a JSON key, a tool call's markup)
is drafted (`Constraint.forced`), and where the MTP layer drafts, its first draft is one the mask allows (`words`:
the step's plan carries it to every rank, which all draft alike); a drafted window is then sampled row by row under
the same masks as the one-token steps would be, so drafted ≡ serial holds with grammars too. Log-probabilities stay
those of the model's own distribution (before the mask), as vLLM reports them.

xgrammar imports transformers (~3 s): it is imported when the first request with a format arrives.
"""

from __future__ import annotations

import json
import re
import threading
from typing import Any

import numpy as np
import torch

CACHE_BYTES = 256 * 2**20  # compiled grammars kept for reuse; the compiler evicts the least recently used beyond
_ERROR_PREFIX = re.compile(r"^\[[0-9:]+\] [^:]+:\d+: ")  # "[18:44:12] /project/cpp/regex_converter.cc:94: "


class FormatError(ValueError):
    """The format cannot be compiled (an invalid JSON schema, regex or grammar); the message says why."""


def _xgrammar() -> Any:
    import xgrammar

    return xgrammar


def _vocab_type(tokenizer: Any) -> str:
    """BYTE_LEVEL for GPT-2-style byte-level BPE (GLM's), BYTE_FALLBACK for sentencepiece-style, else RAW."""
    try:
        decoder = json.loads(tokenizer.to_str()).get("decoder") or {}
    except (ValueError, AttributeError):
        return "RAW"
    kinds = {decoder.get("type")} | {d.get("type") for d in decoder.get("decoders", []) if isinstance(d, dict)}
    if "ByteLevel" in kinds:
        return "BYTE_LEVEL"
    if "ByteFallback" in kinds:
        return "BYTE_FALLBACK"
    return "RAW"


class Grammars:
    """The compiler for one tokenizer, built on first use; compiling is thread-safe (the server compiles off its
    event loop)."""

    def __init__(self, tokenizer: Any, cache_bytes: int = CACHE_BYTES) -> None:
        self.tokenizer = tokenizer
        self.cache_bytes = cache_bytes
        self._compiler: Any = None
        self._lock = threading.Lock()

    @property
    def vocab_size(self) -> int:
        return int(self.tokenizer.get_vocab_size(with_added_tokens=True))

    def compiler(self) -> Any:
        with self._lock:
            if self._compiler is None:
                xg = _xgrammar()
                vocab = [""] * self.vocab_size
                for text, token in self.tokenizer.get_vocab(with_added_tokens=True).items():
                    vocab[token] = text
                info = xg.TokenizerInfo(vocab, getattr(xg.VocabType, _vocab_type(self.tokenizer)))
                self._compiler = xg.GrammarCompiler(info, max_threads=2, cache_limit_bytes=self.cache_bytes)
            return self._compiler

    def compile(self, spec: str) -> Any:
        """A structural tag's JSON text -> the compiled grammar (from the cache when the same text came before)."""
        try:
            return self.compiler().compile_structural_tag(spec)
        except Exception as exc:  # xgrammar raises RuntimeError / its own errors, with C++ source positions
            message = _ERROR_PREFIX.sub(
                "", str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            )
            raise FormatError(message) from exc

    def cached_bytes(self) -> int:
        return 0 if self._compiler is None else int(self._compiler.get_cache_size_bytes())


class Constraint:
    """One reply's place in its grammar, on rank 0. `stop_ids` are the request's end tokens: allowed once the format
    is complete, and with none (ignore_eos) the reply ends when the format does."""

    def __init__(self, compiled: Any, stop_ids: frozenset[int]) -> None:
        xg = _xgrammar()
        self._matcher = xg.GrammarMatcher(
            compiled, override_stop_tokens=sorted(stop_ids) or None, terminate_without_stop_token=not stop_ids
        )
        vocab = int(compiled.tokenizer_info.vocab_size)
        self._bitmask = xg.allocate_token_bitmask(1, vocab)
        self._filled = False  # the bitmask holds the next tokens of the matcher's place (until it takes a token)
        self.vocab = vocab

    def _next_bits(self) -> np.ndarray:
        """The bitmask's int32 words [ceil(vocab / 32)] for the matcher's place, filled once a place: an MTP step's
        plan (`words`) and its first row's sample (`allowed`) read the same fill."""
        if not self._filled:
            self._matcher.fill_next_token_bitmask(self._bitmask)
            self._filled = True
        return self._bitmask.numpy()[0]

    def allowed(self) -> torch.Tensor:
        """bool [vocab] on the CPU: the tokens the format allows next (bit j of 32-bit word w is token 32w + j)."""
        bits = np.unpackbits(self._next_bits().view(np.uint8), bitorder="little")[: self.vocab]
        return torch.from_numpy(bits.view(np.bool_))

    def mask(self, logits: torch.Tensor) -> torch.Tensor | None:
        """A copy of a row's logits with every token the format forbids at -inf (ids past the tokenizer's
        vocabulary, a padded lm_head's, are never allowed); None when the format allows no token at all (decided on
        the host, from the bitmask: no device sync)."""
        logits = logits.reshape(-1)
        allowed = self.allowed()
        if not bool(allowed.any()):
            return None
        if logits.numel() != allowed.numel():
            allowed = torch.cat([allowed, allowed.new_zeros(max(0, logits.numel() - allowed.numel()))])
            allowed = allowed[: logits.numel()]
        return logits.masked_fill(~allowed.to(logits.device, non_blocking=True), float("-inf"))

    def words(self) -> np.ndarray | None:
        """The tokens the format allows next as int32 words [ceil(vocab / 32)] (bit j of word w is token 32w + j;
        none past the tokenizer's vocabulary, as `mask`), for the MTP layer's draft 1 (engine/runner/lanes.py);
        None when the format is complete, allows no token, or allows every token (nothing to narrow)."""
        if self.ended:
            return None
        words = self._next_bits().copy()
        bits = words.view(np.uint32)
        every = np.full_like(bits, 0xFFFFFFFF)
        if self.vocab % 32:  # xgrammar may set the bits of the last word's ids past the vocabulary
            every[-1] = (1 << self.vocab % 32) - 1
            bits[-1] &= every[-1]
        if not bits.any() or np.array_equal(bits, every):
            return None
        return words

    def accept(self, token: int) -> bool:
        self._filled = False  # a new place (or, refused, the same: filled again, as before)
        return bool(self._matcher.accept_token(int(token)))

    @property
    def ended(self) -> bool:
        """The format is complete and nothing may follow it (its end token was taken, or it needs none)."""
        return bool(self._matcher.is_terminated())

    def forced(self, limit: int) -> list[int]:
        """Up to `limit` tokens the format forces from here: xgrammar's jump-forward tokens, the text nothing else
        may follow with in the vocabulary's longest tokens (never a stop or special token; the last one left out
        where a longer token could extend it; the matcher accepts each). They are drafts like any other: the model
        may spell the same text in other tokens, and a draft counts only where it equals the sample. The place in
        the format is unchanged."""
        if limit <= 0 or self.ended:
            return []
        return [int(t) for t in self._matcher.find_jump_forward_tokens()[:limit]]

    def admissible(self, tokens: list[int]) -> int:
        """How many of `tokens`, in order from here, the format accepts; the place in the format is unchanged."""
        taken = 0
        for token in tokens:
            if not self.accept(token):
                break
            taken += 1
        if taken:
            self._matcher.rollback(taken)
        return taken
