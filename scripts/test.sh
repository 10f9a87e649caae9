#!/usr/bin/env bash
# Run every check: ruff, mypy, then pytest (unit, integration with a real tritonserver; GPU tests run
# when a GPU is visible and skip with the reason otherwise). Sets up .venv first (scripts/setup.sh).
#
#   scripts/test.sh                 # everything: the tests in INFLIGHT_TEST_WORKERS (2) pytest-xdist workers
#                                   # (an xdist_group's tests on one worker); then the `serial` ones alone
#   scripts/test.sh -m gpu          # extra pytest arguments: one plain pytest run with them
set -euo pipefail
cd "$(dirname "$0")/.."
PY=$(scripts/setup.sh | tail -n 1)
echo "== ruff"; "$PY" -m ruff check .
echo "== mypy"; "$PY" scripts/trt_stubs.py; "$PY" -m mypy
if [ $# -gt 0 ]; then
  echo "== pytest"; exec "$PY" -m pytest "$@"
fi
echo "== pytest (parallel)"
"$PY" -m pytest -n "${INFLIGHT_TEST_WORKERS:-2}" --dist loadgroup -m "not serial"
echo "== pytest (serial: host-wide state)"
"$PY" -m pytest -m serial
