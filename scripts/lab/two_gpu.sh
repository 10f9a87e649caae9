#!/usr/bin/env bash
# Issue 33 on a host of two GPUs: capacity at p99 <= 50 ms (Poisson, 50 items x seq 64) at equal server cores per
# GPU, one layout per device call (each call ends well inside the device tool's 10 minutes), into one sitting:
#
#   LAYOUT=one        one GPU (GPU 0) with C server cores (ONE_CPUS, 0-11): sync with C instances and
#                     <model>_inflight as built for C cores and one GPU
#   LAYOUT=two        both GPUs in one server with 2C cores (TWO_CPUS, 0-23): sync with C instances on each GPU
#                     and <model>_inflight as built for 2C cores and two GPUs (C on each)
#   LAYOUT=perserver  one tritonserver per GPU, each on its half of TWO_CPUS and seeing its GPU alone: sync with C
#                     instances per server and <model>_inflight as built for C cores and one GPU
#   LAYOUT=gen        the generator proven: the null model (2C instances over TWO_CPUS) at GEN_RATES, which should
#                     reach at least twice the best two-GPU capacity
#
#   CAMPAIGN=results/two-gpu/<date>-<device> LAYOUT=one bash scripts/lab/two_gpu.sh
#
# The generator (asyncio, PROCS sources) always runs on CLIENT_CPUS (24-31), so the layouts differ only in the
# server's cores and GPUs. ONE_SEARCH / TWO_SEARCH bound the searches (req/s, low,high), SYNC_ONLY=1 leaves the
# inflight variant out (a shorter call), INFLIGHT_ONLY=1 the sync one, VARIANT_EXTRA appends overrides to every spec (e.g. kind=cpu for a dry run
# on a host without GPUs, with LAYOUT=one and gpus dropped by NO_GPUS=1). Every part packs the sitting into
# $OUT/results-two-gpu.tgz as it ends (gpu_session.sh modes does); the log is $OUT/two-gpu-<layout>.log.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-runs/gpu-out}
mkdir -p "$OUT"
PY=${PY:-python3}
source scripts/gpu_lib.sh
kit_setup
: "${CAMPAIGN:?set CAMPAIGN=results/two-gpu/<date>-<device>}"
LAYOUT=${LAYOUT:?set LAYOUT to one, two, perserver or gen}
ONE_CPUS=${ONE_CPUS:-0-11}
TWO_CPUS=${TWO_CPUS:-0-23}
CLIENT_CPUS=${CLIENT_CPUS:-24-31}
PROCS=${PROCS:-8}
C=$(count_cpus "$ONE_CPUS")
extra=${VARIANT_EXTRA:+,$VARIANT_EXTRA}
# gpus=... for a spec, or nothing on a dry run without GPUs
g() { [ -n "${NO_GPUS:-}" ] || printf ',gpus=%s' "$1"; }
sync_spec() { echo "bert_tiny_sync@instances=$C$(g "$1"),capture_at_load=false$extra"; }
# <model>_inflight as built (no override but placement): what the repository deploys for these cores and GPUs
inflight_spec() { echo "bert_tiny_inflight@capture_at_load=false$(g "$1")$extra"; }
variants() {
  if [ -n "${SYNC_ONLY:-}" ]; then sync_spec "$1"
  elif [ -n "${INFLIGHT_ONLY:-}" ]; then inflight_spec "$1"
  else echo "$(sync_spec "$1") $(inflight_spec "$1")"; fi
}

run_modes() {  # run_modes SERVER_CPUS BUILD_GPUS SEARCH VARIANTS [extra env...]
  local cpus=$1 gpus=$2 search=$3 vs=$4
  shift 4
  env "$@" CAMPAIGN="$CAMPAIGN" SERVER_CPUS="$cpus" CLIENT_CPUS="$CLIENT_CPUS" PROCS="$PROCS" BUILD_GPUS="$gpus" \
    PARTS=cap CAP_TAG="$LAYOUT" CAP_SEARCH="$search" CAP_VARIANTS="$vs" bash scripts/lab/gpu_session.sh modes
}

case $LAYOUT in
  one) run_modes "$ONE_CPUS" 1 "${ONE_SEARCH:-15k,45k}" "$(variants 0)" ;;
  two) run_modes "$TWO_CPUS" 2 "${TWO_SEARCH:-30k,90k}" "$(variants 0/1)" ;;
  perserver)
    # one server per GPU: each is built for its own half of the cores and sees one GPU; the A/B runner splits
    # SERVER_CPUS between the servers and the generator's sources between them
    run_modes "$TWO_CPUS" 1 "${TWO_SEARCH:-30k,90k}" "$(NO_GPUS=1 variants x)" \
      BUILD_CPUS="$ONE_CPUS" OLAB_ARGS="--server-per-gpu ${PS_GPUS:-0,1} ${OLAB_ARGS:-}" ;;
  gen) env CAMPAIGN="$CAMPAIGN" SERVER_CPUS="$TWO_CPUS" CLIENT_CPUS="$CLIENT_CPUS" PROCS="$PROCS" PARTS=gen \
         GEN_PLACEMENT="$(g 0)" \
         GEN_INSTANCES=$((2 * C)) GEN_RATES="${GEN_RATES:-60k,90k,120k}" bash scripts/lab/gpu_session.sh modes ;;
  *) echo "LAYOUT=$LAYOUT: use one, two, perserver or gen" >&2; exit 2 ;;
esac > "$OUT/two-gpu-$LAYOUT.log" 2>&1
rc=$?
pack_results "$OUT/results-two-gpu.tgz" "$CAMPAIGN"
grep -E "capacity|offered|CPU sets|rror" "$OUT/two-gpu-$LAYOUT.log" | tail -20
exit $rc
