#!/usr/bin/env bash
# Run parts of scripts/lab/run_experiments.sh side by side on a host of several GPUs: one lane per
# GPU, each lane pinned to its own equal share of the cores, so every lane sees what a one-GPU
# host gives one run (on the 4-GPU H200 host: 16 cores per lane, as on the 1-GPU one).
#
#   bash scripts/lab/run_experiments_lanes.sh "sync-a1 sync-a2" "sync-b heads-b" "pipe-a" "pipe-b heads-a"
#
# Lane i (0-based) runs its parts ('-': none, only LANE_AFTER_i) in order on GPU i and cores [i*C, (i+1)*C), C = cores / lanes.
# Each server gets its own Python-backend shared-memory prefix (EXP_LANE). Each part writes
# lane.json (GPU, cores, lanes beside it) next to its results, so a report can say the runs were
# concurrent. LANE_TIMEOUT (s) bounds each lane; LANE_AFTER_i='command' runs after lane i's parts
# on the same GPU and cores (e.g. a test). Logs: $OUT/lane-i.log (or runs/lanes/lane-i.log).
# Caveat, stated with the results: lanes share the host's memory bandwidth, PCIe root and
# loopback network; compare variants of one lane first, across lanes second.
set -uo pipefail
cd "$(dirname "$0")/../.."
source scripts/gpu_lib.sh
[ $# -ge 1 ] || { usage "$0"; exit 2; }
kit_setup
LOGS=${OUT:-runs/lanes}; mkdir -p "$LOGS"
lanes=$#
gpus=$(nvidia-smi -L 2>/dev/null | wc -l)
[ "$gpus" -ge "$lanes" ] || { echo "run_experiments_lanes: $lanes lanes need $lanes GPUs; this host has $gpus" >&2; exit 2; }
cores=$(nproc)
per=$(( cores / lanes ))
[ "$per" -ge 4 ] || { echo "run_experiments_lanes: $cores cores are too few for $lanes lanes" >&2; exit 2; }
ensure_built   # once, before the lanes: they would race to write the same artifacts
export INFLIGHT_BUILT=1 EXP_LANES=$lanes
pids=()
i=0
for parts in "$@"; do
  cpus="$((i * per))-$((i * per + per - 1))"
  after_var="LANE_AFTER_$i"
  (
    export CUDA_VISIBLE_DEVICES=$i EXP_LANE=$i EXP_CPUS=$cpus EXP_LANE_PARTS="$parts"
    # shellcheck disable=SC2086
    if [ "$parts" != - ]; then
      OUT= timeout "${LANE_TIMEOUT:-3600}" taskset -c "$cpus" bash scripts/lab/run_experiments.sh $parts
      echo "== lane $i parts done (rc $?) at $(date +%T)"
    fi
    if [ -n "${!after_var:-}" ]; then
      OUT= timeout "${LANE_AFTER_TIMEOUT:-300}" taskset -c "$cpus" bash -c "${!after_var}"
      echo "== lane $i after-command rc $? at $(date +%T)"
    fi
  ) >"$LOGS/lane-$i.log" 2>&1 &
  pids+=($!)
  echo "lane $i: GPU $i, cores $cpus: $parts (log $LOGS/lane-$i.log)"
  i=$((i + 1))
done
for p in "${pids[@]}"; do wait "$p"; done
ROOT=${EXP_ROOT:-results/experiments}
if [ -n "${OUT:-}" ]; then
  pack_results "$OUT/experiments.tgz" "$ROOT"
fi
grep -h -E "^[A-H] |== lane|passed|failed" "$LOGS"/lane-*.log
