"""Shared fixtures: a model repository built by the project's own builder, a real tritonserver.

GPU tests (marker ``gpu``) skip with the reason when no CUDA device is visible.
"""

from __future__ import annotations

import fcntl
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def gpu_count() -> int:
    from inflight.runtime.cuda import device_count

    return device_count()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    _longest_files_first(items)
    if gpu_count():
        return
    skip = pytest.mark.skip(
        reason="needs a CUDA GPU: cudaGetDeviceCount() found none here (run `scripts/test.sh -m gpu` on the GPU host)"
    )
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def _longest_files_first(items: list[pytest.Item]) -> None:
    """Order the files by the seconds their ``slow(seconds=...)`` marker gives, longest first, the rest after.

    pytest-xdist's ``--dist loadfile`` hands the files out in this order when run with ``--no-loadscope-reorder``
    (scripts/test.sh); its default order (most tests first) started the longest files last, and the suite waited
    on one worker for minutes at the end.
    """
    first: dict[str, int] = {}
    cost: dict[str, float] = {}
    for i, item in enumerate(items):
        path = str(item.path)
        first.setdefault(path, i)
        marker = item.get_closest_marker("slow")
        if marker is not None:
            cost[path] = max(cost.get(path, 0.0), float(marker.kwargs.get("seconds", 60)))
    items.sort(key=lambda it: (-cost.get(str(it.path), 0.0), first[str(it.path)]))  # stable: a file's order stays


def _tree_status() -> str | None:
    """``git status --porcelain`` of the checkout (None outside a git checkout or without git)."""
    import subprocess

    try:
        r = subprocess.run(["git", "status", "--porcelain"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return None
    return r.stdout if r.returncode == 0 else None


@pytest.fixture(scope="session", autouse=True)
def tree_stays_clean() -> Iterator[None]:
    """The tests leave the checkout as they found it: what they build goes under ignored folders (runs/, tmp)."""
    before = _tree_status()
    yield
    after = _tree_status()
    if before is not None and after is not None and after != before:
        changed = sorted(set(after.splitlines()) - set(before.splitlines()))
        pytest.fail(f"the tests changed the checkout (git status --porcelain): {changed[:20]}", pytrace=False)


@pytest.fixture(scope="session")
def repository() -> Path:
    """The model repository with every model's configs and Torch artifacts (built once, reused while current).

    ``INFLIGHT_TEST_REPOSITORY`` points it elsewhere (default ``runs/test-repo``).
    """
    from inflight.build.repository import ensure_built

    repo = Path(os.environ.get("INFLIGHT_TEST_REPOSITORY", ROOT / "runs" / "test-repo"))
    repo.mkdir(parents=True, exist_ok=True)
    # pytest-xdist's workers each run this fixture: one builds, the others wait and find it current
    with open(repo.parent / f".{repo.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        ensure_built(repo)
    return repo


@pytest.fixture(scope="session")
def server(repository: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    """A real tritonserver (explicit model control, nothing loaded) on free ports."""
    from inflight.server.config import ServerConfig
    from inflight.server.launcher import TritonServer

    s = TritonServer(ServerConfig.on_free_ports(repository, tmp_path_factory.mktemp("triton")))
    s.start()
    yield s
    code = s.stop()
    log = s.log_path.read_text(errors="replace")
    keep = os.environ.get("INFLIGHT_KEEP_LOGS")
    if keep:
        shutil.copy(s.log_path, Path(keep) / "tritonserver-tests.log")
    assert "Segmentation fault" not in log and "signal 11" not in log.lower(), "tritonserver crashed during the tests"
    assert code == 0, f"tritonserver exited with {code}"
