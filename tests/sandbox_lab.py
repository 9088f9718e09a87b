"""Helpers for the sandbox tests (local backend, attacks, workspaces): run code in a box,
watch host processes by a marker, and run a host script without CAP_SYS_ADMIN."""

from __future__ import annotations

import shutil
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from forklab.activities.sandbox import ExecResult, LocalSandboxBackend
from tests.helpers import ROOT


def run_python(
    backend: LocalSandboxBackend, box: str, code: str, timeout: float = 30
) -> ExecResult:
    """Run ``code`` (dedented) with the box's isolated interpreter."""
    return backend.exec(box, ["python", "-c", textwrap.dedent(code)], timeout)


def process_gone(pid: int) -> bool:
    """No such process, or only its zombie (reaping orphans is init's job, not ours)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):  # gone before the open, or during the read
        return True
    return stat.rpartition(")")[2].split()[0] == "Z"


def wait_for(predicate: Callable[[], object], seconds: float = 15) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.02)
    raise AssertionError("condition not reached in time")


def pids_running(marker: str) -> list[int]:
    """Host pids of live processes whose command line holds ``marker``."""
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            text = cmdline.read_bytes().decode(errors="replace")
        except OSError:
            continue
        pid = int(cmdline.parent.name)
        if marker in text and "pytest" not in text and not process_gone(pid):
            found.append(pid)
    return found


def marked_sleeper(name: str) -> tuple[str, str]:
    """A unique marker, and the argv (as Python source, for code run in a box) of a child
    that sleeps 300 s with that marker on its command line: ``pids_running(marker)``
    finds it on the host for as long as it lives."""
    marker = f"{name}-{time.monotonic_ns()}"
    return marker, f'[sys.executable, "-S", "-c", "import time; time.sleep(300)  # {marker}"]'


def without_sys_admin(script: str, *args: str) -> subprocess.CompletedProcess[str]:
    """Run the Python ``script`` with ``args`` in a host process whose bounding set lacks
    CAP_SYS_ADMIN (no namespaces, no mounts), from the repository root; skips the test
    where ``setpriv`` (util-linux) is missing."""
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        pytest.skip("setpriv (util-linux) is needed to take CAP_SYS_ADMIN away")
    return subprocess.run(
        [setpriv, "--bounding-set=-sys_admin", "--", sys.executable, "-c", script, *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
    )
