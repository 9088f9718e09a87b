"""Background processes that ``forklab up`` starts and ``forklab down`` stops.

Each is recorded in a pidfile under ``<home>/run`` together with its start time, so a
stale pidfile never leads to signalling an unrelated process that reused the pid.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from pathlib import Path

from pydantic import BaseModel


class Pidfile(BaseModel):
    pid: int
    started: int  # the process's start time in clock ticks (from /proc)
    argv: list[str]
    log: str


def process_started(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rpartition(")")[2].split()[19])


def running(pidfile: Path) -> Pidfile | None:
    """The recorded process if it is still the one alive under that pid, else None."""
    try:
        record = Pidfile.model_validate(json.loads(pidfile.read_text()))
    except (OSError, ValueError):
        return None
    return record if process_started(record.pid) == record.started else None


def alive(record: Pidfile) -> bool:
    """Whether the recorded process still runs (an exited child of ours is reaped first,
    so it does not pass for alive as a zombie)."""
    _reap(record.pid)
    return process_started(record.pid) == record.started


def start_background(argv: list[str], pidfile: Path, log: Path, env: dict[str, str]) -> Pidfile:
    """Start ``argv`` detached (own session), output to ``log``; record it in ``pidfile``."""
    log.parent.mkdir(parents=True, exist_ok=True)
    pidfile.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env=env,
        )
    record = Pidfile(pid=proc.pid, started=process_started(proc.pid) or 0, argv=argv, log=str(log))
    pidfile.write_text(record.model_dump_json())
    return record


def stop(pidfile: Path, grace_seconds: float = 15.0) -> bool:
    """SIGTERM the recorded process group, SIGKILL it after ``grace_seconds``; True if it
    was running. The pidfile is removed either way."""
    record = running(pidfile)
    pidfile.unlink(missing_ok=True)
    if record is None:
        return False
    try:
        os.killpg(record.pid, signal.SIGTERM)
    except ProcessLookupError:
        return False
    deadline = time.monotonic() + grace_seconds
    while time.monotonic() < deadline:
        if process_started(record.pid) != record.started:
            return True
        _reap(record.pid)
        time.sleep(0.1)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(record.pid, signal.SIGKILL)
    _reap(record.pid)
    return True


def _reap(pid: int) -> None:
    """Collect the exit status when the process is our own child (else it stays a zombie)."""
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)
