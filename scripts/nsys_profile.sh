#!/usr/bin/env bash
# Profile a running-under-load server (tritonserver) with Nsight Systems for a fixed window.
# Run with --help for usage. Everything lands in one folder (--out).
set -euo pipefail

PROG=$(basename "$0")
SCRIPT_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

usage() {
  cat <<EOF
Usage: $PROG --out DIR --server 'CMD' [--load 'CMD'] [options]

Profiles the process tree of CMD (e.g. tritonserver) with Nsight Systems for a fixed window
while a load generator runs, then exports sqlite, writes 'nsys stats' CSVs and (when the
inflight package is importable) the summary of scripts/nsys_summary.py.

Required:
  -o, --out DIR           output folder (created; existing files of the same --name are replaced)
  -s, --server CMD        command to profile, run with 'bash -c' (e.g. a tritonserver command line)

Load and timing:
  -l, --load CMD          load command (bash -c), started once the server is ready, e.g.
                          'locust -f loadtest/locustfile.py --headless -u 1000 -t 60s ...'
                          or an 'inflight ab'-style run. It should outlast --delay + --window;
                          it is stopped after the capture unless --wait-load is given.
  -d, --delay SEC         seconds of load before the capture starts (default 10)
  -w, --window SEC        capture length in seconds (default 5)
  -r, --ready-url URL     poll until this URL answers 200 before starting the load
                          (default http://localhost:8000/v2/health/ready; 'none' to skip)
      --ready-timeout SEC give up waiting for readiness after SEC (default 300)
      --wait-load         wait for the load command to finish instead of stopping it

Capture:
  -m, --mode MODE         profile : 'nsys profile --delay D --duration W' around the server
                                    (default), D = --startup + --delay: the server must be ready
                                    within --startup seconds; nsys stops it after the window
                          launch  : 'nsys launch' the server, 'nsys start' once it is ready and
                                    --delay seconds of load ran, 'nsys stop' after the window
                                    (exact window, no startup estimate; interactive CLI)
      --startup SEC       (profile mode) seconds allowed for server startup (default 30)
  -g, --graph-trace WHAT  --cuda-graph-trace=WHAT: 'graph' (one range per graph launch, the
                          nsys default) or 'node' (every kernel of every graph)
  -t, --trace LIST        nsys -t list (default cuda,nvtx,osrt)
  -n, --name NAME         report base name (default profile)
      --nsys-arg ARG      extra argument for 'nsys launch'/'nsys profile' (repeatable)
      --metrics-url URL   (launch mode) scrape this Prometheus endpoint (e.g. Triton's
                          http://localhost:8002/metrics) every --metrics-every s (default 1)
                          during the capture into live_metrics.jsonl; the summary then shows
                          the backend's live CUPTI gauges for the same window
      --no-stats          skip 'nsys stats'
      --no-summary        skip the inflight summary
  -h, --help              this text

Environment:
  NSYS                    path to the nsys binary (else 'nsys' on PATH). On the GPU host:
                          /opt/nvidia/nsight-compute/2025.3.1/host/target-linux-x64/nsys
  NSYS_IMPORTER           QdstrmImporter, used when nsys leaves a .qdstrm but no .nsys-rep
                          (its libdw/libelf must be on LD_LIBRARY_PATH; the GPU kit's setup.sh
                          exports both)
  PYTHON                  python with the inflight package for the summary (default python3)

Outputs in DIR:
  NAME.nsys-rep  NAME.sqlite  NAME_<report>.csv (cuda_api_sum, cuda_gpu_kern_sum,
  cuda_gpu_mem_time_sum, osrt_sum, nvtx_sum)  summary.md  summary.json  NAME.timeline.png
  server.log  load.log  nsys.log  run.json (commands, window, nsys version)
  live_metrics.jsonl      (with --metrics-url) one scrape per line: unix time, text

A plain 'tritonserver' --server under HTTP load needs 'sysctl -w net.core.wmem_default=8388608'
first, or Triton 2.51 drops replies in bursts (README, Known limits); 'inflight serve' does it.

Example:
  $PROG --out runs/prof/sync --delay 15 --window 5 \\
    --server 'tritonserver --model-repository model_repository --backend-directory backends' \\
    --load 'locust -f loadtest/locustfile.py --headless -u 1000 -r 200 -t 60s --processes 8'
EOF
}

die() { echo "$PROG: error: $*" >&2; exit 2; }
log() { echo "[$PROG $(date +%H:%M:%S)] $*" >&2; }

OUT=""; SERVER=""; LOAD=""; DELAY=10; WINDOW=5; READY_URL="http://localhost:8000/v2/health/ready"
READY_TIMEOUT=300; WAIT_LOAD=0; MODE=profile; STARTUP=30; GRAPH_TRACE=""; TRACE="cuda,nvtx,osrt"
NAME=profile; STATS=1; SUMMARY=1; EXTRA=(); METRICS_URL=""; METRICS_EVERY=1

while [[ $# -gt 0 ]]; do
  case "$1" in
    -o|--out) OUT=${2:?}; shift 2 ;;
    -s|--server) SERVER=${2:?}; shift 2 ;;
    -l|--load) LOAD=${2:?}; shift 2 ;;
    -d|--delay) DELAY=${2:?}; shift 2 ;;
    -w|--window) WINDOW=${2:?}; shift 2 ;;
    -r|--ready-url) READY_URL=${2:?}; shift 2 ;;
    --ready-timeout) READY_TIMEOUT=${2:?}; shift 2 ;;
    --wait-load) WAIT_LOAD=1; shift ;;
    -m|--mode) MODE=${2:?}; shift 2 ;;
    --startup) STARTUP=${2:?}; shift 2 ;;
    -g|--graph-trace) GRAPH_TRACE=${2:?}; shift 2 ;;
    -t|--trace) TRACE=${2:?}; shift 2 ;;
    -n|--name) NAME=${2:?}; shift 2 ;;
    --nsys-arg) EXTRA+=("${2:?}"); shift 2 ;;
    --metrics-url) METRICS_URL=${2:?}; shift 2 ;;
    --metrics-every) METRICS_EVERY=${2:?}; shift 2 ;;
    --no-stats) STATS=0; shift ;;
    --no-summary) SUMMARY=0; shift ;;
    -h|--help) usage; exit 0 ;;
    *) usage >&2; die "unknown argument: $1" ;;
  esac
