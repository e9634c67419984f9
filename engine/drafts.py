"""Drafts for speculative decoding, proposed on rank 0 and verified exactly by every rank (engine/runner/lanes.py).

A draft never changes a reply: the verify step samples every row with the keyed rule at its absolute position, and a
draft counts only while it equals that sample (engine/scheduler.py). Drafts only decide how many tokens one step
can commit.

`CopyDrafter` is prompt lookup: when the last n tokens of a stream (n from MAX_MATCH down to MIN_MATCH) occurred
earlier in it, the tokens that followed their latest earlier occurrence are proposed. It pays off where replies
copy from the prompt or from themselves: code edits, quoting, structured output, repeated lists. The n-gram index
grows with the stream (a few dict updates a token), so a lookup costs O(MAX_MATCH) whatever the length.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

MIN_MATCH = 2  # shortest suffix that may propose (one token matches too often to pay for its rows)
MAX_MATCH = 8  # longest suffix looked up; the longest match wins
LOOKBACK = 65536  # an occurrence further back than this many tokens is not used


class CopyDrafter:
    def __init__(self, tokens: Iterable[int] = ()) -> None:
        self.tokens: list[int] = []
        # n -> n-gram -> index of the token that followed its latest occurrence
        self.index: dict[int, dict[tuple[int, ...], int]] = {n: {} for n in range(MIN_MATCH, MAX_MATCH + 1)}
        self.extend(tokens)

    def extend(self, tokens: Iterable[int]) -> None:
        for token in tokens:
            end = len(self.tokens)
            for n, seen in self.index.items():  # the n-grams ending just before `token` are followed by it
                if end >= n:
                    seen[tuple(self.tokens[end - n : end])] = end
            self.tokens.append(token)

    def propose(self, k: int, after: Sequence[int] = ()) -> list[int]:
        """Up to k tokens that followed the longest (then latest) earlier occurrence of the stream's suffix; with
        `after`, of the suffix of the stream continued by those tokens (drafts already chosen: a format's forced
        text)."""
        length = len(self.tokens) + len(after)
        if k <= 0:
            return []
        tail = self.tokens[-MAX_MATCH:] + list(after)
        for n in range(min(MAX_MATCH, length - 1), MIN_MATCH - 1, -1):
            follow = self.index[n].get(tuple(tail[len(tail) - n :]))
            if follow is not None and length - follow <= LOOKBACK:
                return self.tokens[follow : follow + k]
        return []
