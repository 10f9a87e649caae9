#!/usr/bin/env bash
# Run every check: ruff, then pytest (unit, integration with a real tritonserver; GPU tests run when a GPU
# is visible and skip with the reason otherwise) with mypy beside it. Sets up .venv first (scripts/setup.sh).
# Exits non-zero when any of the three failed.
#
#   scripts/test.sh                 # everything, in INFLIGHT_TEST_WORKERS (4) pytest-xdist workers, a file's
#                                   # tests on one worker (its module's servers are set up once); the
#                                   # integration tests mostly wait (server start-ups, measured windows), so
#                                   # four workers keep a 2-core host about 70% busy: 545 s there, 760 s with two
#   scripts/test.sh -m gpu          # extra pytest arguments: one plain pytest run with them
#
# mypy runs in the background while pytest runs (36 s of one core on a fresh clone, in the tests' idle time);
# its report is printed after pytest's.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=$(scripts/setup.sh | tail -n 1)
echo "== ruff"; "$PY" -m ruff check .
"$PY" scripts/trt_stubs.py
mypy_log=$(mktemp)
"$PY" -m mypy >"$mypy_log" 2>&1 &
mypy_pid=$!
trap 'kill "$mypy_pid" 2>/dev/null || true; rm -f "$mypy_log"' EXIT
[ $# -gt 0 ] || set -- -n "${INFLIGHT_TEST_WORKERS:-4}" --dist loadfile
echo "== pytest"; pytest_rc=0; "$PY" -m pytest "$@" || pytest_rc=$?
echo "== mypy"; mypy_rc=0; wait "$mypy_pid" || mypy_rc=$?; cat "$mypy_log"
[ "$pytest_rc" -eq 0 ] || exit "$pytest_rc"
exit "$mypy_rc"
