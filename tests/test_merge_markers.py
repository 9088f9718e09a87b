"""No text file of the project holds a merge's conflict markers: a doc that does still
renders (the module table of docs/forks.md once shipped with both sides of a conflict)."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
_FOLDERS = ("forklab", "tests", "docs", "bench", "examples", "scripts", "deploy", ".ci")
_TEXT = {".py", ".md", ".yaml", ".yml", ".toml", ".sh", ".cfg", ".txt", ""}


def _text_files() -> list[Path]:
    files = [p for p in ROOT.iterdir() if p.is_file() and p.suffix in _TEXT]
    for folder in _FOLDERS:
        files += [p for p in (ROOT / folder).rglob("*") if p.is_file() and p.suffix in _TEXT]
    return files


def test_no_text_file_holds_conflict_markers() -> None:
    found = []
    for path in _text_files():
        lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
        opened = [i for i, line in enumerate(lines) if line.startswith("<<<<<<< ")]
        if opened and any(line.startswith(">>>>>>> ") for line in lines[opened[0] :]):
            found.append(f"{path.relative_to(ROOT)}:{opened[0] + 1}")
    assert found == [], f"conflict markers left in {found}"
