#!/usr/bin/env bash
# Do the generator's cores slow the server's? The host's CPU topology, then the tokenizer's rate on the server's
# cores (scripts/lab/tokenizer_bound.py, word cache, one process per core), alone and with every core of
# CLIENT_CPUS kept busy by a spin loop, and on half the server's cores: if the server's and the generator's cores
# are SMT siblings, the busy generator cores cut the server's rate.
#
#   OUT=... bash scripts/lab/core_sharing.sh    # GPU host; writes $OUT/topology.txt and $OUT/tokenizer-*.json
set -uo pipefail
source scripts/gpu_lib.sh
lab_call
HALF_CPUS=${HALF_CPUS:-0-3}  # half of SERVER_CPUS: set it with it
{
  nproc
  lscpu | grep -E -i "model name|socket|core|thread|numa"
  for c in /sys/devices/system/cpu/cpu[0-9]*; do
    echo "$(basename "$c"): siblings $(cat "$c/topology/thread_siblings_list" 2>/dev/null) core $(cat "$c/topology/core_id" 2>/dev/null)"
  done | sort -V
} > "$OUT/topology.txt" 2>&1
cat "$OUT/topology.txt"
NAME=minilm PART=import OUT="$OUT" SERVER_CPUS="$SERVER_CPUS" bash scripts/lab/minilm_gpu.sh > /tmp/core_sharing_import.log 2>&1 \
  || { tail -n 20 /tmp/core_sharing_import.log; echo "core_sharing: the import failed" >&2; exit 1; }
bound() {  # label cpus
  $PY scripts/lab/tokenizer_bound.py --repository model_repository --model minilm_inflight --calls word_cache \
    --cpus "$2" --out "$OUT/tokenizer-$1.json" 2>&1 | grep -v -i warn | sed "s/^/$1: /"
}
spin() {  # a spin loop on each core of $1; their pids on stdout
  $PY - "$1" <<'EOF'
import subprocess, sys
from inflight.loadtest.openloop import parse_cpus
for c in parse_cpus(sys.argv[1]):
    spinner = ["taskset", "-c", str(c), sys.executable, "-c", "while True: pass"]
    print(subprocess.Popen(spinner, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).pid)
EOF
}
pids=
trap '[ -n "$pids" ] && kill $pids 2>/dev/null' EXIT  # no spin loop outlives the script
for round in 1 2; do
  bound "idle-r$round" "$SERVER_CPUS"
  pids=$(spin "$CLIENT_CPUS")
  sleep 1
  bound "client-busy-r$round" "$SERVER_CPUS"
  kill $pids
  pids=
  bound "half-r$round" "$HALF_CPUS"
done
