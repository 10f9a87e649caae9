#!/usr/bin/env bash
# One device-tool call: set up the offline kit, build models, run the GPU tests and the engine bench.
# Usage (GPU host, repo root): bash scripts/lab/gpu_smoke.sh [pytest -k expr]
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-runs/gpu-out}; mkdir -p "$OUT"
source .kit/setup.sh .kit >/dev/null
python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . 2>&1 | tail -2
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
python3 -c "import torch, numpy, cuda.bindings; print('torch', torch.__version__, 'numpy', numpy.__version__, 'cuda-bindings', cuda.bindings.__version__)"
export INFLIGHT_TEST_REPOSITORY=$PWD/runs/test-repo
time python3 -c "from pathlib import Path; from inflight.build.repository import ensure_built; ensure_built(Path('$INFLIGHT_TEST_REPOSITORY'))" \
  2>&1 | grep -v Warning | tail -3
# does cuda-python release the GIL while cudaEventSynchronize blocks?
python3 - <<'PY' 2>&1 | tee "$OUT/gil_probe.txt"
import threading, time, torch
from inflight.runtime import cuda
cuda.require_device(0)
s = cuda.Stream(); ev = cuda.Event()
x = torch.randn(8192, 8192, device="cuda")
ext = torch.cuda.ExternalStream(s.ptr)
with torch.cuda.stream(ext):
    for _ in range(40): x = x @ x * 1e-4
s.record(ev)
count = [0]; stop = threading.Event()
def spin():
    while not stop.is_set(): count[0] += 1
t = threading.Thread(target=spin); t.start()
t0 = time.perf_counter(); ev.synchronize(); dt = time.perf_counter() - t0
stop.set(); t.join()
print(f"cudaEventSynchronize blocked {dt*1e3:.1f} ms; other thread ran {count[0]} iterations meanwhile "
      f"({'GIL released' if count[0] > 1000 else 'GIL HELD'})")
PY
set -o pipefail
INFLIGHT_KEEP_LOGS=$OUT timeout 420 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_executor_gpu.py tests/gpu/test_server_gpu.py tests/integration/test_serving.py -m gpu \
   ${1:+-k "$1"} -s 2>&1 | tee "$OUT/pytest_gpu.txt" | grep -vE "^\s*$" | tail -40
cp "$INFLIGHT_TEST_REPOSITORY/../"*.log "$OUT/" 2>/dev/null
timeout 150 inflight bench-engine --repository "$INFLIGHT_TEST_REPOSITORY" --iters 200 --out "$OUT/engine_bench.json" 2>&1 | grep -v "INFO inflight.bench" | tail -12
