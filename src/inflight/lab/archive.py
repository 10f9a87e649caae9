"""The closed questions' result sections, rendered for the last time, and a check that what they read is unchanged.

A question whose issue has ended (bert-tiny's open loop and engine, sync against pipelined, faults, the CPU cost,
two and four GPUs, the one- and many-instance ceilings) needs no generator any more: its result files no longer
change. :func:`freeze` renders such sections into :data:`ARCHIVE_PAGE` and records in :data:`MANIFEST` what they
read: the sha256 of every file under their folders of ``results/``, of the ``results/summary.json`` blocks they
computed, and the "At a glance" rows they gave (RESULTS' headline keeps showing them). :func:`check` lists what
changed since; ``inflight results-report`` refuses to write while it finds anything, and a unit test runs it, so
the frozen page cannot go stale silently. To change a frozen question, restore its section from the commit the
manifest names (``git show COMMIT:src/inflight/lab/sections/NAME.py``) and freeze again.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from inflight.lab.sections import Section

#: The frozen page and its manifest, relative to the repository root.
ARCHIVE_PAGE = "docs/RESULTS-archive.md"
MANIFEST = "docs/RESULTS-archive.json"


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _block_sha(block: Any) -> str:
    return _sha(json.dumps(block, sort_keys=True, allow_nan=True).encode())


def _files(root: Path, folders: Iterable[str]) -> dict[str, str]:
    """Every file under the given entries of ``results/`` (a folder or one file), by path, with its sha256."""
    out: dict[str, str] = {}
    for name in folders:
        entry = root / "results" / name
        paths = [entry] if entry.is_file() else sorted(p for p in entry.rglob("*") if p.is_file())
        for p in paths:
            out[str(p.relative_to(root))] = _sha(p.read_bytes())
    return out


def _summary(root: Path) -> dict[str, Any]:
    path = root / "results" / "summary.json"
    return json.loads(path.read_text()) if path.is_file() else {}


def freeze(
    root: Path,
    sections: Sequence[Section],
    *,
    folders: Sequence[str],
    summary_keys: Sequence[str],
    glance_rows: Sequence[Sequence[str]],
    commit: str,
) -> Path:
    """Render ``sections`` into :data:`ARCHIVE_PAGE` and write :data:`MANIFEST`.

    Args:
        root: The repository root.
        sections: The sections to freeze, in page order (rendered with the code at ``commit``).
        folders: The entries of ``results/`` they read (folders or files).
        summary_keys: The blocks of ``results/summary.json`` they computed, kept as they are from now on.
        glance_rows: Their rows of RESULTS' "At a glance" table (area, figure, value, target, verdict, section).
        commit: The commit whose generators rendered them.

    Returns:
        The page's path.
    """
    body = [line for s in sections for line in s.lines(root)]
    summary = _summary(root)
    manifest = {
        "commit": commit,
        "sections": [s.title for s in sections],
        "folders": list(folders),
        "files": _files(root, folders),
        "summary_blocks": {k: _block_sha(summary[k]) for k in summary_keys if k in summary},
        "glance_rows": [list(r) for r in glance_rows],
    }
    header = [
        "# Results of the closed questions",
        "",
        f"Rendered for the last time by the generators at commit `{commit[:12]}` from the files under "
        f"`results/` it names, then frozen: their questions' issues have ended and those files no longer change. "
        f"`{MANIFEST}` holds the sha256 of every file these sections read, and `inflight results-report` and the "
        "unit tests fail if one changes, so this page stays what those files say. To reopen a question, restore its "
        f"section from `git show {commit[:12]}:src/inflight/lab/sections/` and freeze again "
        f"(`git show {commit[:12]}:scripts/lab/freeze_archive.py` is the call that froze these). "
        "The live questions are on [RESULTS.md](RESULTS.md).",
        "",
    ]
    page = root / ARCHIVE_PAGE
    page.write_text("\n".join(header + body) + "\n")
    (root / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
    return page


def manifest(root: Path) -> dict[str, Any]:
    """The archive's manifest (empty when nothing is frozen)."""
    path = root / MANIFEST
    return json.loads(path.read_text()) if path.is_file() else {}


def check(root: Path) -> list[str]:
    """What changed since the freeze, one line each with how to mend it (empty: the archive is current)."""
    m = manifest(root)
    if not m:
        return []
    problems = []
    now = _files(root, m["folders"])
    fix = f"restore the sections from commit {m['commit'][:12]} and freeze again, or put the new sitting elsewhere"
    for path in sorted(set(now) | set(m["files"])):
        if path not in m["files"]:
            problems.append(f"{path} is new under a frozen folder of {ARCHIVE_PAGE}: {fix}")
        elif path not in now:
            problems.append(f"{path}, which {ARCHIVE_PAGE} was rendered from, is gone: git checkout it")
        elif now[path] != m["files"][path]:
            problems.append(f"{path} changed since {ARCHIVE_PAGE} was rendered from it: git checkout it, or {fix}")
    summary = _summary(root)
    for key, sha in m["summary_blocks"].items():
        if key not in summary or _block_sha(summary[key]) != sha:
            problems.append(f"results/summary.json's frozen block {key!r} changed: git checkout results/summary.json")
    return problems


def glance_rows(root: Path) -> list[list[str]]:
    """The frozen sections' rows of RESULTS' "At a glance", their section column pointing at the archive."""
    return [[*r[:-1], f"{r[-1]} (archive)"] for r in manifest(root).get("glance_rows", [])]
