"""Drop what the GPU host never uses from the offline kit's wheels, in place.

The device tool carries the working tree plus ``.kit`` up to 64 MiB in all; the offline kit, built on
a host with network (docs/LAB.md, "Toolchain facts"), is about 62 MB, which leaves too little for the repository.
Dropped: numpy's own tests (about 1.7 MB) and Locust's web-UI bundle (about 1.4 MB; the load tests
run ``--headless``, where Locust never serves it). Each wheel's RECORD is rewritten to match, so
pip installs it as usual.

Usage: python3 scripts/slim_kit.py [.kit]
"""

from __future__ import annotations

import sys
import zipfile
from pathlib import Path

#: wheel name prefix -> the member-path fragment whose members are dropped
DROP: dict[str, str] = {"numpy-": "/tests/", "locust-": "locust/webui/dist/"}


def slim(wheel: Path, fragment: str = "/tests/") -> int:
    """Rewrite ``wheel`` without the members whose path contains ``fragment``; returns the bytes saved."""

    def drop(name: str) -> bool:
        return fragment in name

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
    """Slim the numpy and Locust wheels under ``KIT/wheels``."""
    kit = Path(argv[1] if len(argv) > 1 else ".kit")
    found = 0
    for prefix, fragment in DROP.items():
        for w in sorted((kit / "wheels").glob(f"{prefix}*.whl")):
            found += 1
            print(f"{w.name}: {slim(w, fragment) / 1e6:.2f} MB smaller")
    if not found:
        print(f"no numpy or Locust wheel under {kit / 'wheels'}; build the kit first", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
