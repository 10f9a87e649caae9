#!/usr/bin/env bash
# Issue 30, one core budget in one device call: capacity at p99 <= 50 ms of CAP_VARIANTS (the first one is the
# sync reference), then SYNC and the default at 20%, 50% and 80% of the sync reference's measured capacity.
#
#   CAMPAIGN=results/modes/<date>-<device>-<n>cores SERVER_CPUS=0-3 CLIENT_CPUS=4-15 PROCS=11 \
#   CAP_VARIANTS="bert_tiny_sync@instances=4,... bert_tiny_inflight bert_tiny_plain@instances=4" \
#   FIXED_VARIANTS="<sync spec> bert_tiny_inflight" bash scripts/lab/modes_budget.sh
#
# Both parts run through `gpu_session.sh modes` (its environment applies: WINDOW, WARMUP, CAP_SEARCH,
# SEARCH_OPTS); the sitting is packed into $OUT/results-modes.tgz after each part, its logs in it (<sitting>/logs:
# $OUT itself gets nothing else, since at most eight files come back from it). FIXED_TIMEOUT (360) bounds the
# fixed-rate part (seconds), so that a slow search leaves the packed capacities in place. FIXED_REPEAT (2) runs
# the fixed rates in that many interleaved rounds (A, B, then B, A): the p99 ratios take each rate's median over them,
# since one 8 s window's p99 moves with a single stall of the host (about 2.5 minutes a round for two variants).
# FIXED_SHARES (0.2,0.5,0.8) are the fixed rates as shares of that capacity (0.9,1.0: the knee, where a mode
# that tips into a queue more often shows it). FIXED_NULL (a variant spec; "none" to leave it out) joins the
# fixed part: by default the null model with one instance per server core and a 600 us wait per batch, the
# request path's own p99 at the same rates (what no mode can go below; on a host that stalls, it stalls too).
# BUDGET_PARTS ("cap fixed") runs one part alone in a call: "fixed" reads the sync reference's capacity from a
# cap part already under $CAMPAIGN (e.g. brought back from the previous call and extracted into the tree, which
# then travels with it). STEADY_GATE=1 stops before the fixed part (exit 3, nothing more spent on the host) when a
# sync search of the sitting ran on a host that stalls: its p99 at its lowest rate >= 5x its p50
# (`python -m inflight.lab.modes_results SITTING`, modes_results.STALL_SPREAD); BUDGET_PARTS=steady with it runs
# the check alone.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-runs/gpu-out}
mkdir -p "$OUT"
LOGS=${CAMPAIGN:?set CAMPAIGN=results/modes/<date>-<device>-<n>cores}/logs
mkdir -p "$LOGS"
PY=${PY:-python3}
source scripts/gpu_lib.sh
kit_setup  # once for both parts (INFLIGHT_SETUP_DONE is exported to them)
BUDGET_PARTS=${BUDGET_PARTS:-cap fixed}
if [[ " $BUDGET_PARTS " == *" cap "* ]]; then
  PARTS=cap bash scripts/lab/gpu_session.sh modes > "$LOGS/cap${CAP_TAG:+-$CAP_TAG}.log" 2>&1
  pack_results "$OUT/results-modes.tgz" "$CAMPAIGN"
  grep -E "capacity|CPU sets|rror" "$LOGS/cap${CAP_TAG:+-$CAP_TAG}.log" | tail -20
fi
if [ "${STEADY_GATE:-0}" = 1 ]; then
  $PY -m inflight.lab.modes_results "$CAMPAIGN" 2>&1 | tee -a "$LOGS/steady.log"
  steady=${PIPESTATUS[0]}
  case $steady in
    0|4) ;;  # steady, or no sync search to judge by (the fixed part then has no capacity to start from)
    3) exit 3 ;;
    *) echo "STEADY_GATE: the check itself failed (rc=$steady): stopping before the fixed part"; exit "$steady" ;;
  esac
fi
[[ " $BUDGET_PARTS " == *" fixed "* ]] || exit 0
rates=$(python3 - "$CAMPAIGN" "${FIXED_SHARES:-0.2,0.5,0.8}" <<'EOF'
import glob
import json
import sys

files = sorted(glob.glob(f"{sys.argv[1]}/*-cap-1-*/ab-*.json"))
cap = json.load(open(files[-1]))["summary"][0].get("capacity_rps") if files else None
if cap:
    # to 250 req/s steps at GPU capacities; to two significant digits below 5,000 (never 0)
    def step(x):
        return max(1, int(round(x / 250.0) * 250)) if cap >= 5000 else max(1, int(float(f"{x:.2g}")))
    print(",".join(str(step(cap * float(f))) for f in sys.argv[2].split(",")))
EOF
)
if [ -z "$rates" ]; then
  echo "no capacity for the sync reference: the fixed-rate part is skipped"
  exit 0
fi
echo "fixed rates (${FIXED_SHARES:-0.2,0.5,0.8} of the sync reference's capacity): $rates"
cores=$(count_cpus "${SERVER_CPUS:-0-7}" 2>/dev/null || echo 8)
null=${FIXED_NULL:-bert_tiny_null@instances=$cores,sleep_us=600,gpus=0}
[ "$null" = none ] || FIXED_VARIANTS="${FIXED_VARIANTS:?set FIXED_VARIANTS} $null"
FIXED_VARIANTS=$FIXED_VARIANTS FIXED_REPEAT=${FIXED_REPEAT:-2} FIXED_RATES=$rates PARTS=fixed timeout "${FIXED_TIMEOUT:-360}" bash scripts/lab/gpu_session.sh modes > "$LOGS/fixed.log" 2>&1
echo "fixed part rc=$?"
pack_results "$OUT/results-modes.tgz" "$CAMPAIGN"  # also what a fixed part cut by FIXED_TIMEOUT wrote
grep -E " offered |CPU sets|rror" "$LOGS/fixed.log" | tail -20
