"""Compiled bytecode of a snapshot, made once per worker process, read by every box.

A snapshot is read-only and its boxes run with ``-B``, so without this each box compiled
every module of the runner and the workload from source again (measured in
docs/scaling.md). The worker process compiles them once per snapshot into a folder of
its own, outside the snapshot (which must hold exactly the files its id digests), and
each box gets that folder's ``__pycache__`` folders mounted read-only over the empty
ones the snapshot keeps as mount points (``pycache_prefix`` would do it in one mount,
but it moves the standard library's bytecode too, which a box then compiles instead).

Trust: the folder is written by this process from the snapshot's source right after
that source was verified against the snapshot id, and every use re-hashes each ``.pyc``
against what this process wrote (in memory, not on disk); a file that changed makes the
folder be compiled again. The ``.pyc`` files are checked-hash ones: the interpreter in
the box also compares each with the source it sits next to and compiles the source
itself when they disagree, so a stale file can only cost time, never run other code.

Only ForkLab's own files (its package, ``experiments/``, which a workload bundle may not
use) are compiled here: a workload bundle's source is untrusted and is parsed by the box
that imports it, under the box's limits, which reports a file that does not compile as
its own error. A file of ForkLab's that does not compile is left to the box likewise.
"""

from __future__ import annotations

import hashlib
import os
import py_compile
import secrets
import shutil
import sys
import threading
from pathlib import Path

#: The folder next to a module where the interpreter looks for its bytecode.
PYCACHE = "__pycache__"

#: The snapshot's folder of ForkLab's own files
#: (``forklab.experiments.experiment.bundle._OWN_PACKAGE``).
OWN_PACKAGE = "forklab"


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


class BytecodeCache:
    """One folder per snapshot under ``root/<pid>-<token>/`` (this process's own);
    folders of dead worker processes are removed when the next one starts."""

    def __init__(self, root: Path) -> None:
        root.mkdir(parents=True, exist_ok=True)
        for stale in root.iterdir():
            pid = stale.name.split("-")[0]
            if pid.isdigit() and not Path(f"/proc/{pid}").exists():
                shutil.rmtree(stale, ignore_errors=True)
        self.root = root / f"{os.getpid()}-{secrets.token_hex(4)}"
        self._lock = threading.Lock()
        self._written: dict[str, dict[Path, str]] = {}  # digest → .pyc path → its sha256

    def folder(self, digest: str, code: Path, inside: str) -> Path:
        """The bytecode folder of the snapshot ``digest`` whose (verified) source is in
        ``code`` and which boxes see at ``inside``, laid out as the snapshot is (one
        ``__pycache__`` next to each module): compiled now unless this process already
        did and none of its files changed since."""
        with self._lock:
            folder = self.root / digest
            written = self._written.get(digest)
            if written is not None and all(
                p.is_file() and _sha256(p) == sha for p, sha in written.items()
            ):
                return folder
            self._written.pop(digest, None)
            self._written[digest] = self._compile(folder, code, inside)
            return folder

    @staticmethod
    def _compile(folder: Path, code: Path, inside: str) -> dict[Path, str]:
        tmp = folder.with_name(f".tmp-{folder.name}-{secrets.token_hex(4)}")
        written: dict[Path, str] = {}
        try:
            for source in sorted((code / OWN_PACKAGE).rglob("*.py")):
                rel = source.relative_to(code)
                name = f"{source.stem}.{sys.implementation.cache_tag}.pyc"
                target = tmp / rel.parent / PYCACHE / name
                try:
                    py_compile.compile(
                        str(source),
                        cfile=str(target),
                        dfile=f"{inside}/{rel.as_posix()}",  # the path tracebacks show
                        doraise=True,
                        invalidation_mode=py_compile.PycInvalidationMode.CHECKED_HASH,
                    )
                except (
                    py_compile.PyCompileError,
                    SyntaxError,
                    ValueError,
                    RecursionError,
                    MemoryError,
                ):
                    continue  # the box compiles it and reports its error itself
                written[folder / target.relative_to(tmp)] = _sha256(target)
            tmp.mkdir(parents=True, exist_ok=True)  # (a snapshot may have nothing to compile)
            shutil.rmtree(folder, ignore_errors=True)
            os.rename(tmp, folder)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        return written


def mount_points(code: Path) -> None:
    """Make an empty ``__pycache__`` folder next to the modules of a snapshot being
    prepared: a box's bytecode is mounted there (a snapshot's digest covers files only)."""
    for folder in {source.parent for source in code.rglob("*.py")}:
        if not (folder / PYCACHE).exists():  # (a bundle's own file of that name stays)
            (folder / PYCACHE).mkdir()


def pycache_folders(bytecode: Path, code: Path) -> list[tuple[Path, str]]:
    """Each ``__pycache__`` folder of ``bytecode`` whose mount point the snapshot in
    ``code`` has, as ``(host folder, path relative to the snapshot)``; a snapshot made
    before it kept mount points has none, and its boxes compile from source."""
    found = []
    for cache in sorted(bytecode.rglob(PYCACHE)):
        rel = cache.relative_to(bytecode)
        if (code / rel).is_dir():
            found.append((cache, rel.as_posix()))
    return found
