#!/usr/bin/env python3
"""Fetch the TensorRT 10 type stubs (PyPI ``tensorrt-stubs``) into ``typings/`` for mypy.

The package cannot be installed normally (it depends on ``tensorrt``, whose PyPI wheel downloads
from NVIDIA's index), and the generated stubs have slips mypy rejects (a parameter named ``in``, a keyword; a required
parameter after defaulted ones; an import of a runtime-only module); this script unpacks the
wheel without installing it and mends those lines.
Run from the repository root; idempotent.
"""

from __future__ import annotations

import re
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

VERSION = "10.13.0.35.1"
DEST = Path("typings")


def main() -> int:
    """Unpack and patch the stubs; return the exit code."""
    if (DEST / "tensorrt_bindings" / "tensorrt.pyi").is_file():
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "-q", "--no-deps", f"tensorrt-stubs=={VERSION}", "-d", tmp],
            check=True,
        )
        (wheel,) = Path(tmp).glob("tensorrt_stubs-*.whl")
        with zipfile.ZipFile(wheel) as z:
            for name in z.namelist():
                if name.endswith(".pyi") and name.split("/")[0] in ("tensorrt", "tensorrt_bindings"):
                    target = DEST / name
                    target.parent.mkdir(parents=True, exist_ok=True)
                    text = z.read(name).decode()
                    text = re.sub(r"([(,] ?)in: ", r"\1in_: ", text)
                    # generator slips: a missing runtime-only module, a required parameter after defaults
                    text = text.replace("import tensorrt_libs as tensorrt_libs\n", "")
                    text = text.replace(
                        "power: Weights = None, channel_axis: int)", "power: Weights = None, channel_axis: int = ...)"
                    )
                    target.write_text(text)
    print(f"TensorRT {VERSION} stubs unpacked into {DEST}/")
    return 0


if __name__ == "__main__":
    sys.exit(main())
