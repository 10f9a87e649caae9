#!/usr/bin/env bash
# Run every check: ruff, mypy, then pytest (unit, integration with a real tritonserver; GPU tests run
# when a GPU is visible and skip with the reason otherwise). Sets up .venv first (scripts/setup.sh).
#
#   scripts/test.sh                 # everything, in INFLIGHT_TEST_WORKERS (4) pytest-xdist workers, a file's
#                                   # tests on one worker (its module's servers are set up once), the longest
#                                   # files first (their `slow(seconds=...)` markers, tests/conftest.py); the
#                                   # integration tests mostly wait (server start-ups, measured windows), so
#                                   # four workers keep a 2-core host busy; mypy runs beside them (one process,
#                                   # ~40 s on that host, that would otherwise leave a core idle) and its output
#                                   # follows pytest's
#   scripts/test.sh -m gpu          # extra pytest arguments: one plain pytest run with them, mypy before it
set -euo pipefail
cd "$(dirname "$0")/.."
PY=$(scripts/setup.sh | tail -n 1)
echo "== ruff"; "$PY" -m ruff check .
"$PY" scripts/trt_stubs.py
if [ $# -gt 0 ]; then
  echo "== mypy"; "$PY" -m mypy
  echo "== pytest"; exec "$PY" -m pytest "$@"
fi
mypy_log=$(mktemp)
"$PY" -m mypy >"$mypy_log" 2>&1 &
mypy_pid=$!
trap 'kill "$mypy_pid" 2>/dev/null || true; rm -f "$mypy_log"' EXIT
echo "== pytest (mypy runs beside it)"
pytest_rc=0
"$PY" -m pytest -n "${INFLIGHT_TEST_WORKERS:-4}" --dist loadfile --no-loadscope-reorder || pytest_rc=$?
mypy_rc=0
wait "$mypy_pid" || mypy_rc=$?
echo "== mypy"; cat "$mypy_log"
[ "$mypy_rc" -eq 0 ] || echo "mypy failed (exit $mypy_rc)" >&2
[ "$pytest_rc" -eq 0 ] || exit "$pytest_rc"
exit "$mypy_rc"
