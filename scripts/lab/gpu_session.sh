#!/usr/bin/env bash
# The GPU-host experiments of this repository, one step per device call (each fits in 10 minutes).
#
#   bash scripts/lab/gpu_session.sh throughput   # issue 3: sync at 1/2/4/8 instances vs pipelined at 1/2/4,
#                                            #   1000 users x 50 items, windows interleaved and repeated
#   bash scripts/lab/gpu_session.sh published    # issue 4: the published preset, 120 s per variant;
#                                            #   response-path sweep; live CUPTI metrics
#   bash scripts/lab/gpu_session.sh profile      # issues 5, 30: nsys of sync and pipelined (bert-tiny, bert-small)
#                                            #   under the same load (results/nsys-modes)
#   bash scripts/lab/gpu_session.sh sweep V...   # one short window per variant (model@key=value,...)
#   bash scripts/lab/gpu_session.sh engine       # issue 3: engine-only bound vs the executors (no server)
#   bash scripts/lab/gpu_session.sh heads        # issue 16: linear, stacked and seqlen head engines, inductor vs
#                                            #   eager with the floor (results/engine-heads/<head>.json), and
#                                            #   their kernels at 2048 (results/engine-heads/profiles)
#   bash scripts/lab/gpu_session.sh fixture      # issue 5: the committed nsys fixture, from the profile step
#   bash scripts/lab/gpu_session.sh tracing      # issue 5: live CUPTI metrics on vs off, same load
#   bash scripts/lab/gpu_session.sh samewindow   # issue 5: nsys and the live CUPTI gauges over one window
#   bash scripts/lab/gpu_session.sh ceiling      # issue 3: one null / sync / pipelined instance, HTTP then gRPC
#                                            #   (results/per-instance-ceiling; docs/RESULTS.md "One instance")
#   bash scripts/lab/gpu_session.sh manyceiling  # sync at 8 vs the null model deferring its responses vs pipelined
#                                            #   (results/pipelined-ceiling; docs/RESULTS-ab-runs.md "Many instances")
#   bash scripts/lab/gpu_session.sh stallcontrol # the HTTP unload stall with the null model: HTTP vs gRPC
#   bash scripts/lab/gpu_session.sh capacity     # issue 15: engine bound, generator proof, capacity at p99 <= 50 ms
#                                            #   (sync and pipelined on GPU 0, sync on both GPUs)
#   bash scripts/lab/gpu_session.sh cost [V...] # issue 17: server CPU per request and req/s, closed loop, server on
#                                            #   its own cores: null, sync, pipelined, overlap, auto at 1 and many
#                                            #   instances (results/cpu-cost; the log in $OUT/cost.log as it is written;
#                                            #   AB_CPUS="--server-cpus A --client-cpus B", PROCS, WINDOW, REPEAT)
#   CAMPAIGN=DIR PARTS="gen fixed cap" bash scripts/lab/gpu_session.sh modes  # issue 30: sync against pipelined,
#                                            #   fixed rates and capacity on SERVER_CPUS (see the step)
#   bash scripts/lab/gpu_session.sh costopen     # issues 15/17: capacity at p99 <= 50 ms of sync, the deferred
#                                            #   pipelined mode and auto on GPU 0 (results/open-loop)
#   CAMPAIGN=DIR PARTS="..." bash scripts/lab/gpu_session.sh campaign  # issue 15 in one sitting (see the step)
#   SOAK_RATE=R bash scripts/lab/gpu_session.sh soak  # issue 15: five one-minute open-loop windows at R req/s
#   bash scripts/lab/gpu_session.sh openloop NAME ARGS...  # open-loop `inflight ab ARGS` (variants, --rate/--search)
#                                            #   into $OL_ROOT/<date>-NAME; server and Locust on
#                                            #   disjoint halves of the cores; the log in $OUT/openloop-NAME.log
#
# Needs the offline kit (.kit, docs/LAB.md "Toolchain facts"; then python3 scripts/slim_kit.py .kit so the tree
# and kit fit the device tool's 64 MiB) on a host without network; writes results/
# and copies a tarball of it to $OUT when that is set. WINDOW / WARMUP / USERS / REPEAT override
# the load (e.g. for a dry run on a CPU host).
set -uo pipefail
cd "$(dirname "$0")/../.."
STEP=${1:?usage: gpu_session.sh STEP [ARGS...]; the steps and what each runs are listed at the top of this file}
OUT=${OUT:-runs/gpu-out}
mkdir -p "$OUT" results
source scripts/gpu_lib.sh
kit_setup
USERS=${USERS:-1000}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null || echo "no GPU"
ensure_built bert_tiny ${EXTRA_MODELS:-}