done

[[ -n "$OUT" ]] || { usage >&2; die "--out DIR is required"; }
[[ -n "$SERVER" ]] || { usage >&2; die "--server CMD is required"; }
[[ "$MODE" == launch || "$MODE" == profile ]] || die "--mode must be 'launch' or 'profile' (got '$MODE')"
[[ -z "$GRAPH_TRACE" || "$GRAPH_TRACE" == graph || "$GRAPH_TRACE" == node ]] \
  || die "--graph-trace must be 'graph' or 'node' (got '$GRAPH_TRACE')"
[[ -z "$METRICS_URL" || "$MODE" == launch ]] || die "--metrics-url needs --mode launch (the capture window is exact only there)"
for v in DELAY WINDOW READY_TIMEOUT STARTUP METRICS_EVERY; do
  opt=${v,,}; [[ "${!v}" =~ ^[0-9]+([.][0-9]+)?$ ]] || die "--${opt//_/-} must be a number of seconds (got '${!v}')"
done
[[ "$NAME" =~ ^[A-Za-z0-9._-]+$ ]] || die "--name may only contain letters, digits, '.', '_' and '-'"

# -- find nsys ----------------------------------------------------------------------------------
NSYS_BIN="${NSYS:-}"
if [[ -z "$NSYS_BIN" ]]; then
  NSYS_BIN=$(command -v nsys || true)
