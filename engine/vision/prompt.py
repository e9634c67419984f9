"""Images in a prompt, as the scheduler sees them: where each one's rows go, its tower input, its identity.

An image takes `tokens` consecutive `<|image|>` positions of the prompt's ids; the vision tower (rank 0) turns its
patches into that many rows, which replace those positions' embeddings when the chunk holding them is prefilled.
The ids alone cannot tell two images apart (every position holds the same `<|image|>` id), so whatever keys a prompt
by its ids — kept prompt states (engine/reuse.py) and the unseeded sampling seed — keys it by `key_ids` instead: the
ids with each image's positions holding a number drawn from its pixels' digest.

A video's frame pairs are images of one media item (`item`): the tower encodes an item in one call of its own
(`encode_items`), whole even when a kept state already holds some of its pairs, so an image's rows have the same bits
whatever else the request holds and wherever its prompt resumes (a product's sums may be ordered by its row count).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch


@dataclass(frozen=True, eq=False)
class PromptImage:
    start: int  # the prompt position of its first row
    tokens: int  # rows it takes (= positions holding `<|image|>`)
    # the tower's input [patches, patch width], or what makes it when the tower runs (a PreparedImage of
    # engine/vision/preprocess.py: its 8-bit canvas, an eighth of the float patches' bytes while the request waits)
    source: Any
    grid: tuple[int, int, int]  # (temporal, height, width) in patches
    digest: bytes  # of its pixels and grid: equal images, equal digests
    item: int = -1  # the media item it belongs to (a video's frame pairs share one); -1: an item of its own

    @property
    def end(self) -> int:
        return self.start + self.tokens

    def patches(self) -> torch.Tensor:
        return self.source if isinstance(self.source, torch.Tensor) else self.source.patches


def key_ids(prompt: list[int], images: list[PromptImage]) -> list[int]:
    """The prompt's ids with each image's positions holding a negative number from its digest (never a token id)."""
    if not images:
        return prompt
    out = list(prompt)
    for image in images:
        mark = -1 - (int.from_bytes(image.digest[:7], "little"))
        out[image.start : image.end] = [mark] * image.tokens
    return out


def items(images: list[PromptImage], wanted: list[int]) -> list[int]:
    """The indices of `images` in the media items of images[i] for i in wanted (a video's pairs come whole)."""
    groups = {_item(i, images[i]) for i in wanted}
    return [i for i, image in enumerate(images) if _item(i, image) in groups]


def _item(index: int, image: PromptImage) -> tuple[int, int]:
    return (0, image.item) if image.item >= 0 else (1, index)


def encode_items(forward: Callable[[torch.Tensor, list], torch.Tensor], images: list[PromptImage]) -> list[Any]:
    """Each image's tower rows: one `forward(patches, grids)` call per media item (an image alone, a video's pairs
    together), so an item's rows never depend on what else shares a call."""
    out: list[Any] = []
    start = 0
    while start < len(images):
        end = start + 1
        if images[start].item >= 0:
            while end < len(images) and images[end].item == images[start].item:
                end += 1
        group = images[start:end]
        rows = forward(torch.cat([im.patches() for im in group]), [im.grid for im in group])
        out += list(rows.split([im.tokens for im in group]))
        start = end
    return out


def chunk_rows(
    images: list[PromptImage], rows: list[Any], start: int, count: int
) -> tuple[list[int], torch.Tensor] | None:
    """The image rows of prompt positions start..start+count: (offsets in that chunk, rows), or None when the chunk
    holds no image position. `rows[i]` is images[i]'s tower output (None for an image wholly before `start`)."""
    where: list[int] = []
    parts: list[torch.Tensor] = []
    for image, image_rows in zip(images, rows):
        lo, hi = max(image.start, start), min(image.end, start + count)
        if lo < hi:
            where += range(lo - start, hi - start)
            parts.append(image_rows[lo - image.start : hi - image.start])
    return (where, torch.cat(parts)) if parts else None
