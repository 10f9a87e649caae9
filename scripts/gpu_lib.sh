# Shared by the GPU-host scripts (scripts/lab/gpu_session.sh, gpu_bound.sh, minilm_gpu.sh... sourced from the
# repository root). Sets PY (the Python interpreter: $PYTHON or python3) and unbuffered Python
# output; profile_loaded needs USERS (Locust users) set by the caller.

PY=${PYTHON:-python3}
export PYTHONUNBUFFERED=1

# usage SCRIPT: print the script's leading comment block (its help), without the '#'s.
usage() {
  awk 'NR == 1 { next } /^#/ { sub(/^# ?/, ""); print; next } { exit }' "$1"
}

# pack_results TARBALL PATH...: the results as a tarball for the device tool to bring back; the
# Nsight reports and their sqlite exports stay behind (too large).
pack_results() {
  local tarball=$1; shift
  # to a temporary name first: a call cut off at its time limit leaves the previous tarball whole
  tar czf "$tarball.part" --exclude='*.nsys-rep' --exclude='*.qdstrm' --exclude='*.sqlite' "$@" 2>/dev/null \
    && mv -f "$tarball.part" "$tarball"
}

# Install the offline kit (.kit, docs/LAB.md "Toolchain facts") and this checkout, once per shell, on a GPU host.
kit_setup() {
  if [ -d .kit ] && command -v nvidia-smi >/dev/null && [ -z "${INFLIGHT_SETUP_DONE:-}" ]; then
    source .kit/setup.sh .kit >/dev/null
    python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . 2>&1 | tail -2
    python3 -c "import inflight" 2>/dev/null || echo "kit_setup: installing this checkout failed (no network here," \
      "so pip builds it with the host's setuptools, which must be >= 77 for pyproject's SPDX license string:" \
      "python3 -c 'import setuptools; print(setuptools.__version__)')" >&2
    export INFLIGHT_SETUP_DONE=1
  fi
}

# lab_call: the start of a one-GPU lab call: the kit installed, OUT required, and the cores of the one-GPU host:
# the server's and its stubs' (SERVER_CPUS, default 0-7) and the load generator's (CLIENT_CPUS, default 8-15).
lab_call() {
  kit_setup
  OUT=${OUT:?set OUT}
  SERVER_CPUS=${SERVER_CPUS:-0-7}
  CLIENT_CPUS=${CLIENT_CPUS:-8-15}
}

# ensure_built [MODEL...]: build the Torch artifacts in model_repository that are missing or stale (all by default).
ensure_built() {
  local names=""
  [ $# -gt 0 ] && names=$(printf "'%s'," "$@")
  $PY -c "from pathlib import Path; from inflight.build.repository import ensure_built; ensure_built(Path('model_repository'), [${names%,}] or None)" \
    2>&1 | grep -v -i warn | tail -2
}

# count_cpus LIST: how many cores a taskset-style list names (0-7,12 -> 9).
count_cpus() {
  $PY -c "import sys; from inflight.loadtest.openloop import parse_cpus; print(len(parse_cpus(sys.argv[1])))" "$1"
}

# The previous server must be gone before the next one starts: it would find ports 8000-8002 taken.
wait_ports() {
  for _ in $(seq 60); do
    $PY -c "import sys; from inflight.server.launcher import port_free; sys.exit(0 if all(map(port_free, (8000, 8001, 8002))) else 1)" && return 0
    sleep 1
  done
}

# profile_loaded OUTDIR NAME VARIANT DELAY_S WINDOW_S: nsys of a server running VARIANT (model@key=value,...)
# under the published Locust load (USERS users x 50 items), capturing WINDOW_S seconds after DELAY_S;
# Triton's metrics are scraped every second of the capture (live_metrics.jsonl: the backend's live
# CUPTI gauges for the same window, when the variant has cupti=true).
profile_loaded() {
  local out=$1 name=$2 variant=$3 delay=$4 window=$5 model=${3%%@*}
  wait_ports
  $PY -m inflight.cli nsys-profile --out "$out" --name "$name" --mode launch \
    --server "$PY -m inflight.cli serve -m '$variant' --workdir runs/nsys-serve-$name" \
    --ready-url "http://localhost:8000/v2/models/$model/ready" \
    --load "$PY -m locust -f loadtest/locustfile.py --headless -u $USERS -r $USERS -t 60s --host http://127.0.0.1:8000 \
            --model $model --items 50 --seq-len 64 --processes 8 --only-summary TritonHttpUser" \
    --delay "$delay" --window "$window" --metrics-url http://localhost:8002/metrics --metrics-every 1
  cp "runs/nsys-serve-$name/tritonserver.log" "$out/" 2>/dev/null   # the backend's own log (CUPTI start-up etc.)
}