fi
if [[ -z "$NSYS_BIN" || ! -x "$NSYS_BIN" ]]; then
  die "Nsight Systems not found: put 'nsys' on PATH or set NSYS=/path/to/nsys
  (on the GPU host: export NSYS=/opt/nvidia/nsight-compute/2025.3.1/host/target-linux-x64/nsys,
   or 'source KIT/setup.sh KIT' from gpuhost/make_kit.sh, which also exports NSYS_IMPORTER)"
fi
NSYS_VERSION=$("$NSYS_BIN" --version 2>/dev/null | head -n1 || echo unknown)

mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
REP="$OUT/$NAME"
SESSION="inflight-$$-$NAME"
rm -f "$REP.nsys-rep" "$REP.qdstrm" "$REP.sqlite" "$REP"_*.csv
: >"$OUT/nsys.log"

# What to trace is a launch/profile option; CPU sampling and context switches are collection
# (start/profile) options. --sample=none --cpuctxsw=none: a default run wrote 2 GB (docs/LAB.md, "Toolchain facts").
TRACE_OPTS=(--trace="$TRACE")
[[ -n "$GRAPH_TRACE" ]] && TRACE_OPTS+=(--cuda-graph-trace="$GRAPH_TRACE")
COLLECT_OPTS=(--sample=none --cpuctxsw=none)

SERVER_PID=""; LOAD_PID=""; STARTED=0

kill_tree() {  # kill_tree PID SIGNAL: the process group we started (setsid), then the pid
  local pid=$1 sig=$2
  [[ -n "$pid" ]] || return 0
  kill -"$sig" -- "-$pid" 2>/dev/null || kill -"$sig" "$pid" 2>/dev/null || true
}

stop_pid() {  # stop_pid PID NAME: TERM, wait up to 20 s, then KILL
  local pid=$1 what=$2 i
  [[ -n "$pid" ]] || return 0
  kill -0 "$pid" 2>/dev/null || return 0
  log "stopping $what (pid $pid)"
  kill_tree "$pid" TERM
  for ((i = 0; i < 40; i++)); do kill -0 "$pid" 2>/dev/null || return 0; sleep 0.5; done
  log "$what did not exit; killing it"
  kill_tree "$pid" KILL
}