ab() {  # ab OUTDIR WINDOW WARMUP REPEAT VARIANTS...
  local out=$1 window=$2 warmup=$3 repeat=$4; shift 4
  $PY -m inflight.cli ab "$@" ${BACKEND_CONFIG:+--backend-config "$BACKEND_CONFIG"} --preset published --users "$USERS" --window "$window" --warmup "$warmup" \
      --repeat "$repeat" --out "$out" 2>&1 | grep -vE "UserWarning|frombuffer|^\s*$" | tail -40
}

# olab NAME ARGS...: an open-loop `inflight ab` into $OL_ROOT/<date>-NAME (server and Locust on disjoint
# halves of the cores by default); the whole log goes to $OUT/openloop-NAME.log as it is written
# (GENERATOR: locust or asyncio; OLAB_CPUS: e.g. "--server-cpus 0-19 --client-cpus 20-31"; OL_ROOT: the folder;
# OLAB_ARGS: more `inflight ab` options for every run, e.g. "--items 4 --seq-len 16 --slo 150" for a CPU dry run)
olab() {
  local name=$1; shift
  # shellcheck disable=SC2086  # OLAB_CPUS and OLAB_ARGS hold several options
  $PY -m inflight.cli ab "$@" --window "${WINDOW:-8}" --warmup "${WARMUP:-3}" --processes "${PROCS:-15}" \
      --generator "${GENERATOR:-locust}" ${OLAB_CPUS:-} ${OLAB_ARGS:-} \
      --out "${OL_ROOT:-results/open-loop}/$(date +%Y%m%d-%H%M)-$name" 2>&1 | grep --line-buffered -vE "UserWarning|frombuffer|^\s*$" \
      | tee "${OLAB_LOGS:-$OUT}/openloop-$name.log" | grep --line-buffered -E " offered |capacity|soak|CPU sets|INVALID|CAVEAT|rror"
}
# the step's logs go into the sitting (OL_ROOT/logs: packed with it, ignored by git), not loose into $OUT: the
# device tool brings back at most eight files from $OUT, and a ninth once cost a sitting its JSON
sitting_logs() {
  export OLAB_LOGS=${OLAB_LOGS:-$OL_ROOT/logs}
  mkdir -p "$OLAB_LOGS"
}
SEARCH_OPTS=${SEARCH_OPTS:---search-steps 4 --search-tolerance 0.08}
# one folder per sitting: the open-loop summary and its ratios come from the newest one
OL_ROOT=${OL_ROOT:-results/open-loop/$(date +%Y%m%d)-sitting}

# every variant of the cost steps captures only the published sequence bucket at load (the load is seq 64)
FAST_LOAD=${FAST_LOAD:-capture_at_load=false}

