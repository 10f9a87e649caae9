"""The deployed runtime imports no lab code: diagnostics reach it through ``inflight.log`` hooks."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import inflight
from inflight import log

SRC = Path(inflight.__file__).resolve().parent
#: What the backend deploys: the runtime, the models, and the modules they share.
RUNTIME = [SRC / "runtime", SRC / "models", SRC / "errors.py", SRC / "log.py", SRC / "model_config.py"]
LAB = ("inflight.server", "inflight.profiling", "inflight.loadtest", "inflight.bench", "inflight.cli")


def _imports(path: Path) -> list[str]:
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            out.append(node.module)
        elif isinstance(node, ast.Import):
            out += [a.name for a in node.names]
    return out


def test_the_runtime_imports_nothing_of_the_lab() -> None:
    files = [p for r in RUNTIME for p in ([r] if r.is_file() else sorted(r.rglob("*.py")))]
    assert len(files) > 10
    found = [f"{p.relative_to(SRC)}: {m}" for p in files for m in _imports(p) if m.startswith(LAB)]
    assert not found, found


def test_the_cupti_gauges_are_found_through_their_entry_point() -> None:
    from inflight.profiling.cupti_live import LiveGpuMetrics

    assert log.gpu_metrics_provider("cupti") == LiveGpuMetrics.start
    with pytest.raises(LookupError, match=r"no live GPU metrics provider 'nvml' is installed .* cupti=false"):
        log.gpu_metrics_provider("nvml")