cleanup() {
  local rc=$?
  trap - EXIT INT TERM
  stop_pid "$LOAD_PID" "load"
  if [[ "$MODE" == launch && $STARTED -eq 1 ]]; then
    "$NSYS_BIN" stop --session="$SESSION" >>"$OUT/nsys.log" 2>&1 || true
  fi
  if [[ "$MODE" == launch && -n "$SERVER_PID" ]]; then
    "$NSYS_BIN" shutdown --session="$SESSION" --kill=sigterm >>"$OUT/nsys.log" 2>&1 || true
  fi
  stop_pid "$SERVER_PID" "server"
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

wait_ready() {
  [[ "$READY_URL" == none ]] && return 0
  log "waiting for $READY_URL (up to ${READY_TIMEOUT}s)"
  local t0=$SECONDS
  while (( SECONDS - t0 < ${READY_TIMEOUT%.*} )); do
    kill -0 "$SERVER_PID" 2>/dev/null || die "the server exited before it was ready; see $OUT/server.log"
    if command -v curl >/dev/null 2>&1; then
      curl -fsS -o /dev/null --max-time 2 "$READY_URL" 2>/dev/null && return 0
    else
      "${PYTHON:-python3}" - "$READY_URL" <<'PY' >/dev/null 2>&1 && return 0
import sys, urllib.request
sys.exit(0 if urllib.request.urlopen(sys.argv[1], timeout=2).status == 200 else 1)
PY
    fi
    sleep 1
  done
  die "$READY_URL not ready after ${READY_TIMEOUT}s; see $OUT/server.log"
}

start_load() {
  [[ -n "$LOAD" ]] || { log "no --load command: profiling the server as it is"; return 0; }
  log "load: $LOAD"
  setsid bash -c "$LOAD" >"$OUT/load.log" 2>&1 &
  LOAD_PID=$!
}

CAPTURE_START=""; CAPTURE_END=""
if [[ "$MODE" == launch ]]; then
  # The session starts with the launch; collection only between 'start' and 'stop'.
  log "nsys launch (session $SESSION): $SERVER"
  setsid "$NSYS_BIN" launch --session-new="$SESSION" "${TRACE_OPTS[@]}" "${EXTRA[@]}" \
    bash -c "$SERVER" >"$OUT/server.log" 2>&1 &
  SERVER_PID=$!
  wait_ready
  start_load
  log "load running; capture starts in ${DELAY}s"
  sleep "$DELAY"
  [[ -z "$LOAD_PID" ]] || kill -0 "$LOAD_PID" 2>/dev/null || die "the load command exited early; see $OUT/load.log"
  CAPTURE_START=$(date +%s.%N)
  "$NSYS_BIN" start --session="$SESSION" "${COLLECT_OPTS[@]}" --output="$REP" --force-overwrite=true \
    >>"$OUT/nsys.log" 2>&1 || die "'nsys start' failed; see $OUT/nsys.log (or try --mode profile)"
  STARTED=1
  log "capturing for ${WINDOW}s"
  if [[ -n "$METRICS_URL" ]]; then
    # Scrape the metrics endpoint every METRICS_EVERY s inside the capture window, so live
    # gauges (e.g. the backend's CUPTI ones) and the nsys summary describe the same seconds.
    "${PYTHON:-python3}" - "$METRICS_URL" "$WINDOW" "$METRICS_EVERY" "$OUT/live_metrics.jsonl" <<'PY' \
      2>>"$OUT/nsys.log" || log "warning: metrics sampling failed; see $OUT/nsys.log"
import json, sys, time, urllib.request
url, window, every, path = sys.argv[1], float(sys.argv[2]), float(sys.argv[3]), sys.argv[4]
t0 = time.time()
with open(path, "w") as f:
    while (left := window - (time.time() - t0)) > 1e-3:
        time.sleep(min(every, left))
        try:
            text, error = urllib.request.urlopen(url, timeout=min(2.0, every)).read().decode(), None
        except OSError as e:
            text, error = "", str(e)
        f.write(json.dumps({"unix": time.time(), "since_start_s": time.time() - t0, "text": text, "error": error}) + "\n")
PY
  else
    sleep "$WINDOW"
  fi
  "$NSYS_BIN" stop --session="$SESSION" >>"$OUT/nsys.log" 2>&1 || die "'nsys stop' failed; see $OUT/nsys.log"
  STARTED=0
  CAPTURE_END=$(date +%s.%N)
else
  TOTAL_DELAY=$(awk -v a="$STARTUP" -v b="$DELAY" 'BEGIN { print a + b }')
  log "nsys profile --delay ${TOTAL_DELAY} --duration ${WINDOW}: $SERVER"
  setsid "$NSYS_BIN" profile "${TRACE_OPTS[@]}" "${COLLECT_OPTS[@]}" --delay="$TOTAL_DELAY" --duration="$WINDOW" \
    --output="$REP" --force-overwrite=true "${EXTRA[@]}" bash -c "$SERVER" >"$OUT/server.log" 2>&1 &
  SERVER_PID=$!
  CAPTURE_START=$(awk -v t="$(date +%s.%N)" -v d="$TOTAL_DELAY" 'BEGIN { printf "%.3f", t + d }')
  LAUNCHED=$SECONDS
  wait_ready
  if (( SECONDS - LAUNCHED > ${STARTUP%.*} )); then
    log "warning: the server took $((SECONDS - LAUNCHED))s to get ready (> --startup $STARTUP): the capture may" \
      "start before the load has run for --delay seconds; raise --startup"
  fi
  start_load
  log "waiting for nsys to capture and write the report"
  wait "$SERVER_PID" || true
  SERVER_PID=""
  CAPTURE_END=$(date +%s.%N)
fi

if [[ $WAIT_LOAD -eq 1 && -n "$LOAD_PID" ]]; then
  log "waiting for the load command to finish"
  wait "$LOAD_PID" || true
  LOAD_PID=""
fi
stop_pid "$LOAD_PID" "load"; LOAD_PID=""
if [[ "$MODE" == launch ]]; then
  "$NSYS_BIN" shutdown --session="$SESSION" --kill=sigterm >>"$OUT/nsys.log" 2>&1 || true
  stop_pid "$SERVER_PID" "server"; SERVER_PID=""
fi

# -- report: .nsys-rep (import a leftover .qdstrm if needed) ------------------------------------
for _ in $(seq 1 60); do [[ -f "$REP.nsys-rep" || -f "$REP.qdstrm" ]] && break; sleep 1; done
if [[ ! -f "$REP.nsys-rep" && -f "$REP.qdstrm" ]]; then
  if [[ -n "${NSYS_IMPORTER:-}" && -x "${NSYS_IMPORTER}" ]]; then
    log "importing $REP.qdstrm with $NSYS_IMPORTER"
    "$NSYS_IMPORTER" -i "$REP.qdstrm" >>"$OUT/nsys.log" 2>&1 \
      || die "QdstrmImporter failed (missing libdw.so.1/libelf.so.1 on LD_LIBRARY_PATH?); see $OUT/nsys.log"
  else
    die "nsys left $REP.qdstrm but no .nsys-rep: its QdstrmImporter failed (on the GPU host it needs libdw.so.1
  and libelf.so.1 on LD_LIBRARY_PATH). Set NSYS_IMPORTER=/path/to/QdstrmImporter and LD_LIBRARY_PATH, then rerun."
  fi
