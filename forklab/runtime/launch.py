"""The first program a local sandbox runs: it confines itself, then becomes the command.

Run by path as ``python -I -S launch.py CONFIG STATUS_FD COMMAND...``, inside bubblewrap
or (on a host without it) directly. It applies the resource limits, enters a private
network namespace unless bubblewrap already made one, drops to the sandbox's own uid
when it was started as root, reports on ``STATUS_FD`` whether the network is private,
and replaces itself with ``COMMAND`` (same pid, same process group) — or, when
``COMMAND`` is this interpreter running a module (``-S -B -m``, the runner), runs that
module itself, sparing a second interpreter's start. Doing this in a
separate program rather than in ``subprocess``'s ``preexec_fn``
keeps the parent safe: ``preexec_fn`` may deadlock when the parent has threads, and
activity workers do. Standard library only; it must not import ForkLab.
"""

from __future__ import annotations

import json
import os
import resource
import sys

CLONE_NEWNET = 0x40000000
EXIT_NOT_STARTED = 127  # the command could not be started (as in a shell)


def private_network() -> str | None:
    """Enter a new, empty network namespace; None on success, else why not."""
    import ctypes  # here: only a host without bubblewrap needs it, and every box starts here

    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(CLONE_NEWNET) == 0:
        return None
    err = ctypes.get_errno()
    return f"unshare(CLONE_NEWNET) failed: {os.strerror(err)}"


def apply_limits(config: dict[str, int]) -> None:
    address_space = config["memory_mb"] * 1024 * 1024
    resource.setrlimit(resource.RLIMIT_AS, (address_space, address_space))
    # SIGXCPU at the soft limit; the kernel sends SIGKILL at the hard one.
    cpu = config["cpu_seconds"]
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
    resource.setrlimit(resource.RLIMIT_NOFILE, (config["open_files"], config["open_files"]))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    # Processes (and threads) of this uid: with a uid per sandbox, this sandbox's alone.
    resource.setrlimit(resource.RLIMIT_NPROC, (config["processes"], config["processes"]))
    file_size = config["file_mb"] * 1024 * 1024
    resource.setrlimit(resource.RLIMIT_FSIZE, (file_size, file_size))


def drop_privileges(uid: int) -> None:
    """Become ``uid`` (group ``uid``, no supplementary groups); the kernel clears every
    capability on the way."""
    os.setgroups([])
    os.setgid(uid)
    os.setuid(uid)


def python_module(command: list[str]) -> tuple[str, list[str]] | None:
    """``(module, args)`` when ``command`` is this interpreter running ``-S -B -m module``
    (how a sandbox runs the runner), else None."""
    if len(command) < 5 or command[1:4] != ["-S", "-B", "-m"]:
        return None
    if os.path.realpath(command[0]) != os.path.realpath(sys.executable):
        return None
    return command[4], command[5:]


def run_module(module: str, args: list[str]) -> int:
    """Run ``module`` as ``python -S -B -m module args`` would, in this process instead of
    a second interpreter (that start, and its imports of what this one already holds, are
    a per-batch cost; see docs/scaling.md). This interpreter runs isolated (``-I -S``), so
    what ``-m`` and the environment would add to the path is added here."""
    import runpy

    sys.dont_write_bytecode = True  # -B
    paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    sys.path[:0] = [os.getcwd(), *paths]  # -m: the working folder first, then PYTHONPATH
    sys.argv = [module, *args]  # runpy puts the module's file in argv[0]
    runpy.run_module(module, run_name="__main__", alter_sys=True)
    return 0


def main(argv: list[str]) -> int:
    config = json.loads(argv[1])
    status_fd = int(argv[2])
    command = argv[3:]
    why_not = private_network() if config["unshare_net"] else None
    apply_limits(config)
    if config["uid"] is not None:
        drop_privileges(config["uid"])
    os.write(status_fd, json.dumps({"network_isolated": why_not is None, "note": why_not}).encode())
    os.close(status_fd)
    module = python_module(command)
    if module is not None:
        return run_module(*module)
    try:
        os.execvp(command[0], command)
    except OSError as exc:
        print(f"sandbox: cannot start {command[0]!r}: {exc.strerror}", file=sys.stderr)
    return EXIT_NOT_STARTED


if __name__ == "__main__":
    sys.exit(main(sys.argv))
