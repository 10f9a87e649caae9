#!/usr/bin/env bash
# The published experiment plan on one H100/H200 host, resumable in parts (issue 6).
#
#   bash scripts/lab/run_experiments.sh all                # every part not yet done, in order
#   bash scripts/lab/run_experiments.sh sync-a1 pipe-b     # named parts (each fits a 10-minute call)
#
# Parts (variants: `inflight experiments plan PART`):
#   sync-a1  bert_tiny sync: 4 instances 500 us; 4 instances, preferred 512/1024/2000
#   sync-a2  bert_tiny sync: 4 instances, preferred 1024/1500/2000; 8 instances
#   sync-b   bert_tiny sync: 6 instances 1000 us; 6 instances + CUDA graphs; 1 instance + CUDA graphs
#   pipe-a   bert_tiny pipelined: 1 and 2 instances x 2 and 4 slots
#   pipe-b   bert_tiny pipelined: 4 instances x 2 and 4 slots
#   heads-a  linear and stacked heads, sync vs pipelined
#   heads-b  seqlen head, sync vs pipelined
#   bound    engine-only bound (back-to-back graph replays) at the batch sizes the runs formed
#   nsys     Nsight Systems summaries of the best sync and the best pipelined configuration
#   summary  results/summary.json and docs/RESULTS.md, from the JSON files only
# A part that finished leaves results/experiments/<part>/DONE and is skipped (FORCE=1 reruns it).
# Same load for every variant: 1000 users x 50 items, WINDOW s (default 60) after WARMUP s.
# USERS / WINDOW / WARMUP override it (HEADS_WINDOW: the heads parts' window, default WINDOW;
# UNLOAD_TIMEOUT: seconds a variant may take to unload, default 120; UNLOAD_GRACE: the extra wait,
# default 60, after which an unload counts as stalled and its stubs are dumped). BOUND_BATCHES="40 2000" and BEST_SYNC / BEST_PIPELINED
# (model@key=value,...) give the bound and nsys parts their inputs when the runs' results are not
# in EXP_ROOT (e.g. they ran in an earlier call). On a host of several GPUs,
# scripts/lab/run_experiments_lanes.sh runs parts side by side, one GPU and one share of the cores each
# (it sets EXP_LANE, which gives each server its own Python-backend shared-memory prefix).
# A dry run on a CPU host:
#   EXP_ROOT=runs/exp-dry/experiments USERS=20 WINDOW=2 WARMUP=1 bash scripts/lab/run_experiments.sh sync-b pipe-b summary).
set -uo pipefail
cd "$(dirname "$0")/../.."
source scripts/gpu_lib.sh
[ $# -ge 1 ] || { usage "$0"; exit 2; }
kit_setup
ROOT=${EXP_ROOT:-results/experiments}   # a dry run elsewhere: EXP_ROOT=runs/exp-dry/experiments
WINDOW=${WINDOW:-60}
WARMUP=${WARMUP:-5}
USERS=${USERS:-1000}
mkdir -p "$ROOT"
[ -n "${INFLIGHT_BUILT:-}" ] || ensure_built
extra=()
[ -n "${EXP_LANE:-}" ] && extra+=(--backend-config "python,shm-region-prefix-name=inflight_lane${EXP_LANE}_")
[ -n "${UNLOAD_TIMEOUT:-}" ] && extra+=(--unload-timeout "$UNLOAD_TIMEOUT")
[ -n "${UNLOAD_GRACE:-}" ] && extra+=(--unload-grace "$UNLOAD_GRACE")

# lane_info DIR: where this part ran (GPU, cores, lanes beside it) when run_experiments_lanes.sh started it
lane_info() {
  [ -n "${EXP_LANE:-}" ] || return 0
  printf '{"lane": %s, "lanes": %s, "cuda_visible_devices": "%s", "cpus": "%s", "parts": "%s"}\n' \
    "$EXP_LANE" "${EXP_LANES:-1}" "${CUDA_VISIBLE_DEVICES:-}" "${EXP_CPUS:-}" "${EXP_LANE_PARTS:-}" >"$1/lane.json"
}

parts=("$@")
[ "$1" = all ] && parts=(sync-a1 sync-a2 sync-b pipe-a pipe-b heads-a heads-b bound nsys summary)

for part in "${parts[@]}"; do
  out="$ROOT/$part"
  if [ -f "$out/DONE" ] && [ -z "${FORCE:-}" ]; then echo "== $part: done already ($out/DONE)"; continue; fi
  echo "== $part ($(date +%T))"
  mkdir -p "$out"
  case "$part" in
    sync-a1|sync-a2|sync-b|pipe-a|pipe-b|heads-a|heads-b)
      mapfile -t variants < <($PY -m inflight.cli experiments plan "$part")
      window=$WINDOW; [[ $part == heads-* ]] && window=${HEADS_WINDOW:-$WINDOW}
      lane_info "$out"
      $PY -m inflight.cli ab "${variants[@]}" "${extra[@]}" --preset published --users "$USERS" --window "$window" \
        --warmup "$WARMUP" --out "$out" 2>&1 | tee "$out/ab.log" | grep -E "req/s, p50|INVALID|CAVEAT|rror|^[A-H] " || true
      # DONE only when the newest result is valid (every run had successful requests, no Locust trouble)
      $PY -c "import json, sys; from inflight.lab.experiments import latest_ab; from pathlib import Path; \
p = latest_ab(Path('$out')); sys.exit(0 if p and json.loads(p.read_text()).get('valid') else 1)" \
        && touch "$out/DONE" || echo "== $part: result missing or INVALID; not marked done (rerun the part)"
      ;;
    bound)
      batches=${BOUND_BATCHES:-$($PY -m inflight.cli experiments batches --root "$ROOT")} || continue
      lane_info "$out"
      args=(); for b in $batches; do args+=(--batch "$b"); done
      $PY -m inflight.cli bench-engine --repository model_repository "${args[@]}" --iters 200 \
        --out "$ROOT/engine_bound.json" 2>&1 | grep -v "INFO inflight.bench" | tail -12
      [ -f "$ROOT/engine_bound.json" ] && touch "$out/DONE"
      ;;
    nsys)
      for mode in sync pipelined; do
        override=BEST_${mode^^}
        v=${!override:-$($PY -m inflight.cli experiments best "$mode" --root "$ROOT")} || continue 2
        lane_info "$out"
        profile_loaded "$out/best_$mode" "best_$mode" "$v" "${NSYS_DELAY:-15}" "${NSYS_WINDOW:-5}" 2>&1 | tail -4
      done
      $PY -m inflight.cli nsys-summary "$out/best_sync/best_sync.sqlite" "$out/best_pipelined/best_pipelined.sqlite" \
        --label best_sync --label best_pipelined --out "$out" 2>&1 | tail -25
      [ -f "$out/summary.json" ] && touch "$out/DONE"
      ;;
    summary)
      $PY -m inflight.cli experiments summary --root "$ROOT" --out "$(dirname "$ROOT")/summary.json" || continue
      [ "$ROOT" = results/experiments ] && $PY -m inflight.cli results-report
      ;;
    *) echo "unknown part $part; parts: sync-a1 sync-a2 sync-b pipe-a pipe-b heads-a heads-b bound nsys summary" >&2; exit 2 ;;
  esac
done
if [ -n "${OUT:-}" ]; then
  pack_results "$OUT/experiments.tgz" "$ROOT" "$(dirname "$ROOT")/summary.json"
fi
