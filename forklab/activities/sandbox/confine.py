"""Run one command confined: in bubblewrap when it works here, else as a confined process.

Shared by the local backend (world runners) and by the sandboxed calls of the worker
(rehearsal, analysis with guard validation), so both get the same box, limits, timeout,
bounded output and the same honest record of how the command was confined.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable
from contextlib import suppress
from pathlib import Path
from typing import IO

from forklab.activities.sandbox.base import ExecResult, Limits
from forklab.activities.sandbox.jail import (
    LAUNCHER_INSIDE,
    RUNTIME,
    Mount,
    bubblewrap,
    bwrap_argv,
    interpreter,
    process_allowance,
    signal_code,
)
from forklab.activities.sandbox.seccomp import filter_program

OUTPUT_LIMIT = 64 * 1024  # bytes kept per stream: the first and last half of it
_LAUNCHER = RUNTIME / "launch.py"
#: What a host without bubblewrap leaves unprotected; recorded with every result there.
FALLBACK_GAPS = (
    "ran as a confined process with the worker's uid: the file system is not hidden (it "
    "can read and write what the worker can, FORKLAB_HOME included), there is no PID "
    "namespace (a setsid() child can outlive the sandbox), the process limit does not bind "
    "root, and the command does not die with a killed worker"
)


def kill_group(pgid: int) -> None:
    with suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGKILL)


def bounded(stream: IO[bytes]) -> str:
    size = stream.seek(0, os.SEEK_END)
    stream.seek(0)
    if size <= OUTPUT_LIMIT:
        return stream.read().decode(errors="replace")
    half = OUTPUT_LIMIT // 2
    head = stream.read(half)
    stream.seek(size - half)
    tail = stream.read()
    cut = size - 2 * half
    return f"{head.decode(errors='replace')}\n…[{cut} bytes cut]…\n{tail.decode(errors='replace')}"


def isolation(status: bytes, fallback: str | None) -> tuple[bool, str | None]:
    """Read the launcher's report: was the command cut off the network, and if not, why;
    ``fallback`` says why bubblewrap was not used (None when it was)."""
    gaps = f"bubblewrap unavailable ({fallback}); {FALLBACK_GAPS}" if fallback else None
    if not status:
        return False, "the sandbox launcher stopped before the command started"
    reported = json.loads(status)
    if reported["network_isolated"]:
        return True, gaps
    net = (
        f"private network namespace not permitted ({reported['note']}); "
        "the command ran on the host network"
    )
    return False, f"{net}; {gaps}" if gaps else net


def wait_exit(pid: int, seconds: float) -> bool:
    """Wait until ``pid`` exits, without reaping it; False on timeout."""
    pidfd = os.pidfd_open(pid)
    try:
        ready, _, _ = select.select([pidfd], [], [], max(seconds, 0.0))
        return bool(ready)
    finally:
        os.close(pidfd)


def _on_host(arg: str, mounts: list[Mount]) -> str:
    """Without bubblewrap nothing is mounted: an argument that names a mount's target (or
    a path under it) names the same file at its source on the host (e.g. the program the
    worker's own workload calls run, ``/.forklab/worker_calls.py``)."""
    for m in mounts:
        if arg == m.target or arg.startswith(m.target.rstrip("/") + "/"):
            return str(m.source) + arg[len(m.target.rstrip("/")) :]
    return arg


def run_confined(
    command: list[str],
    *,
    mounts: list[Mount],
    scratch: Path,
    env: dict[str, str],
    fallback_env: dict[str, str],
    limits: Limits,
    uid: int | None,
    timeout: float,
    on_start: Callable[[int], None] = lambda pid: None,
    on_exit: Callable[[int], None] = lambda pid: None,
) -> ExecResult:
    """Run ``command`` with ``scratch`` as its working folder (``/work`` in a box) and
    ``mounts`` read-only; ``env`` is its whole environment in a box, ``fallback_env`` on a
    host without bubblewrap. ``on_start``/``on_exit`` see the pid of the process group
    leader (to record it, e.g. for cleanup after a crash)."""
    bwrap, why_not = bubblewrap()
    # Without bwrap the box's uid could not reach a FORKLAB_HOME under a private home.
    uid = uid if bwrap else None
    config = {
        **limits.model_dump(exclude={"wall_seconds"}),
        "processes": process_allowance(limits.processes, uid),
        "uid": uid,
        "unshare_net": bwrap is None,
    }
    wall = min(timeout, limits.wall_seconds)
    with (
        tempfile.TemporaryFile() as out,
        tempfile.TemporaryFile() as err,
        tempfile.TemporaryFile() as seccomp,
    ):
        status_r, status_w = os.pipe()  # the launcher reports its confinement here
        launcher = [str(interpreter()), "-I", "-S"]
        inherited = [status_w]
        if bwrap is not None:
            launch = [*launcher, LAUNCHER_INSIDE, json.dumps(config), str(status_w)]
            program = filter_program()
            seccomp_fd = None
            if program is not None:
                seccomp.write(program)
                seccomp.flush()
                seccomp.seek(0)
                seccomp_fd = seccomp.fileno()
                inherited.append(seccomp_fd)
            argv = bwrap_argv(bwrap, mounts, scratch, env, [*launch, *command], seccomp_fd)
            cwd, popen_env = "/", {"PATH": "/usr/bin:/bin"}
        else:
            host = [_on_host(arg, mounts) for arg in command]
            argv = [*launcher, str(_LAUNCHER), json.dumps(config), str(status_w), *host]
            cwd, popen_env = str(scratch), fallback_env
        started = time.monotonic()
        try:
            proc = subprocess.Popen(
                argv,
                cwd=cwd,
                env=popen_env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=err,
                pass_fds=tuple(inherited),
                start_new_session=True,  # its own process group: killable as a whole
            )
        except OSError:
            os.close(status_r)
            raise
        finally:
            os.close(status_w)
        try:
            on_start(proc.pid)
            timed_out = not wait_exit(proc.pid, wall)
        finally:
            # The leader has exited (or must die now) but is not reaped yet, so its group
            # id cannot have been reused: this is the timeout's kill and it also ends
            # whatever the command left running in the background.
            kill_group(proc.pid)
            exit_code = proc.wait()
            seconds = time.monotonic() - started
            with os.fdopen(status_r, "rb") as status_pipe:
                status = status_pipe.read()
            on_exit(proc.pid)
        isolated, note = isolation(status, None if bwrap else why_not)
        return ExecResult(
            exit_code=signal_code(exit_code) if bwrap else exit_code,
            stdout=bounded(out),
            stderr=bounded(err),
            timed_out=timed_out,
            network_isolated=isolated,
            note=note,
            confinement="bubblewrap" if bwrap else "process",
            seconds=round(seconds, 6),
        )
