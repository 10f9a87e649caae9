#!/usr/bin/env bash
# Run every check: ruff, mypy, then pytest (unit, integration with a real tritonserver; GPU tests run
# when a GPU is visible and skip with the reason otherwise). Sets up .venv first (scripts/setup.sh).
#
#   scripts/test.sh                 # everything, in INFLIGHT_TEST_WORKERS (4) pytest-xdist workers, a file's
#                                   # tests on one worker (its module's servers are set up once), the longest
#                                   # files first (their `slow(seconds=...)` markers, tests/conftest.py); the
#                                   # integration tests mostly wait (server start-ups, measured windows), so
#                                   # four workers keep a 2-core host busy
#   scripts/test.sh -m gpu          # extra pytest arguments: one plain pytest run with them
set -euo pipefail
cd "$(dirname "$0")/.."
PY=$(scripts/setup.sh | tail -n 1)
echo "== ruff"; "$PY" -m ruff check .
echo "== mypy"; "$PY" scripts/trt_stubs.py; "$PY" -m mypy
[ $# -gt 0 ] || set -- -n "${INFLIGHT_TEST_WORKERS:-4}" --dist loadfile --no-loadscope-reorder
echo "== pytest"; exec "$PY" -m pytest "$@"
