#!/usr/bin/env bash
# Issue 53 under Nsight Systems: all-MiniLM-L6-v2 served, sync against pipelined at equal load, and the
# default as built at its capacity, each profiled over the whole server (tritonserver and every instance's
# stub) while the open-loop generator offers a fixed rate of the served workload (32 sequences a request of
# lengths 16-128). `inflight nsys-summary` then gives each capture's GPU activity (union of kernel and copy
# intervals over the window) and its sync share (`*Synchronize` time over all CUDA API time) side by side.
#
#   OUT=... bash scripts/lab/gpu_bound_nsys.sh
#   PROFILES="name=VARIANT:RATE ..."   what to profile (default below: sync and auto, one instance each, at
#                                      1,500 req/s, which both hold; the default as built at 3,000 req/s)
#   IMPORT=0                           reuse the repository an earlier call of this machine imported
#
# Cores: server 0-7 (its stubs too), generator 8-15 (SERVER_CPUS, CLIENT_CPUS). Everything comes back as one
# tarball ($OUT/nsys.tgz: each capture's summary, run.json, load.log with the generator's summary line, the
# server log, live metrics); the reports and sqlite exports stay on the host.
set -uo pipefail
source scripts/gpu_lib.sh
lab_call
DELAY=${DELAY:-12}
WINDOW=${WINDOW:-5}
ONE="instances=1,capture_at_load=false"
PROFILES=${PROFILES:-"sync1=minilm_sync@$ONE:1500 auto1=minilm_inflight@$ONE:1500 default=minilm_inflight@capture_at_load=false:3000"}

if [ "${IMPORT:-1}" = 1 ]; then
  PART=import OUT="$OUT" SERVER_CPUS="$SERVER_CPUS" bash scripts/lab/minilm_gpu.sh 2>&1 | grep -E "one instance|imported|rror" | cut -c1-400
fi
pool=/tmp/pool-minilm.npz
$PY -m inflight.loadtest.workload --model minilm_inflight --items 32 --seq-len 128 --length-dist real --pool 16 \
  --out "$pool" 2>&1 | tail -n 1
root="$OUT/nsys"
names=()
for p in $PROFILES; do
  name=${p%%=*} rest=${p#*=}
  variant=${rest%:*} rate=${rest##*:} model=${rest%%@*}
  model=${model%:*}
  wait_ports
  echo "== $name: $variant at $rate req/s"
  PYTHON=$PY bash scripts/nsys_profile.sh --out "$root/$name" --name "$name" --mode launch --no-stats \
    --server "$PY -m inflight.cli serve -m '$variant' --cpus $SERVER_CPUS --workdir runs/nsys-$name" \
    --ready-url "http://localhost:8000/v2/models/$model/ready" \
    --load "taskset -c $CLIENT_CPUS $PY -m inflight.loadtest.rategen --model $model --pool-file $pool --rate $rate \
            --duration $((DELAY + WINDOW + 15)) --processes 7 --raw-dir /tmp/gen-$name" \
    --delay "$DELAY" --window "$WINDOW" --metrics-url http://localhost:8002/metrics --metrics-every 1 \
    >"/tmp/nsys-$name.log" 2>&1 || tail -n 15 "/tmp/nsys-$name.log"
  cp "runs/nsys-$name/tritonserver.log" "$root/$name/" 2>/dev/null
  grep -h "offered" "$root/$name/load.log" | tail -n 1 | cut -c1-300
  names+=("$root/$name/$name.sqlite" --label "$name")
done
# side by side (each capture's folder has its own summary.json too)
$PY -m inflight.cli nsys-summary "${names[@]}" --out "$root" >/dev/null 2>&1 || echo "nsys-summary failed"
grep "^|" "$root/summary.md" | head -n 24 | cut -c1-400
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader
pack_results "$OUT/nsys.tgz" -C "$OUT" nsys
