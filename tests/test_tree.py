"""The test tree itself: pytest imports test files by basename (no packages here), so two files of the same name in
different folders stop the whole run at collection."""

from __future__ import annotations

from collections import Counter
from pathlib import Path


def test_test_files_have_unique_basenames() -> None:
    names = Counter(p.name for p in Path(__file__).parent.rglob("test_*.py"))
    assert names, "no test files found"
    assert [n for n, count in names.items() if count > 1] == []
