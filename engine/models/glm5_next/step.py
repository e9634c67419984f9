"""What every layer of one static decode step reads (engine/runner/lanes.py runs the step; the layers' `decode_lanes`
read this)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.cache import LaneState


@dataclass
class LaneStep:
    """What every layer of one static decode step reads (device tensors, shapes fixed by batch and span)."""

    lanes: LaneState
    lane_ids: torch.Tensor  # [B]
    positions: torch.Tensor  # [B] the position of each stream's new token
    new_slots: torch.Tensor  # [B] the pool slot each new token's row goes to
    table: torch.Tensor  # [B, span] pool slots by position (past a stream's length: the scratch row)
    # the last full indexer's selection (shared-indexer layers reuse it): token positions into the span [B, N] and
    # whether each counts [B, N] (dsa.SparseMLA._select_lanes)
    selected: tuple[torch.Tensor, torch.Tensor] | None = None
