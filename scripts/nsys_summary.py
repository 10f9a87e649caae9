#!/usr/bin/env python3
"""Summarise nsys sqlite exports: GPU activity, sync share, dispatches, regime (thin wrapper).

Usage: scripts/nsys_summary.py FILE.sqlite [FILE ...] [--out DIR] [--nvtx NAME] [--json] ...
The ``inflight nsys-summary`` command itself (``inflight nsys-summary --help``).
"""

from __future__ import annotations

import sys
from pathlib import Path

try:
    from inflight.profiling.cli import nsys_summary_main as main
except ImportError:  # a checkout without `pip install -e .`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
    from inflight.profiling.cli import nsys_summary_main as main

if __name__ == "__main__":
    raise SystemExit(main())
