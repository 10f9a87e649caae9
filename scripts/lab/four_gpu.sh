#!/usr/bin/env bash
# Issue 54 on a host of four GPUs and 64 cores, in one device call: capacity at p99 <= 100 ms of all-MiniLM-L6-v2
# served as scripts/lab/gpu_bound.sh serves it (imported as a user imports it, seeded random weights of the
# checkpoint's shape; 32 sequences a request of lengths 16-128, Poisson arrivals, the asyncio generator), one GPU
# against four at C server cores per GPU (C = 8: GPU g's server on cores 8g..8g+7), both four-GPU layouts:
#
#   run 1  one tritonserver per GPU behind nginx (inflight ab --server-per-gpu 0,1,2,3 --balancer nginx),
#          ROUNDS interleaved rounds (A B C D, D C B A, ...) of
#            A  minilm_inflight                        through nginx: four GPUs, the per-GPU layout   RATES4
#            B  minilm_inflight@via=gpu0               straight to GPU 0's server: one GPU, C cores    RATES1
#            C  minilm_null@instances=NULL_INSTANCES   through nginx                                  NULL_RATES
#            D  the same null, via=direct              the generator straight to the servers: C - D is
#                                                      the balancer's own cost, D the generator on schedule
#          (A and B share one load of the model a round, C and D another; the other three servers idle under B)
#   run 2  one tritonserver over the four GPUs on the 4C cores (minilm_inflight@gpus=0/1/2/3: C instances on
#          each GPU, what the importer writes for 4C cores and four GPUs), RATES4, ROUNDS windows at each rate
#          on one load (one variant: nothing to interleave it with)
#
#   OUT=... RATES1=3000,4500 RATES4=12000,18000 NULL_RATES=36000 bash scripts/lab/four_gpu.sh
#   PART=perserver | PART=oneserver: one run alone (two calls, if one does not fit); IMPORT=0: the repository as it is;
#   TOKEN_DIST=text: the same requests' token ids from real text (the issue's second workload), uniform by default
#
# The MiniLM variants run with cupti=true: every window records each GPU's own activity (gpu_activity_by_gpu).
#
# Rates are env vars (req/s): RATES1 brackets one GPU's capacity (gpu_bound.sh's sittings on an H100: 4,000-5,000
# at p99 <= 100 ms), RATES4 four GPUs', NULL_RATES at least twice RATES4's highest (the generator shown on schedule
# there: every window records its late fraction and the generator's CPU).
#
# Cores: servers SERVER_CPUS (0-31; run 1 cuts it into one share per GPU), nginx BALANCER_CPUS (32-39, its own,
# one worker a core; empty: it shares the server cores, one worker per server), generator CLIENT_CPUS (40-63,
# PROCS=24 sources, a multiple of the four servers for via=direct) in both runs.
#
# nginx must travel with the call (the GPU host has no network): name `.venv/nginx` in the device tool's carry
# (1.4 MB: Debian's package as scripts/setup.sh unpacks it; the 64 MiB limit holds the tree, .kit, .minilm and it,
# with results/ moved out as for gpu_bound.sh). The script points INFLIGHT_NGINX at it (or at NGINX=...) and stops
# before any server starts when it does not run there. If the host lacks one of its libraries (libpcre2-8, libssl3,
# libcrypt1, zlib), unpack those Debian packages into .venv/nginx too (apt-get download, dpkg-deb -x): the script
# then runs nginx through a wrapper that puts their folders on LD_LIBRARY_PATH (nginx alone: the servers keep theirs).
#
# Time (one call must stay under 600 s), from gpu_bound.sh's sittings on an H100 (about 12.7 s a window with its
# warm-up, 31 s to load minilm_inflight's 8 instances, 10 s to unload): kit and import about 60 s; run 1: four
# server starts and nginx about 25 s, a round 6 windows (76 s) + one minilm load and unload (41 s) + one null load
# and unload (~5 s) = about 122 s, three rounds about 366 s; run 2: start, one load of 32 instances (~40 s) and
# unload (~15 s), 6 windows (76 s) = about 135 s. In all about 590 s with these defaults (WINDOW=4, WARMUP=2,
# two rates each, ROUNDS=3); each run has a timeout (RUN1_TIMEOUT 430 s, RUN2_TIMEOUT 170 s) that stops it (the
# runner then stops its servers and nginx and writes the windows it finished to interrupted-ab-*.json) rather
# than the call. Results: $OUT/results-four-gpu.tgz (each run's
# JSON and its printed lines) and $OUT/four-gpu.log.
#
# A dry run on a host without GPUs: MODEL=bert_tiny REPO=runs/test-repo IMPORT=0 EXTRA=kind=cpu NO_GPUS=1 GPUS=0,1
# SERVER_CPUS=0-1 BALANCER_CPUS= CLIENT_CPUS= PROCS=2 RATES1=4 RATES4=8 NULL_RATES=40 WINDOW=3 WARMUP=1 ROUNDS=1 SLO=2000
# (SLO: the p99 bound in ms, 100 by default; a 2-core host answers these requests in hundreds of ms)
set -uo pipefail
cd "$(dirname "$0")/../.."
source scripts/gpu_lib.sh
kit_setup
OUT=${OUT:?set OUT}
mkdir -p "$OUT"
MODEL=${MODEL:-minilm}
REPO=${REPO:-model_repository}
GPUS=${GPUS:-0,1,2,3}
SERVER_CPUS=${SERVER_CPUS:-0-31}
BALANCER_CPUS=${BALANCER_CPUS-32-39}
CLIENT_CPUS=${CLIENT_CPUS-40-63}
PROCS=${PROCS:-24}
RATES1=${RATES1:-3000,4500}
RATES4=${RATES4:-12000,18000}
NULL_RATES=${NULL_RATES:-36000}
NULL_INSTANCES=${NULL_INSTANCES:-8}
ROUNDS=${ROUNDS:-3}
PART=${PART:-all}
extra=${EXTRA:+,$EXTRA}
ngpus=$(echo "$GPUS" | tr ',' '\n' | grep -c .)
first_gpu=${GPUS%%,*}
work=/tmp/four-gpu
rm -rf "$work" && mkdir -p "$work"
log=$OUT/four-gpu.log
: >"$log"
say() { echo "$*" | tee -a "$log"; }

