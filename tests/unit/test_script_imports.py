"""What the shell scripts and docs run of the package exists: ``from inflight... import X`` and ``-m inflight...``.

mypy checks the Python files; a ``python -c "from inflight... import X"`` inside a shell script or a command in a
doc is only text to it, so a module split that moves ``X`` breaks the script silently (on the GPU host).
"""

from __future__ import annotations

import importlib
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FROM = re.compile(r"from (inflight(?:\.\w+)*) import ((?:\w+(?: as \w+)?)(?:, *\w+(?: as \w+)?)*)")
MODULE = re.compile(r"-m (inflight(?:\.\w+)+)")


def _texts() -> list[Path]:
    scripts = [*ROOT.glob("scripts/**/*.sh"), *ROOT.glob(".ci/*")]
    docs = [ROOT / "README.md", ROOT / "loadtest" / "README.md", *ROOT.glob("docs/*.md")]
    return [p for p in [*scripts, *docs] if p.is_file()]


def _has(module: str, name: str) -> bool:
    mod = importlib.import_module(module)
    if hasattr(mod, name):
        return True
    try:  # a submodule (``from inflight.runtime import cuda``)
        importlib.import_module(f"{module}.{name}")
    except ImportError:
        return False
    return True


def test_every_import_a_script_or_doc_runs_resolves() -> None:
    missing = []
    for path in _texts():
        text = path.read_text(errors="replace")
        for m in FROM.finditer(text):
            for part in m.group(2).split(","):
                name = part.strip().split(" as ")[0]
                if not _has(m.group(1), name):
                    missing.append(f"{path.relative_to(ROOT)}: from {m.group(1)} import {name}")
        for m in MODULE.finditer(text):
            try:
                importlib.import_module(m.group(1))
            except ImportError as e:
                missing.append(f"{path.relative_to(ROOT)}: -m {m.group(1)} ({e})")
    assert not missing, missing