fi
[[ -f "$REP.nsys-rep" ]] || die "no report written ($REP.nsys-rep); see $OUT/nsys.log and $OUT/server.log"

log "exporting sqlite"
"$NSYS_BIN" export --type=sqlite --force-overwrite=true --output="$REP.sqlite" "$REP.nsys-rep" >>"$OUT/nsys.log" 2>&1 \
  || die "'nsys export --type sqlite' failed; see $OUT/nsys.log"

if [[ $STATS -eq 1 ]]; then
  log "nsys stats -> CSV"
  "$NSYS_BIN" stats --report cuda_api_sum,cuda_gpu_kern_sum,cuda_gpu_mem_time_sum,osrt_sum,nvtx_sum \
    --format csv --force-overwrite=true --output="$REP" "$REP.sqlite" >>"$OUT/nsys.log" 2>&1 \
    || log "warning: 'nsys stats' failed (see $OUT/nsys.log); continuing"
fi

PY_BIN="${PYTHON:-python3}"
cat >"$OUT/run.json" <<EOF
{"server": $("$PY_BIN" -c 'import json,sys;print(json.dumps(sys.argv[1]))' "$SERVER" 2>/dev/null || echo null),
 "load": $("$PY_BIN" -c 'import json,sys;print(json.dumps(sys.argv[1]))' "$LOAD" 2>/dev/null || echo null),
 "mode": "$MODE", "delay_s": $DELAY, "window_s": $WINDOW, "graph_trace": "${GRAPH_TRACE:-default}",
 "trace": "$TRACE", "capture_start_unix": ${CAPTURE_START:-null}, "capture_end_unix": ${CAPTURE_END:-null},
 "nsys": "$NSYS_BIN", "nsys_version": "$NSYS_VERSION", "report": "$REP.nsys-rep", "sqlite": "$REP.sqlite"}
EOF

if [[ $SUMMARY -eq 1 ]]; then
  if "$PY_BIN" -c 'import inflight.cli' >/dev/null 2>&1; then
    log "summary"
    "$PY_BIN" -m inflight.cli nsys-summary "$REP.sqlite" --out "$OUT" --label "$NAME" >/dev/null \
      || log "warning: the summary failed; run: $PY_BIN $SCRIPT_DIR/nsys_summary.py $REP.sqlite --out $OUT"
  else
    log "inflight is not importable by $PY_BIN; summary skipped (run scripts/nsys_summary.py $REP.sqlite --out $OUT)"
  fi
fi
log "done: $OUT"
ls -1 "$OUT" >&2
