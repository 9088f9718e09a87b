"""Bubblewrap confinement: the argv that puts one command in a box of its own.

A box sees a read-only system (``/usr`` and its links, the interpreter's own prefix), the
read-only mounts it is given (the code it runs), one writable scratch folder, a private
``/dev``, ``/proc`` and ``/tmp`` (empty, not writable for the sandbox user), and nothing
else: no ``FORKLAB_HOME`` (tokens, keys, ledger, artifacts, other snapshots), no home
folder, no ``/etc`` beyond the loader cache. It has its own PID, network (loopback only),
IPC and UTS namespaces, a cleared environment, and it dies with its supervisor
(``--die-with-parent``; the PID namespace takes every descendant with it, including one
that called ``setsid()``). Inside, ``launch.py`` applies the rlimits and, when the worker
runs as root, drops to a uid of the box's own, so that the process limit counts this box
alone and no root-owned file is writable.

Extra mounts (a copy-on-write workspace, say) are plain :class:`Mount` values; the rest
of the box does not change.
"""

from __future__ import annotations

import functools
import hashlib
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import forklab.runtime
from forklab.runtime.worker_calls import tasks_of_this_uid

#: The folder of the programs that run inside a box (``forklab.runtime``), run by path.
RUNTIME = Path(forklab.runtime.__file__).parent

#: Where the launcher and the scratch folder appear inside a box.
LAUNCHER_INSIDE = "/.forklab/launch.py"
SCRATCH_INSIDE = "/work"
#: Sandboxed commands run as one of these uids when the worker is root.
SANDBOX_UID_BASE = 200_000
SANDBOX_UIDS = 60_000
#: Host paths that hold the system's programs and libraries (or links to them).
_SYSTEM = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
_LAUNCHER = RUNTIME / "launch.py"


@dataclass(frozen=True)
class Mount:
    """A host path shown at ``target`` inside the box, read-only unless ``writable``."""

    source: Path
    target: str
    writable: bool = False


def sandbox_uid(key: str) -> int | None:
    """The unprivileged uid a box keyed ``key`` runs as, or None when the worker is not
    root (then the box keeps the worker's uid inside a user namespace)."""
    if os.geteuid() != 0:
        return None
    return SANDBOX_UID_BASE + int(hashlib.sha256(key.encode()).hexdigest()[:8], 16) % SANDBOX_UIDS


def process_allowance(limit: int, uid: int | None) -> int:
    """``RLIMIT_NPROC`` for a box: ``limit`` when it has a uid of its own; otherwise the
    limit counts every task of the worker's user — each thread, not each process (the
    kernel counts threads) — so those running now are added. Counting processes left a box
    of a user with many threads (a worker's pools, the Temporal server, a desktop session)
    no room to fork or start a thread."""
    if uid is not None:
        return limit
    return tasks_of_this_uid() + limit


def interpreter() -> Path:
    """The real interpreter behind ``sys.executable`` (a venv's ``python`` is a link whose
    venv is not in the box)."""
    return Path(os.path.realpath(sys.executable))


def _namespaces() -> list[str]:
    flags = ["--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts"]
    flags += ["--unshare-cgroup-try", "--die-with-parent", "--new-session"]
    if os.geteuid() != 0:
        return [*flags, "--unshare-user"]
    # Root keeps only what the launcher needs to drop to the box's own uid.
    return [*flags, "--cap-drop", "ALL", "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"]


