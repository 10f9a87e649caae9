#!/usr/bin/env bash
# The main job, from a fresh clone: set up .venv (scripts/setup.sh), build bert_tiny, start
# tritonserver with the inflight backend, run a short A/B load test of the stock-equivalent sync
# variant against the pipelined one (on the GPU when there is one, else on the CPU), and print
# what served and how fast. Extra arguments go to `inflight demo` (e.g. --window 30 --users 100).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=$(scripts/setup.sh | tail -n 1)
exec "$PY" -m inflight.cli demo "$@"
