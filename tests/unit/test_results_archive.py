"""The archive of closed questions: frozen with what its sections read, and every change to those files found."""

from __future__ import annotations

import json
from pathlib import Path

from inflight.lab import archive
from inflight.lab.sections import Section

ROOT = Path(__file__).resolve().parents[2]


def test_the_committed_archive_matches_every_file_it_was_rendered_from() -> None:
    m = archive.manifest(ROOT)
    assert m["sections"] and m["files"] and m["summary_blocks"], "docs/RESULTS-archive.json is empty"
    assert archive.check(ROOT) == []
    page = (ROOT / archive.ARCHIVE_PAGE).read_text()
    for title in m["sections"]:
        assert f"\n## {title}" in page, title
    # every frozen folder holds files, and each is named in the manifest
    for folder in m["folders"]:
        assert any(p == f"results/{folder}" or p.startswith(f"results/{folder}/") for p in m["files"]), folder


def _repo(tmp_path: Path) -> tuple[Path, Section]:
    root = tmp_path / "repo"
    (root / "results" / "old").mkdir(parents=True)
    (root / "docs").mkdir()
    (root / "results" / "old" / "a.json").write_text(json.dumps({"rps": 1000}))
    (root / "results" / "summary.json").write_text(json.dumps({"old": {"ratio": 1.5}, "live": {"x": 1}}))

    def collect(r: Path) -> dict[str, int]:
        return json.loads((r / "results" / "old" / "a.json").read_text())

    section = Section(title="Old question", collect=collect, render=lambda d: ["## Old question", "", f"{d['rps']:,}"])
    return root, section


def test_freeze_renders_the_sections_and_check_finds_every_change(tmp_path: Path) -> None:
    root, section = _repo(tmp_path)
    rows = [["old", "capacity", "1,000", ">= 500", "met", "Old question"]]
    archive.freeze(root, [section], folders=["old"], summary_keys=["old"], glance_rows=rows, commit="f" * 40)
    page = (root / archive.ARCHIVE_PAGE).read_text()
    assert "## Old question\n\n1,000\n" in page and "`ffffffffffff`" in page
    assert archive.check(root) == []
    assert archive.glance_rows(root) == [["old", "capacity", "1,000", ">= 500", "met", "Old question (archive)"]]
    # a live block may change; the frozen one may not
    (root / "results" / "summary.json").write_text(json.dumps({"old": {"ratio": 1.5}, "live": {"x": 2}}))
    assert archive.check(root) == []
    (root / "results" / "summary.json").write_text(json.dumps({"old": {"ratio": 1.6}, "live": {"x": 2}}))
    (problem,) = archive.check(root)
    assert "frozen block 'old' changed" in problem
    (root / "results" / "summary.json").write_text(json.dumps({"old": {"ratio": 1.5}}))
    # a file rewritten, one added, one removed: each named with what to do
    (root / "results" / "old" / "a.json").write_text(json.dumps({"rps": 2000}))
    (root / "results" / "old" / "b.json").write_text("{}")
    changed, new = archive.check(root)
    assert changed.startswith("results/old/a.json changed") and "git checkout it" in changed
    assert new.startswith("results/old/b.json is new") and "restore the sections from commit ffffffffffff" in new
    (root / "results" / "old" / "a.json").unlink()
    gone, _ = archive.check(root)
    assert gone.startswith("results/old/a.json, which") and "is gone" in gone


def test_no_manifest_nothing_frozen(tmp_path: Path) -> None:
    assert archive.check(tmp_path) == [] and archive.glance_rows(tmp_path) == []
