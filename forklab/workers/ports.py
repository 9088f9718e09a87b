"""The ports ``forklab up`` opens, and what holds one it did not open.

On a shared machine another user's dev server or payments stand-in may already answer on
a default port; ``up`` used to take whatever answered as its own (and sent an agent's
payments to someone else's service). Now each port is owned: one that something else
holds stops ``up`` with a sentence naming the port, the setting and the holder.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

#: TCP state LISTEN in ``/proc/net/tcp``.
_LISTEN = "0A"


@dataclass(frozen=True)
class OwnedPort:
    """A port a service of ``forklab up`` opens: the service (its pidfile's name), what it is
    for, and the setting that chooses it."""

    port: int
    service: str
    what: str
    setting: str


def listening_inodes(port: int, proc: Path = Path("/proc")) -> set[str]:
    """The socket inodes listening on TCP ``port`` (any address, IPv4 or IPv6)."""
    found: set[str] = set()
    for table in ("tcp", "tcp6"):
        try:
            lines = (proc / "net" / table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) < 10 or fields[3] != _LISTEN:
                continue
            if int(fields[1].rpartition(":")[2], 16) == port:
                found.add(fields[9])
    return found


def holder(port: int, proc: Path = Path("/proc")) -> str:
    """Who listens on ``port``, as a phrase: ``pid 123 (temporal server start-dev …)``, or
    what can be said when the process is not this user's to look at."""
    inodes = listening_inodes(port, proc)
    if not inodes:
        return "a process this machine does not list (another network namespace?)"
    wanted = {f"socket:[{inode}]" for inode in inodes}
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fds = list((entry / "fd").iterdir())
        except OSError:
            continue  # another user's process: its descriptors are not ours to read
        for fd in fds:
            try:
                if os.readlink(fd) in wanted:
                    return f"pid {entry.name} ({_command(entry)})"
            except OSError:
                continue
    return "a process of another user"


def _command(entry: Path) -> str:
    try:
        words = (entry / "cmdline").read_bytes().split(b"\0")
    except OSError:
        return "?"
    text = " ".join(w.decode(errors="replace") for w in words if w)
    return text if len(text) <= 80 else text[:79] + "…"