@functools.cache
def bubblewrap() -> tuple[str | None, str]:
    """``(path, "")`` when bwrap works here, else ``(None, why not)``; probed once."""
    path = shutil.which("bwrap")
    if path is None:
        return None, "bubblewrap (bwrap) is not installed; run scripts/ensure-bubblewrap.sh"
    try:
        probe = subprocess.run(
            [path, *_namespaces(), "--ro-bind", "/", "/", "true"],
            capture_output=True,
            timeout=30,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, f"bwrap could not be started ({exc})"
    if probe.returncode != 0:
        why = probe.stderr.decode(errors="replace").strip().splitlines()[-1:] or ["no message"]
        return None, f"bwrap cannot create its namespaces on this host ({why[0]})"
    return path, ""


#: The worker setting that lets workload code run without bubblewrap, named for what it
#: gives up: the fallback process can read and write whatever the worker can.
ALLOW_UNCONFINED = "FORKLAB_ALLOW_UNCONFINED_WORKLOADS"


class UnconfinedRefused(Exception):
    """This host has no working bubblewrap and the worker's policy does not allow running
    workload code without it; the message is the sentence to show."""


def require_confinement(allow_unconfined: bool) -> None:
    """Fail closed: raise ``UnconfinedRefused`` unless bubblewrap works here or the
    worker's policy explicitly accepts the confined-process fallback. Without bwrap a
    hostile workload's box could write the host's ``/tmp`` and read ``FORKLAB_HOME``."""
    bwrap, why_not = bubblewrap()
    if bwrap is None and not allow_unconfined:
        raise UnconfinedRefused(
            f"this worker runs no workload code unconfined and {why_not} (Debian/Ubuntu: "
            f"apt-get install bubblewrap); or set {ALLOW_UNCONFINED}=1 on the worker to run "
            "it as a process that can read and write whatever the worker can"
        )


def _system_mounts() -> list[str]:
    args: list[str] = []
    for path in _SYSTEM:
        if os.path.islink(path):
            args += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            args += ["--ro-bind", path, path]
    return [*args, "--ro-bind-try", "/etc/ld.so.cache", "/etc/ld.so.cache"]


def _covered(target: str) -> bool:
    return any(target == s or target.startswith(s + "/") for s in _SYSTEM)


def _parents(target: str, made: set[str]) -> list[str]:
    """``--dir`` for every missing ancestor of ``target``, world-readable (bwrap would
    make them 0700, which an unprivileged sandbox user cannot cross)."""
    args: list[str] = []
    for parent in reversed(Path(target).parents):
        p = str(parent)
        if p == "/" or p in made or _covered(p):
            continue
        made.add(p)
        args += ["--perms", "0755", "--dir", p]
    return args


def bwrap_argv(
    bwrap: str,
    mounts: list[Mount],
    scratch: Path,
    env: dict[str, str],
    command: list[str],
    seccomp_fd: int | None = None,
) -> list[str]:
    """The full ``bwrap ... launcher command`` argv; ``command`` starts with the launcher's
    interpreter and arguments (see ``launch.py``); ``seccomp_fd`` is an open file holding
    the box's filter (``forklab.activities.sandbox.seccomp``), which bwrap reads and loads."""
    made: set[str] = set()
    args = [bwrap, *_namespaces(), *_system_mounts()]
    if seccomp_fd is not None:
        args += ["--seccomp", str(seccomp_fd)]
    prefix = Path(sys.base_prefix).resolve()
    if not _covered(str(prefix)):
        args += [*_parents(str(prefix), made), "--ro-bind", str(prefix), str(prefix)]
        made.add(str(prefix))
    args += ["--dev", "/dev", "--proc", "/proc", "--tmpfs", "/tmp"]
    args += [*_parents(LAUNCHER_INSIDE, made), "--ro-bind", str(_LAUNCHER), LAUNCHER_INSIDE]
    for m in mounts:
        args += _parents(m.target, made)
        args += ["--bind" if m.writable else "--ro-bind", str(m.source), m.target]
        made.add(m.target)
    args += ["--bind", str(scratch), SCRATCH_INSIDE, "--chdir", SCRATCH_INSIDE, "--clearenv"]
    for key, value in sorted(env.items()):
        args += ["--setenv", key, value]
    return [*args, *command]


def signal_code(returncode: int) -> int:
    """bwrap reports a command killed by signal N as ``128 + N``; give it back as ``-N``
    (as ``subprocess`` does), so callers see one convention with or without bwrap."""
    if 128 < returncode <= 128 + 64:
        return 128 - returncode
    return returncode
