"""Drop the test folders from the offline kit's numpy wheel (about 1.7 MB) in place.

The device tool carries the working tree plus ``.kit`` up to 64 MiB in all; the kit from
``../shared/gpuhost/make_kit.sh`` is about 62 MB, which leaves too little for the repository.
numpy's own tests are never run on the GPU host. The wheel's RECORD is rewritten to match, so pip
installs it as usual.

Usage: python3 scripts/slim_kit.py [.kit]
"""

from __future__ import annotations

import sys
import zipfile
from pathlib import Path


def slim(wheel: Path) -> int:
    """Rewrite ``wheel`` without ``*/tests/*`` members; returns the bytes saved."""

    def drop(name: str) -> bool:
        return "/tests/" in name

    before = wheel.stat().st_size
    tmp = wheel.with_suffix(".tmp")
    with zipfile.ZipFile(wheel) as zi, zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as zo:
        for info in zi.infolist():
            if drop(info.filename):
                continue
            data = zi.read(info)
            if info.filename.endswith(".dist-info/RECORD"):
                kept = [ln for ln in data.decode().splitlines() if not drop(ln.split(",")[0])]
                data = ("\n".join(kept) + "\n").encode()
            zo.writestr(info, data, compress_type=zipfile.ZIP_DEFLATED, compresslevel=9)
    tmp.replace(wheel)
    return before - wheel.stat().st_size


def main(argv: list[str]) -> int:
    """Slim every numpy wheel under ``KIT/wheels``."""
    kit = Path(argv[1] if len(argv) > 1 else ".kit")
    wheels = sorted((kit / "wheels").glob("numpy-*.whl"))
    if not wheels:
        print(f"no numpy wheel under {kit / 'wheels'}; build the kit first", file=sys.stderr)
        return 2
    for w in wheels:
        print(f"{w.name}: {slim(w) / 1e6:.2f} MB smaller")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
