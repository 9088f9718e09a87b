"""Writing files so that a reader never sees half of one."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def atomic_write(path: Path, data: bytes, durable: bool = True) -> None:
    """Write ``data`` to a temporary file beside ``path``, fsync it, rename it into place.

    ``durable=False`` skips the fsync (each costs 5-20 ms here): for files nothing needs
    after the machine itself went down, e.g. a sandbox's inputs (the sandbox is gone then,
    and its unit runs again from the artifact store)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            if durable:
                fh.flush()
                os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
