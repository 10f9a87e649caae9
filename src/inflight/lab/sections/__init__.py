"""The sections of the generated result pages: one interface, one module per section, table helpers.

A :class:`Section` collects what it shows from the repository's committed files (``collect(root)``) and
renders it (``render(data)``); a section whose data is empty is left out of its page. A section that owns a
block of ``results/summary.json`` names it (``summary_key``) and computes it (``summarize(root)``).
``inflight.lab.results_report.PAGES`` says which sections go on which page, in which order.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True, kw_only=True)
class Section:
    """One section of a generated page.

    Attributes:
        title: The section's heading as the pages and the docs that cite it name it.
        collect: What the section shows, read from the repository at the given root (falsy: nothing to show).
        render: The section's Markdown lines from what ``collect`` returned.
        summary_key: The block of ``results/summary.json`` the section owns, if any.
        summarize: That block computed from the result files (None: nothing to summarize yet).
    """

    title: str
    collect: Callable[[Path], Any]
    render: Callable[[Any], list[str]]
    summary_key: str | None = None
    summarize: Callable[[Path], dict[str, Any] | None] | None = None

    def lines(self, root: Path) -> list[str]:
        """The section's lines for the repository at ``root`` (none when it has nothing to show)."""
        data = self.collect(root)
        return self.render(data) if data else []

    def write_summary(self, root: Path) -> dict[str, Any] | None:
        """Compute the section's block and set it in ``results/summary.json``, keeping every other key.

        Returns:
            The block, or None (the file left as it was) when there is nothing to summarize.

        Raises:
            ValueError: when the section owns no block.
        """
        if self.summarize is None or self.summary_key is None:
            raise ValueError(f"section {self.title!r} owns no block of results/summary.json (no summary_key)")
        block = self.summarize(root)
        if block is not None:
            path = root / "results" / "summary.json"
            doc = json.loads(path.read_text()) if path.is_file() else {}
            doc[self.summary_key] = block
            path.write_text(json.dumps(doc, indent=1) + "\n")
        return block


def fmt(v: Any, spec: str = ",.0f", suffix: str = "") -> str:
    """A table cell: ``v`` formatted with ``spec`` and ``suffix``; yes/no for a bool, n/a when missing or not finite."""
    if isinstance(v, bool):
        return "yes" if v else "no"
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "n/a"
    return f"{format(v, spec)}{suffix}"


def markdown_table(header: list[str], rows: Iterable[list[str]]) -> list[str]:
    """The lines of a Markdown table with ``header`` and ``rows`` (cells already formatted)."""
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return out
