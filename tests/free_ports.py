"""A free TCP port for a server a test starts in another process (a dev server, a
stand-in), chosen outside the kernel's ephemeral range.

A port found by binding port 0 and closing the socket is an ephemeral one, and until the
server binds it the kernel may hand it to another socket (another test's port-0 bind, an
outgoing connection's source port): a fresh-clone CI run failed once so, the dev server
exiting with "address already in use" while other processes ran. The kernel never hands
out a port outside that range by itself, so only another explicit bind can take it."""

from __future__ import annotations

import random
import socket
from pathlib import Path

_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")


def _ephemeral() -> range:
    try:
        low, high = (int(n) for n in _RANGE.read_text().split())
    except (OSError, ValueError):
        low, high = 32768, 60999  # Linux's default
    return range(low, high + 1)


def free_port() -> int:
    """A port on 127.0.0.1 nothing is bound to now, outside the ephemeral range when one
    can be found there (else an ephemeral one, as before)."""
    ephemeral = _ephemeral()
    rng = random.SystemRandom()
    for _ in range(100):
        port = rng.randrange(10000, 65536)
        if port in ephemeral:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