case "$STEP" in
  cost)  # issue 17: closed loop, published load, one window each; CPU per request from the server's process tree
    # (variants after the step name replace the default list)
    shift
    if [ $# -eq 0 ]; then
      set -- "bert_tiny_null@instances=8,sleep_us=${NULL_SLEEP_US:-600},gpus=0" \
      "bert_tiny_sync@instances=1,gpus=0,$FAST_LOAD" "bert_tiny_inflight@instances=1,slots=4,gpus=0,$FAST_LOAD" \
      "bert_tiny_inflight@instances=1,mode=overlap,gpus=0,$FAST_LOAD" "bert_tiny_inflight@instances=1,mode=auto,gpus=0,$FAST_LOAD" \
      "bert_tiny_sync@instances=8,gpus=0,$FAST_LOAD" "bert_tiny_inflight@instances=4,slots=4,gpus=0,$FAST_LOAD" \
      "bert_tiny_inflight@instances=8,mode=overlap,gpus=0,$FAST_LOAD" "bert_tiny_inflight@instances=8,mode=auto,gpus=0,$FAST_LOAD"
    fi
    # shellcheck disable=SC2086  # AB_CPUS holds several options (e.g. "--server-cpus 0-7 --client-cpus 8-15")
    timeout "${COST_TIMEOUT:-530}" $PY -m inflight.cli ab ${BACKEND_CONFIG:+--backend-config "$BACKEND_CONFIG"} ${AB_CPUS:-} --preset published --users "$USERS" \
      --window "${WINDOW:-12}" --warmup "${WARMUP:-4}" --repeat "${REPEAT:-1}" --processes "${PROCS:-14}" --out "results/cpu-cost/$(date +%Y%m%d-%H%M)" \
      "$@" 2>&1 | grep --line-buffered -vE "UserWarning|frombuffer|^\s*$" > "$OUT/cost.log"
    tail -40 "$OUT/cost.log"
    pack_results "$OUT/results-cost.tgz" results/cpu-cost; exit 0
    ;;
  campaign)  # issue 15, one sitting into one folder (CAMPAIGN=results/open-loop/<date>-<name>): the compiled engine,
             # the asyncio generator, the server on SERVER_CPUS (0-19) and the generator on CLIENT_CPUS (20-31).
             # PARTS picks and orders the parts, each packed into $OUT as it ends:
             #   bound (engine-only bound), gen (the generator against the null model), sync1 auto1 pipe1 (one GPU),
             #   sync2 auto2 (both GPUs), soak (SOAK_VARIANT at SOAK_RATE, five one-minute windows),
             #   diag, diag2 (where the slow answers come from: see the parts), scale1 (16 instances on one GPU), fe (the front end: see the part),
             #   grpc (the null model and sync@8 over gRPC at FE_RATES), http1 (the same over HTTP),
             #   perserver (one tritonserver per GPU, each on half of the server cores: the null model at PS_NULL_RATES,
             #   sync@8 per GPU by search), perserver1 (one server on GPU 0 with half of the server cores, PS1_CPUS)
    export OL_ROOT=${CAMPAIGN:?set CAMPAIGN=results/open-loop/<date>-<name>}
    sitting_logs
    export GENERATOR=${GENERATOR:-asyncio} PROCS=${PROCS:-11}
    export OLAB_CPUS="--server-cpus ${SERVER_CPUS:-0-19} --client-cpus ${CLIENT_CPUS:-20-31}"
    mkdir -p "$OL_ROOT"
    for part in ${PARTS:?set PARTS, e.g. "bound gen sync1 auto1"}; do
      case $part in
        bound) timeout "${BOUND_TIMEOUT:-120}" $PY -m inflight.cli bench-engine --repository model_repository --iters 100 \
                 --batch 512 --batch 1024 --batch 2048 --out "$OL_ROOT/engine-bound-$(date +%Y%m%d-%H%M).json" \
                 > "$OUT/bound.log" 2>&1; grep -vE "Warning|frombuffer|INFO" "$OUT/bound.log" | tail -16 ;;
        gen) olab generator "bert_tiny_null@instances=8,sleep_us=${NULL_SLEEP_US:-600},gpus=0" --rate "${GEN_RATES:-40k,60k,80k}" ;;
        sync1) olab sync-1gpu "bert_tiny_sync@instances=8,gpus=0,$FAST_LOAD" --search "${SYNC_SEARCH:-20k,60k}" $SEARCH_OPTS ;;
        auto1) olab auto-1gpu "bert_tiny_inflight@instances=8,mode=auto,chunk_items=1024,gpus=0,$FAST_LOAD" \
                 --search "${AUTO_SEARCH:-20k,60k}" $SEARCH_OPTS ;;
        pipe1) olab pipelined-1gpu "bert_tiny_inflight@instances=4,slots=4,gpus=0,$FAST_LOAD" \
                 --search "${PIPE_SEARCH:-10k,40k}" $SEARCH_OPTS ;;
        sync2) olab sync-2gpu "bert_tiny_sync@instances=8,gpus=0/1,$FAST_LOAD" --search "${SYNC2_SEARCH:-30k,90k}" $SEARCH_OPTS ;;
        auto2) olab auto-2gpu "bert_tiny_inflight@instances=8,mode=auto,chunk_items=1024,gpus=0/1,$FAST_LOAD" \
                 --search "${AUTO2_SEARCH:-30k,90k}" $SEARCH_OPTS ;;
        diag) # where the slow answers come from: the null model, sync@8 and sync@8 with gc_freeze at DIAG_RATES,
              # each window's stall summary (generator timeline) and the stubs' GC/execute maxima; DIAG_ARGS adds
              # server arguments (e.g. --server-arg=--http-thread-count=32), DIAG_NAME names the folder
              # shellcheck disable=SC2086  # DIAG_ARGS holds several options
              olab "diag-${DIAG_NAME:-default}" "bert_tiny_null@instances=8,sleep_us=${NULL_SLEEP_US:-600},gpus=0" \
                "bert_tiny_sync@instances=8,gpus=0,$FAST_LOAD" "bert_tiny_sync@instances=8,gpus=0,$FAST_LOAD,gc_freeze=true" \
                --rate "${DIAG_RATES:-30k,38k}" ${DIAG_ARGS:-} ;;
        scale1) # more instances on one GPU: the request path (null), sync and auto at SCALE_INSTANCES (16)
                n=${SCALE_INSTANCES:-16}
                olab "scale-$n-1gpu" "bert_tiny_null@instances=$n,sleep_us=${NULL_SLEEP_US:-600},gpus=0" \
                  "bert_tiny_sync@instances=$n,gpus=0,$FAST_LOAD" \
                  "bert_tiny_inflight@instances=$n,mode=auto,chunk_items=1024,gpus=0,$FAST_LOAD" \
                  --rate "${SCALE_RATES:-35k,42k,50k}" ;;
        fe) # the request path's front end: the null model on GPU 0 and sync@8 per GPU on both at FE_RATES, with the
            # server's busiest threads per window; DIAG_ARGS adds server arguments, FE_NAME names the folder
            # shellcheck disable=SC2086  # DIAG_ARGS holds several options
            olab "frontend-${FE_NAME:-default}" "bert_tiny_null@instances=8,sleep_us=${NULL_SLEEP_US:-600},gpus=0" \
              "bert_tiny_sync@instances=8,gpus=0/1,$FAST_LOAD" --rate "${FE_RATES:-40k,50k,60k}" ${DIAG_ARGS:-} ;;
        http1) # the HTTP half of the grpc part's comparison: the null model and sync@8 on GPU 0 at FE_RATES over HTTP
               # (on a one-GPU host: SERVER_CPUS=0-7 CLIENT_CPUS=8-15 PROCS=7 PARTS="http1 grpc")
               # shellcheck disable=SC2086  # DIAG_ARGS holds several options
               olab "frontend-http" "bert_tiny_null@instances=8,sleep_us=${NULL_SLEEP_US:-600},gpus=0" \
                 "bert_tiny_sync@instances=8,gpus=0,$FAST_LOAD" --rate "${FE_RATES:-40k,50k,60k}" ${DIAG_ARGS:-} ;;
        grpc) # Triton's gRPC front end under the same open-loop load: the null model and sync@8 on GPU 0 at FE_RATES
              # over gRPC (compare with fe, over HTTP, in one sitting); DIAG_ARGS adds server arguments
              # shellcheck disable=SC2086  # DIAG_ARGS holds several options
              olab "frontend-grpc" "bert_tiny_null@instances=8,sleep_us=${NULL_SLEEP_US:-600},gpus=0" \
                "bert_tiny_sync@instances=8,gpus=0,$FAST_LOAD" --rate "${FE_RATES:-40k,50k,60k}" --protocol grpc ${DIAG_ARGS:-} ;;
        diag2) # where the slow answers come from on both GPUs (sync@8 per GPU) at DIAG2_RATES
               olab diag-2gpu "bert_tiny_sync@instances=8,gpus=0/1,$FAST_LOAD" --rate "${DIAG2_RATES:-40k,50k,60k}" ;;
        perserver) # the common production deployment: one tritonserver per GPU (PS_GPUS, 0,1), each seeing its GPU
                   # alone on its contiguous half of SERVER_CPUS, the generator's sources spread over both: the null
                   # model at PS_NULL_RATES (the two request paths' ceiling), then sync@8 per server by search (against
                   # sync2: one server for both GPUs); DIAG_ARGS adds server arguments to every server; PS_PROCS (10)
                   # generator sources, a multiple of the servers so that each gets the same rate
                   # shellcheck disable=SC2086  # DIAG_ARGS holds several options
                   PROCS=${PS_PROCS:-10} olab perserver-null "bert_tiny_null@instances=8,sleep_us=${NULL_SLEEP_US:-600}" \
                     --rate "${PS_NULL_RATES:-60k,80k,100k}" --server-per-gpu "${PS_GPUS:-0,1}" ${DIAG_ARGS:-}
                   # shellcheck disable=SC2086  # SEARCH_OPTS and DIAG_ARGS hold several options
                   PROCS=${PS_PROCS:-10} olab perserver-sync "bert_tiny_sync@instances=8,$FAST_LOAD" --search "${PS_SEARCH:-35k,80k}" \
                     $SEARCH_OPTS --server-per-gpu "${PS_GPUS:-0,1}" ${DIAG_ARGS:-} ;;
        perserver1) # one of perserver's servers alone: GPU 0 with half of the server cores (PS1_CPUS, 0-9; the
                    # generator keeps CLIENT_CPUS), sync@8 by search, beside sync1 (one server, GPU 0, all 20 cores)
                    # shellcheck disable=SC2086  # SEARCH_OPTS and DIAG_ARGS hold several options
                    OLAB_CPUS="--server-cpus ${PS1_CPUS:-0-9} --client-cpus ${CLIENT_CPUS:-20-31}" \
                      olab perserver-1gpu "bert_tiny_sync@instances=8,$FAST_LOAD" --search "${PS1_SEARCH:-20k,60k}" \
                      $SEARCH_OPTS --server-per-gpu 0 ${DIAG_ARGS:-} ;;
        soak) WINDOW=60 olab soak "${SOAK_VARIANT:?set SOAK_VARIANT}" --rate "${SOAK_RATE:?set SOAK_RATE}" \
                --rate-repeat "${SOAK_WINDOWS:-5}" ;;
        *) echo "unknown part $part" >&2 ;;
      esac
      pack_results "$OUT/results-campaign.tgz" "$OL_ROOT"
    done
    exit 0
    ;;
  modes)  # issue 30, one sitting into one folder (CAMPAIGN=results/open-loop/<date>-<name>): sync against pipelined
           # with the server on SERVER_CPUS and the asyncio generator on CLIENT_CPUS (PROCS sources). PARTS, in order,
           # each packed into $OUT as it ends:
           #   gen    the null model at GEN_RATES (the generator proven on schedule)
           #   fixed  every variant of FIXED_VARIANTS (space-separated specs) at FIXED_RATES, one server
           #          (FIXED_REPEAT rounds, interleaved A,B then B,A, when set)
           #   cap    capacity at p99 <= 50 ms of each variant of CAP_VARIANTS by search over CAP_SEARCH, one folder each
           #          (cap-[CAP_TAG-]<n>-<model>)
           #          (after the fixed rates CAP_RATES, when set)
           # The configs are first written for SERVER_CPUS (`build-models --server-cpus`), so the variant
           # `<model>_inflight` without overrides is the repository's default for that core budget. The GPU
           # memory of the server's processes is recorded in every window (gpu_memory). BUILD_GPUS / BUILD_CPUS:
           # the GPUs and cores one server will see, when not all of the host's GPUs or not SERVER_CPUS (one server
           # per GPU: each gets its share).
           # gen may run on its own CPU sets (GEN_SERVER_CPUS, GEN_CLIENT_CPUS, GEN_PROCS); GEN_PLACEMENT (",gpus=0")
           # places the null model (empty on a host without GPUs).
    export OL_ROOT=${CAMPAIGN:?set CAMPAIGN=results/open-loop/<date>-<name>}
    sitting_logs
    export GENERATOR=asyncio PROCS=${PROCS:-7}
    export OLAB_CPUS="--server-cpus ${SERVER_CPUS:-0-7} --client-cpus ${CLIENT_CPUS:-8-15}"
    mkdir -p "$OL_ROOT"
    # shellcheck disable=SC2086  # EXTRA_MODELS holds several names
    $PY -m inflight.cli build-models bert_tiny ${EXTRA_MODELS:-} --configs-only \
      --server-cpus "${BUILD_CPUS:-${SERVER_CPUS:-0-7}}" ${BUILD_GPUS:+--gpus "$BUILD_GPUS"} \
      > "$OLAB_LOGS/configs.log" 2>&1 || { echo "build-models --configs-only failed"; tail -5 "$OLAB_LOGS/configs.log"; }
    for part in ${PARTS:?set PARTS, e.g. "gen fixed cap"}; do
      case $part in
        gen) OLAB_CPUS="--server-cpus ${GEN_SERVER_CPUS:-${SERVER_CPUS:-0-7}} --client-cpus ${GEN_CLIENT_CPUS:-${CLIENT_CPUS:-8-15}}" \
               PROCS=${GEN_PROCS:-$PROCS} olab generator "bert_tiny_null@instances=${GEN_INSTANCES:-8},sleep_us=${NULL_SLEEP_US:-600}${GEN_PLACEMENT-,gpus=0}" \
               --rate "${GEN_RATES:-50k}" ;;
        # shellcheck disable=SC2086  # FIXED_VARIANTS holds several specs
        fixed) olab "fixed${FIXED_NAME:+-$FIXED_NAME}" ${FIXED_VARIANTS:?set FIXED_VARIANTS} --rate "${FIXED_RATES:?set FIXED_RATES}" \
             ${FIXED_REPEAT:+--repeat "$FIXED_REPEAT"} ;;
        cap) i=0
             for v in ${CAP_VARIANTS:?set CAP_VARIANTS}; do
               i=$((i + 1))
               # shellcheck disable=SC2086  # SEARCH_OPTS holds several options
               olab "cap-${CAP_TAG:+$CAP_TAG-}$i-${v%%@*}" "$v" ${CAP_RATES:+--rate "$CAP_RATES"} --search "${CAP_SEARCH:-10k,40k}" $SEARCH_OPTS
               pack_results "$OUT/results-modes.tgz" "$OL_ROOT"
             done ;;
        *) echo "unknown part $part" >&2 ;;
      esac
      pack_results "$OUT/results-modes.tgz" "$OL_ROOT"
    done
    exit 0
    ;;
  costopen)  # issues 15/17: capacity at the SLO with the compiled engine, one GPU: sync, deferred pipelined, auto
    olab sync-1gpu-compiled "bert_tiny_sync@instances=8,gpus=0,$FAST_LOAD" --search "${SYNC_SEARCH:-15k,45k}" $SEARCH_OPTS
    olab auto-1gpu-compiled "bert_tiny_inflight@instances=8,mode=auto,chunk_items=1024,gpus=0,$FAST_LOAD" --search "${AUTO_SEARCH:-15k,45k}" $SEARCH_OPTS
    olab pipelined-1gpu-compiled "bert_tiny_inflight@instances=4,slots=4,gpus=0,$FAST_LOAD" --search "${PIPE_SEARCH:-10k,40k}" $SEARCH_OPTS
    pack_results "$OUT/results-$STEP.tgz" results/open-loop; exit 0
    ;;
  ceiling)  # the most one Python-backend instance can serve (null model) beside one sync and one pipelined
    for proto in http grpc; do
      ab "results/per-instance-ceiling/$(date +%Y%m%d-%H%M)-$proto" "${WINDOW:-30}" "${WARMUP:-5}" "${REPEAT:-1}" \
        --protocol "$proto" 'bert_tiny_null@instances=1' 'bert_tiny_null@instances=1,sender_threads=8' \
        'bert_tiny_sync@instances=1' 'bert_tiny_inflight@instances=1,slots=4'
    done
    ;;
  manyceiling)  # many instances: sync, the null model deferring its responses, pipelined, one lane's cores
    ab "results/pipelined-ceiling/$(date +%Y%m%d-%H%M)" "${WINDOW:-30}" "${WARMUP:-5}" "${REPEAT:-1}" \
      'bert_tiny_sync@instances=8' 'bert_tiny_null@instances=8,sleep_us=1900,sender_threads=8' \
      'bert_tiny_null@instances=8,sleep_us=1900,sender_threads=2' 'bert_tiny_inflight@instances=6,slots=2,response_threads=2'
    ;;
  openloop)  # open loop: arrivals at rates, capacity at the p99 SLO; the whole log goes to $OUT as it is written
    name=${2:?usage: gpu_session.sh openloop NAME VARIANT... --rate R1,R2 [--search LO,HI] [ab options]}
    shift 2
    olab "$name" "$@"
    pack_results "$OUT/results-openloop-$name.tgz" results/open-loop
    exit 0
    ;;
  capacity)  # issue 15: engine-only bound, the generator against the null model, capacity at p99 <= 50 ms of
             # the best sync and pipelined configurations on GPU 0, and of both GPUs (results/open-loop)
    timeout 120 $PY -m inflight.cli bench-engine --repository model_repository --iters 100 --batch 512 --batch 1024 \
      --batch 2048 --out "$OL_ROOT/engine-bound-$(date +%Y%m%d-%H%M).json" 2>&1 | grep -v "INFO inflight.bench" | tail -8
    olab generator 'bert_tiny_null@instances=8,sleep_us=1900,gpus=0' --rate "${GEN_RATES:-40k,56k,72k}"
    olab sync-1gpu 'bert_tiny_sync@instances=8,gpus=0' --search "${SYNC_SEARCH:-12k,24k}" $SEARCH_OPTS
    olab pipelined-1gpu 'bert_tiny_inflight@instances=4,slots=4,gpus=0' --search "${PIPE_SEARCH:-10k,20k}" $SEARCH_OPTS
    olab sync-2gpu 'bert_tiny_sync@instances=8,gpus=0/1' --search "${SYNC2_SEARCH:-20k,40k}" $SEARCH_OPTS
    pack_results "$OUT/results-$STEP.tgz" results/open-loop; exit 0
    ;;
  soak)  # issue 15: SOAK_RATE req/s for SOAK_WINDOWS one-minute windows on one loaded variant (SOAK_VARIANT)
    WINDOW=60 olab soak "${SOAK_VARIANT:-bert_tiny_inflight@instances=4,slots=4,gpus=0}" \
      --rate "${SOAK_RATE:?set SOAK_RATE to 80% of the measured capacity}" --rate-repeat "${SOAK_WINDOWS:-5}"
    pack_results "$OUT/results-$STEP.tgz" results/open-loop; exit 0
    ;;
  stallcontrol)  # does the unload stall happen without our code? the null model at 8 instances, HTTP vs gRPC
    for proto in http grpc; do
      ab "results/diagnostics/$(date +%Y%m%d-%H%M)-stall-control-$proto" "${WINDOW:-30}" "${WARMUP:-5}" "${REPEAT:-2}" \
        --protocol "$proto" --unload-timeout 20 --unload-grace 25 'bert_tiny_null@instances=8,sleep_us=1900'
    done
    ;;
  throughput)
    ab results/throughput "${WINDOW:-15}" "${WARMUP:-5}" "${REPEAT:-2}" \
      'bert_tiny_sync@instances=1' 'bert_tiny_inflight@instances=1' \
      'bert_tiny_sync@instances=2' 'bert_tiny_inflight@instances=2' \
      'bert_tiny_sync@instances=4' 'bert_tiny_inflight@instances=4' 'bert_tiny_sync@instances=8'
    ;;
  sweep)  # sweep VARIANT...: one window each, for choosing defaults (results/sweep)
    shift
    ab results/sweep "${WINDOW:-10}" "${WARMUP:-4}" "${REPEAT:-1}" "$@"
    ;;
  published)
    ab results/published "${WINDOW:-120}" "${WARMUP:-10}" 1 'bert_tiny_sync@instances=1' 'bert_tiny_inflight@instances=1'
    # the response path: send threads and completion wait, plus live CUPTI gauges in the stub
    ab results/response-path "${SWEEP_WINDOW:-12}" 4 1 \
      'bert_tiny_inflight@response_threads=8' 'bert_tiny_inflight@response_threads=1' \
      'bert_tiny_inflight@response_threads=16' 'bert_tiny_inflight@completion_wait=poll' \
      'bert_tiny_inflight@cupti=true'
    ;;
  profile)  # issues 5 and 30: nsys of each of PROFILE_VARIANTS ("name=spec ...", default sync and pipelined for
            # bert-tiny and bert-small) under the same published load, one folder each under PROFILE_ROOT
            # (results/nsys-modes), and their summary side by side
    root=${PROFILE_ROOT:-results/nsys-modes}
    dbs=()
    # shellcheck disable=SC2086  # PROFILE_MODELS holds several names
    $PY -m inflight.cli build-models ${PROFILE_MODELS:-bert_tiny bert_small} --configs-only > "$OUT/configs.log" 2>&1
    # shellcheck disable=SC2086
    ensure_built ${PROFILE_MODELS:-bert_tiny bert_small}
    fast=capture_at_load=false
    for nv in ${PROFILE_VARIANTS:-bert_tiny-sync=bert_tiny_sync@instances=4,$fast \
        bert_tiny-pipelined=bert_tiny_inflight@instances=4,mode=pipelined,$fast \
        bert_small-sync=bert_small_sync@instances=1,$fast \
        bert_small-pipelined=bert_small_inflight@instances=1,mode=pipelined,slots=4,$fast}; do
      name=${nv%%=*}
      profile_loaded "$root/$name" "$name" "${nv#*=}" "${DELAY:-15}" "${WINDOW:-5}" 2>&1 | tail -8
      dbs+=("$root/$name/$name.sqlite")
      pack_results "$OUT/results-profile.tgz" "$root"
    done
    $PY -m inflight.cli nsys-summary "${dbs[@]}" --out "$root" 2>&1 | tail -30
    pack_results "$OUT/results-profile.tgz" "$root"
    ;;
  final)  # published (issue 4) + live CUPTI gauges + nsys (issue 5) in one call, each part time-boxed
    timeout 330 bash "$0" _published_only
    tar czf "$OUT/results-published.tgz" results 2>/dev/null
    timeout 70 bash "$0" _cupti_only
    tar czf "$OUT/results-cupti.tgz" results/cupti 2>/dev/null
    WINDOW=4 DELAY=10 timeout 190 bash "$0" profile
    ;;
  heads)  # issue 16: the three heads' engines (inductor vs eager, time vs floor), one JSON per head
    ensure_built linear_head stacked_head seqlen_head
    mkdir -p results/engine-heads
    for head in linear_head stacked_head seqlen_head; do
      timeout "${HEAD_TIMEOUT:-170}" $PY -m inflight.cli bench-engine --model "$head" --repository model_repository \
        --iters "${ITERS:-100}" --out "results/engine-heads/$head.json" > "$OUT/heads-$head.log" 2>&1
      echo "$head rc=$?"; grep -v "INFO inflight.bench" "$OUT/heads-$head.log" | tail -6
    done
    # where each head's time goes at 2048: the served engine and the published head as the engine
    # ran it before (inductor), kernel by kernel (GEMM kernels vs the others)
    mkdir -p results/engine-heads/profiles
    for head in linear_head stacked_head seqlen_head; do
      # the published head's make_module options, or "same" when the served engine is the engine before
      ref=$($PY -c "from inflight.models import MODELS; s = MODELS['$head']; o = s.reference_options
print(' '.join(f'--module {k}={str(v).lower()}' for k, v in o.items()) or ('same' if s.gpu_compile == 'inductor' else ''))")
      timeout 120 $PY scripts/lab/profile_engine.py --model "$head" --batch 2048 \
        --out "results/engine-heads/profiles/$head-served.json" > "$OUT/profile-$head.log" 2>&1
      # shellcheck disable=SC2086
      [ "$ref" = same ] || timeout 120 $PY scripts/lab/profile_engine.py --model "$head" --batch 2048 --compile inductor \
        $ref --out "results/engine-heads/profiles/$head-before.json" >> "$OUT/profile-$head.log" 2>&1
      echo "$head profiles rc=$?"; grep -A3 "^batch" "$OUT/profile-$head.log"
    done
    rm -f results/engine-heads/profiles/*.pt2
    pack_results "$OUT/results-heads.tgz" results/engine-heads; exit 0
    ;;
  engine)  # issue 3: engine-only bound vs sync vs pipelined executors, no server
    timeout 200 $PY -m inflight.cli bench-engine --repository model_repository --iters 200 \
      --out results/engine_bench.json 2>&1 | grep -v "INFO inflight.bench" | tail -12
    ;;
  fixture)  # issue 5: trim the pipelined nsys capture (from the profile step) into the committed test fixture
    $PY -m inflight.cli nsys-trim results/nsys-modes/bert_tiny-pipelined/bert_tiny-pipelined.sqlite \
      tests/unit/fixtures/nsys-bert_tiny_inflight.sqlite --keep-ms "${KEEP_MS:-60}" --skip-ms 100
    cp tests/unit/fixtures/nsys-bert_tiny_inflight.sqlite "$OUT/"
    ;;
  samewindow)  # issue 5: nsys of sync and pipelined with cupti=true; the gauges scraped in the capture window
    for v in 'bert_tiny_sync@instances=4,cupti=true' 'bert_tiny_inflight@instances=1,cupti=true'; do
      name=${v%%@*}
      profile_loaded "results/nsys-live/$name" "$name" "$v" "${DELAY:-10}" "${WINDOW:-5}" 2>&1 | tail -6
    done
    $PY -m inflight.cli nsys-summary results/nsys-live/bert_tiny_sync/bert_tiny_sync.sqlite \
      results/nsys-live/bert_tiny_inflight/bert_tiny_inflight.sqlite --out results/nsys-live 2>&1 | tail -40
    ;;
  tracing)  # issue 5: live CUPTI metrics on vs off through the server, interleaved and repeated
    ab results/tracing "${WINDOW:-10}" "${WARMUP:-4}" "${REPEAT:-2}" \
      'bert_tiny_inflight@instances=1' 'bert_tiny_inflight@instances=1,cupti=true'
    ;;
  _cupti_only)
    ab results/cupti 12 4 1 'bert_tiny_inflight@cupti=true'
    exit 0
    ;;
  _published_only)
    ab results/published "${WINDOW:-120}" "${WARMUP:-5}" 1 'bert_tiny_sync@instances=1' 'bert_tiny_inflight@instances=1'
    exit 0
    ;;
  *) echo "unknown step $STEP" >&2; exit 2 ;;
esac
pack_results "$OUT/results-$STEP.tgz" results
ls -la "$OUT"
