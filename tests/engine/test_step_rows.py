"""A step's rows stay within what keeps each row's bits its own: lanes × verify window ≤ ROW_INVARIANT_ROWS. Above
it the row-invariant kernels step aside (engine/ops/fused.py, reference.row_blocks) and a drafted reply could differ
from the serial one, so the engine refuses such settings with one line naming both flags and the fix; drafts off,
any lane count runs (the recipe's PARALLEL stops at 8 anyway, with DRAFT_TOKENS ≤ 7: 64 rows)."""

from __future__ import annotations

import pytest

from engine.config import MAX_STEP_ROWS, EngineConfig
from engine.ops.reference import ROW_INVARIANT_ROWS


def _rows_problems(**fields) -> list[str]:
    return [p for p in EngineConfig("unused", **fields).problems() if "rows a step" in p]


def test_the_limit_is_the_row_invariant_kernels_own():
    assert MAX_STEP_ROWS == ROW_INVARIANT_ROWS


@pytest.mark.parametrize("parallel,draft_tokens", [(8, 7), (16, 3), (32, 1), (64, 0), (1, 7)])
def test_steps_up_to_the_limit_are_accepted(parallel, draft_tokens):
    assert _rows_problems(parallel=parallel, draft_tokens=draft_tokens, drafter="mtp+copy") == []


@pytest.mark.parametrize("parallel,draft_tokens,fix", [(9, 7, 6), (17, 3, 2), (33, 1, 0)])
def test_larger_steps_are_refused_with_the_fix(parallel, draft_tokens, fix):
    (line,) = _rows_problems(parallel=parallel, draft_tokens=draft_tokens, drafter="copy")
    assert f"--parallel {parallel}" in line and f"--draft-tokens {draft_tokens}" in line
    assert f"lower --draft-tokens to {fix}" in line and f"--parallel to {MAX_STEP_ROWS // (draft_tokens + 1)}" in line
    ok = EngineConfig("unused", parallel=parallel, draft_tokens=fix, drafter="copy")
    assert not [p for p in ok.problems() if "rows a step" in p]  # the fix it names runs


def test_without_drafts_any_lane_count_runs():
    assert _rows_problems(parallel=200, draft_tokens=3, drafter="none") == []
