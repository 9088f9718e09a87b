"""Writing a report's files (report.md, report.json, report.html) into a folder."""

from __future__ import annotations

import contextlib
from pathlib import Path

from forklab.cli.errors import CliError


def write_report(texts: dict[str, str], folder: Path) -> None:
    """Write ``texts`` (file name → content) into ``folder``, all or nothing: every file is
    written under a temporary name first and renamed into place only once all are written,
    so a failure leaves no half-written file and no mix of old and new reports."""
    temps: list[Path] = []
    try:
        folder.mkdir(parents=True, exist_ok=True)
        for name, text in texts.items():
            tmp = folder / f".{name}.tmp"
            temps.append(tmp)
            tmp.write_text(text, encoding="utf-8")
        for tmp, name in zip(temps, texts, strict=True):
            tmp.replace(folder / name)
    except OSError as exc:
        for tmp in temps:
            with contextlib.suppress(OSError):
                tmp.unlink(missing_ok=True)
        raise CliError(
            f"{folder}: cannot write the report ({exc.strerror or exc}); pass a writable "
            "folder to --out"
        ) from None
