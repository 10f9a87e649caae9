#!/usr/bin/env python3
"""Summarise nsys sqlite exports: GPU activity, sync share, dispatches, regime (thin wrapper).

Usage: scripts/nsys_summary.py FILE.sqlite [FILE ...] [--out DIR] [--nvtx NAME] [--json] ...
See ``python -m inflight.profiling.nsys_summary --help``; ``inflight nsys-summary`` is the same.
"""

from __future__ import annotations

import sys
from pathlib import Path

try:
    from inflight.profiling.nsys_summary import main
except ImportError:  # a checkout without `pip install -e .`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
    from inflight.profiling.nsys_summary import main

if __name__ == "__main__":
    raise SystemExit(main())