# nginx, carried: found by an explicit path, checked before anything costly
NGINX=${NGINX:-$PWD/.venv/nginx/usr/sbin/nginx}
libs=$(ls -d "$PWD"/.venv/nginx/usr/lib/x86_64-linux-gnu "$PWD"/.venv/nginx/lib/x86_64-linux-gnu 2>/dev/null | paste -sd:)
if [ -n "$libs" ] && [ -x "$NGINX" ]; then
  printf '#!/bin/sh\nLD_LIBRARY_PATH=%s${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} exec %s "$@"\n' "$libs" "$NGINX" >"$work/nginx"
  chmod +x "$work/nginx"
  NGINX=$work/nginx
fi
if ! "$NGINX" -v >>"$log" 2>&1; then
  say "four_gpu.sh: nginx does not run here ($NGINX): carry .venv/nginx (scripts/setup.sh unpacks it) or set NGINX;" \
    "missing libraries: $(ldd "$NGINX" 2>/dev/null | grep 'not found' | tr -s ' \t' ' ' | paste -sd';')"
  exit 2
fi
export INFLIGHT_NGINX=$NGINX

if [ "${IMPORT:-1}" = 1 ]; then
  # one GPU's share of the cores and one GPU: minilm_inflight as built gets C instances, each GPU's server its own
  PART=import OUT="$OUT" SERVER_CPUS="$(echo "$SERVER_CPUS" | $PY -c "import sys; from inflight.loadtest.openloop import parse_cpus, share_cpus, format_cpus; print(format_cpus(share_cpus(parse_cpus(sys.stdin.read().strip()), $ngpus)[0]))")" \
    bash scripts/lab/minilm_gpu.sh 2>&1 | grep -E "imported|rror" | cut -c1-400 | tee -a "$log"
fi
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=index,name,memory.used,memory.total --format=csv,noheader | tee -a "$log"

common=(--slo "${SLO:-100}" --items 32 --seq-len 128 --token-dist "${TOKEN_DIST:-uniform}" --length-dist real --window "${WINDOW:-4}"
  --warmup "${WARMUP:-2}" --generator asyncio --processes "$PROCS" --repository "$REPO")
if [ -n "$CLIENT_CPUS" ]; then common+=(--client-cpus "$CLIENT_CPUS"); else common+=(--no-isolate); fi
rc=0

if [ "$PART" = all ] || [ "$PART" = perserver ]; then
  front=(--balancer nginx)
  [ -n "$BALANCER_CPUS" ] && front+=(--balancer-cpus "$BALANCER_CPUS")
  nul="${MODEL}_null@instances=$NULL_INSTANCES${extra},rates=${NULL_RATES//,//}"
  say "== run 1: one server per GPU ($GPUS) on $SERVER_CPUS behind nginx (${BALANCER_CPUS:-the server cores})"
  timeout "${RUN1_TIMEOUT:-430}" inflight ab \
    "${MODEL}_inflight@capture_at_load=false,cupti=true${extra},rates=${RATES4//,//}" \
    "${MODEL}_inflight@capture_at_load=false,cupti=true${extra},via=gpu$first_gpu,rates=${RATES1//,//}" \
    "$nul" "$nul,via=direct" \
    --server-per-gpu "$GPUS" "${front[@]}" --rate "$RATES4" --repeat "$ROUNDS" --server-cpus "$SERVER_CPUS" \
    "${common[@]}" --out "$work/perserver" >"$work/perserver.log" 2>&1
  rc=$?
  grep -E "capacity at|offered .*achieved|servers:|balancer:|CPU sets|INVALID|ERROR|Error" "$work/perserver.log" | tail -n 60 \
    | tee -a "$log"
fi

if [ "$PART" = all ] || [ "$PART" = oneserver ]; then
  place=$([ -n "${NO_GPUS:-}" ] || printf ',gpus=%s' "${GPUS//,//}")
  say "== run 2: one server over the GPUs ($GPUS) on $SERVER_CPUS"
  timeout "${RUN2_TIMEOUT:-170}" inflight ab "${MODEL}_inflight@capture_at_load=false,cupti=true${place}${extra}" \
    --rate "$RATES4" --rate-repeat "$ROUNDS" --server-cpus "$SERVER_CPUS" "${common[@]}" --out "$work/oneserver" \
    >"$work/oneserver.log" 2>&1
  r=$?
  [ "$rc" = 0 ] && rc=$r
  grep -E "capacity at|offered .*achieved|CPU sets|INVALID|ERROR|Error" "$work/oneserver.log" | tail -n 30 | tee -a "$log"
fi

# at most 8 files come back from a call: each run's JSON holds every figure; its printed lines beside it
shopt -s nullglob
(cd "$work" && pack_results "$OUT/results-four-gpu.tgz" ./*/ab-*.json ./*/interrupted-ab-*.json ./*.log)
say "four_gpu.sh: exit $rc; results in $OUT/results-four-gpu.tgz"
exit "$rc"
