"""The test tree itself: pytest imports test files by their basename (rootdir mode), so two may not share one."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]


def test_no_two_test_files_share_a_basename() -> None:
    names = Counter(p.name for p in TESTS.rglob("test_*.py"))
    twice = sorted(n for n, k in names.items() if k > 1)
    assert not twice, f"test files sharing a name (pytest refuses to collect the second): {twice}"
