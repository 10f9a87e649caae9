"""Cut an Nsight Systems sqlite export down to what ``nsys-summary`` reads, over a short window.

A loaded server's export is tens of MB; a test fixture or a bug report wants well under 1 MB.
``trim`` copies only the tables the summary reads (GPU activity, CUDA API calls, NVTX, OS
runtime, the GPU name and copy-kind enums), keeps only rows that overlap ``[start, start +
keep_ms)`` of the GPU activity, keeps only the strings those rows reference, and vacuums.
The result is still an ordinary nsys sqlite export: the summary and the timeline read it as is.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

from inflight.profiling import nsys_db

#: Tables with ``start``/``end`` columns, filtered to the window.
TIMED_TABLES: tuple[str, ...] = (
    nsys_db.KERNEL_TABLE,
    nsys_db.MEMCPY_TABLE,
    nsys_db.MEMSET_TABLE,
    nsys_db.GRAPH_TABLE,
    nsys_db.RUNTIME_TABLE,
    nsys_db.DRIVER_TABLE,
    nsys_db.NVTX_TABLE,
    nsys_db.OSRT_TABLE,
)
#: Small tables copied whole.
WHOLE_TABLES: tuple[str, ...] = (nsys_db.MEMCPY_ENUM, nsys_db.GPU_INFO, "ThreadNames")
#: Columns that hold ``StringIds`` ids.
STRING_COLUMNS: tuple[str, ...] = ("nameId", "shortName", "demangledName", "mangledName", "textId")


def _columns(conn: sqlite3.Connection, table: str) -> list[str]:
    return [r[1] for r in conn.execute(f'PRAGMA main.table_info("{table}")')]


def trim(src: Path, dst: Path, *, keep_ms: float = 200.0, skip_ms: float = 0.0) -> dict[str, int]:
    """Write a trimmed copy of ``src`` to ``dst``.

    Args:
        src: An nsys sqlite export.
        dst: Where to write the trimmed copy (replaced if it exists).
        keep_ms: Length of the window kept, in ms.
        skip_ms: Start the window this long after the first GPU activity.

    Returns:
        Rows kept per table.

    Raises:
        ValueError: when ``src`` has no GPU activity table with rows.
    """
    dst.unlink(missing_ok=True)
    conn = sqlite3.connect(dst)
    try:
        if not Path(src).is_file():
            raise ValueError(f"{src}: no such file (export one with `nsys export --type sqlite`)")
        conn.execute("ATTACH DATABASE ? AS src", (str(src),))
        have = {r[0] for r in conn.execute("SELECT name FROM src.sqlite_master WHERE type = 'table'")}
        firsts = [
            conn.execute(f'SELECT MIN(start) FROM src."{t}"').fetchone()[0]
            for t in (nsys_db.KERNEL_TABLE, nsys_db.MEMCPY_TABLE, nsys_db.GRAPH_TABLE)
            if t in have
        ]
        firsts = [f for f in firsts if f is not None]
        if not firsts:
            raise ValueError(f"{src}: no kernel, memcpy or graph rows; nothing to keep")
        lo = int(min(firsts) + skip_ms * 1e6)
        hi = int(lo + keep_ms * 1e6)
        kept: dict[str, int] = {}
        for table in TIMED_TABLES:
            if table not in have:
                continue
            schema = conn.execute("SELECT sql FROM src.sqlite_master WHERE name = ?", (table,)).fetchone()[0]
            conn.execute(schema)
            conn.execute(
                f'INSERT INTO main."{table}" SELECT * FROM src."{table}" WHERE start < ? AND "end" > ?', (hi, lo)
            )
            kept[table] = conn.execute(f'SELECT COUNT(*) FROM main."{table}"').fetchone()[0]
        for table in WHOLE_TABLES:
            if table not in have:
                continue
            schema = conn.execute("SELECT sql FROM src.sqlite_master WHERE name = ?", (table,)).fetchone()[0]
            conn.execute(schema)
            conn.execute(f'INSERT INTO main."{table}" SELECT * FROM src."{table}"')
            kept[table] = conn.execute(f'SELECT COUNT(*) FROM main."{table}"').fetchone()[0]
        if "StringIds" in have:
            schema = conn.execute("SELECT sql FROM src.sqlite_master WHERE name = 'StringIds'").fetchone()[0]
            conn.execute(schema)
            refs: list[str] = []
            for table in [*TIMED_TABLES, *WHOLE_TABLES]:
                if table in kept:
                    cols = set(_columns(conn, table))
                    refs += [f'SELECT "{c}" FROM main."{table}"' for c in STRING_COLUMNS if c in cols]
            if refs:
                conn.execute(
                    "INSERT INTO main.StringIds SELECT * FROM src.StringIds WHERE id IN (" + " UNION ".join(refs) + ")"
                )
            kept["StringIds"] = conn.execute("SELECT COUNT(*) FROM main.StringIds").fetchone()[0]
        conn.commit()
        conn.execute("DETACH DATABASE src")
        conn.execute("VACUUM")
    finally:
        conn.close()
    return kept
