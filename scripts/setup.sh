#!/usr/bin/env bash
# Set up a Python environment for inflight, once, on a fresh machine.
#
#   scripts/setup.sh            -> creates .venv with python3 and installs inflight with the server
#                                  (Triton 2.51 from the nvidia-pytriton wheel), Torch, Locust and the dev tools
#   INFLIGHT_PYTHON=python3 scripts/setup.sh
#                               -> uses that interpreter as it is (e.g. an NGC container or a GPU host
#                                  without network): installs only the package itself, editable, no deps
#
# Prints the interpreter to use on its last line.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ -n "${INFLIGHT_PYTHON:-}" ]; then
  PY=$(command -v "$INFLIGHT_PYTHON")
  "$PY" -m pip install -q --no-deps --no-build-isolation --no-index -e . >/dev/null
  echo "$PY"
  exit 0
fi

BASE=${INFLIGHT_BASE_PYTHON:-python3}
ver=$("$BASE" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')
case "$ver" in
  3.10|3.11|3.12|3.13) ;;
  *) echo "setup.sh: Python $ver found; inflight needs 3.10-3.13 (the Triton wheel ships stubs for those). Set INFLIGHT_BASE_PYTHON." >&2; exit 2 ;;
esac
step() { echo "setup: $*" >&2; }
if [ ! -x .venv/bin/python ]; then
  step "creating .venv with $BASE (Python $ver)"
  "$BASE" -m venv .venv
fi
PY=$PWD/.venv/bin/python
stamp=.venv/.inflight-installed
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  # uv installs the ~120 packages below in about 8 s: a fresh set-up took 24 s with it where it took about 74 with
  # pip alone (the 2-core CI host, 2026-11-28, the same versions of every package); pip stays the fallback where
  # uv cannot be had
  step "installing uv, the installer"
  if "$PY" -m pip install -q uv >&2 && "$PY" -m uv --version >/dev/null 2>&1; then
    install=("$PY" -m uv pip install -q --python "$PY")
  else
    step "uv not installed: pip installs everything (slower)"
    "$PY" -m pip install -q --upgrade pip >&2
    install=("$PY" -m pip install -q)
  fi
  # torch first, pinned, through pip: pip finds the CPU build this host keeps on disk (pip's find-links), and an
  # unpinned torch pulls several GB of CUDA wheels on a CPU-only host
  if ! "$PY" -c "import torch" 2>/dev/null; then
    step "installing torch ${INFLIGHT_TORCH_VERSION:-2.13.0} (about 750 MB; the longest step)"
    "$PY" -m pip install -q "torch==${INFLIGHT_TORCH_VERSION:-2.13.0}" >&2
  fi
  step "installing inflight with Triton 2.51 (nvidia-pytriton), Locust and the dev tools"
  "${install[@]}" -e ".[server,loadtest,onnx,dev]" >&2
  touch "$stamp"
  step "done: .venv is ready ($(du -sh .venv 2>/dev/null | cut -f1)); later runs reuse it"
fi
# nginx, the balancer in front of one server per GPU (inflight.server.balancer): Debian's package, unpacked
if [ ! -x .venv/nginx/usr/sbin/nginx ] && ! command -v nginx >/dev/null && command -v apt-get >/dev/null \
    && command -v dpkg-deb >/dev/null; then
  step "unpacking Debian's nginx into .venv/nginx (the load balancer of the per-GPU-server layout)"
  tmp=$(mktemp -d)
  if (cd "$tmp" && apt-get download -q nginx >/dev/null 2>&1) && dpkg-deb -x "$tmp"/nginx_*.deb .venv/nginx; then
    step "nginx: $(.venv/nginx/usr/sbin/nginx -v 2>&1)"
  else
    step "nginx not unpacked (apt-get download failed): the balancer's test will skip; set INFLIGHT_NGINX"
  fi
  rm -rf "$tmp"
fi
echo "$PY"
