#!/usr/bin/env bash
# Run every check: ruff, mypy, then pytest (unit, integration with a real tritonserver; GPU tests run
# when a GPU is visible and skip with the reason otherwise). Sets up .venv first (scripts/setup.sh).
#
#   scripts/test.sh                 # everything
#   scripts/test.sh -m gpu          # extra pytest arguments are passed through
set -euo pipefail
cd "$(dirname "$0")/.."
PY=$(scripts/setup.sh | tail -n 1)
echo "== ruff"; "$PY" -m ruff check .
echo "== mypy"; "$PY" scripts/trt_stubs.py; "$PY" -m mypy
echo "== pytest"; "$PY" -m pytest "$@"
