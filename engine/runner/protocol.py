"""What the runner needs of a model: `ServingModel`, written down so the executor and the lane decoder type it
instead of duck-typing (`Glm5NextForCausalLM` is one; the scheduler's tests use a stand-in with the same calls)."""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import torch


class ServingModel(Protocol):
    group: Any  # engine.parallel.ParallelGroup

    def new_sequence(self, pool: Any) -> Any: ...

    # also takes `embeds=(offsets, rows)` when a prompt chunk carries image rows (engine/models/glm5_next/model.py)
    def prefill(self, seq: Any, ids: list[int], all_logits: bool = False) -> torch.Tensor: ...

    def decode(self, seqs: list[Any], ids: list[int]) -> torch.Tensor: ...


class LaneModel(ServingModel, Protocol):
    """A model whose decode can run as one static step over lane-indexed state (engine/runner/lanes.py)."""

    def kda_state_shapes(self) -> dict[int, tuple[tuple[int, ...], tuple[int, ...]]]: ...

    def decode_step(self, lanes: Any, inputs: torch.Tensor, span: int, width: int = 1) -> torch.Tensor: ...

    @property
    def mtp_hidden_size(self) -> int: ...  # 0 without an MTP layer that drafts

    @property
    def vocab_size(self) -> int: ...  # the width of a row of logits

    def mtp_draft(
        self, lanes: Any, inputs: torch.Tensor, span: int, width: int, chain: int, mask: torch.Tensor | None = None
    ) -> torch.Tensor: ...


@runtime_checkable
class LaneCapable(Protocol):
    """The runtime check of `LaneModel` (isinstance looks at the names only)."""

    def decode_step(self, lanes: Any, inputs: torch.Tensor, span: int, width: int = 1) -> torch.Tensor: ...

    def kda_state_shapes(self) -> dict[int, tuple[tuple[int, ...], tuple[int, ...]]]: ...

    @property
    def mtp_hidden_size(self) -> int: ...

    @property
    def vocab_size(self) -> int: ...

    def mtp_draft(
        self, lanes: Any, inputs: torch.Tensor, span: int, width: int, chain: int, mask: torch.Tensor | None = None
    ) -> torch.Tensor: ...
