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
#: Tools and lab: nothing the product may import.
LAB = (
    "inflight.server",
    "inflight.profiling",
    "inflight.loadtest",
    "inflight.bench",
    "inflight.cli",
    "inflight.lab",
    "inflight.build",
    "inflight.variants",
    "inflight.tool_errors",
)
#: The tools users run beside the backend (load test, profiler, engine bench, server control): apart from the lab too.
TOOLS = [SRC / "loadtest", SRC / "profiling", SRC / "bench", SRC / "server"]


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
    with pytest.raises(
        LookupError, match=r"no 'nvml' is installed \(entry point group 'inflight.gpu_metrics'\).* cupti=false"
    ):
        log.gpu_metrics_provider("nvml")


def test_the_tools_import_nothing_of_the_lab() -> None:
    """The load test, profiler, bench and server control stand without ``inflight.lab``."""
    files = [p for r in TOOLS for p in sorted(r.rglob("*.py"))]
    assert len(files) > 10
    found = [f"{p.relative_to(SRC)}: {m}" for p in files for m in _imports(p) if m.startswith("inflight.lab")]
    assert not found, found


def test_the_load_test_finds_the_stall_diagnostics_through_their_entry_point() -> None:
    from inflight.lab.stalls import dump_stuck_stubs

    assert log.plugin(log.DIAGNOSTICS_GROUP, "stuck_stubs", "") == dump_stuck_stubs
    with pytest.raises(LookupError, match="reinstall it"):
        log.plugin(log.DIAGNOSTICS_GROUP, "no_such_probe", "reinstall it")


#: The most lines a file of the package or of a backend may hold (issue 52: rooms small enough to change safely).
MAX_FILE_LINES = 500


def test_no_file_of_the_package_or_a_backend_is_over_500_lines() -> None:
    files = [*SRC.rglob("*.py"), *(SRC.parents[1] / "backends").rglob("*.py")]
    assert len(files) > 100, files  # the package and the backends were found
    over = {
        str(p.relative_to(SRC.parents[1])): n for p in files if (n := len(p.read_text().splitlines())) > MAX_FILE_LINES
    }
    assert not over, f"split these files below {MAX_FILE_LINES} lines: {over}"
