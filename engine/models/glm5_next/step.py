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
    lane_ids: torch.Tensor  # [B] the lane of each row
    positions: torch.Tensor  # [B] the position of each row's token
    new_slots: torch.Tensor  # [B] the pool slot each row's cache row goes to
    table: torch.Tensor  # [B, span] pool slots by position (past a stream's length: the scratch row)
    # rows per lane: 1 for a decode step; a verify step's rows are lane-major, `width` consecutive rows a lane (its
    # pending token, then its drafts, then padding rows on the scratch lane)
    width: int = 1
    # the last full indexer's selection (shared-indexer layers reuse it): the selected tokens' pool slots [B, N] and
    # whether each counts [B, N] (dsa.SparseMLA._select_lanes)
    selected: tuple[torch.Tensor, torch.Tensor] | None = None
