"""``forklab server|worker|up|down``: the embedded Temporal dev server and a ForkLab worker."""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import FrameType

from forklab.errors import CliError
from forklab.ops_common import add_connection_flags, command_runtime, run, settings_from
from workers import processes
from workers.config import ENV, Settings
from workers.server import reachable, server_argv, wait_reachable
from workers.worker import run_worker

#: Seconds ``up`` waits for the dev server to accept connections.
SERVER_START_SECONDS = 60.0
#: Seconds a freshly started background worker must stay alive to count as started.
WORKER_SETTLE_SECONDS = 2.0


def _pidfile(settings: Settings, name: str) -> Path:
    return settings.run_dir / f"{name}.pid"


def _child_env(settings: Settings) -> dict[str, str]:
    """The environment of background processes: this one's, plus the resolved settings."""
    env = dict(os.environ)
    for field, var in ENV.items():
        env[var] = str(getattr(settings, field))
    return env


def ensure_server(settings: Settings) -> bool:
    """Start the dev server in the background unless one answers; True if it was started."""
    if reachable(settings.host, settings.port):
        return False
    settings.home.mkdir(parents=True, exist_ok=True)
    log = settings.logs_dir / "server.log"
    processes.start_background(
        server_argv(settings), _pidfile(settings, "server"), log, _child_env(settings)
    )
    if not wait_reachable(settings.host, settings.port, SERVER_START_SECONDS):
        processes.stop(_pidfile(settings, "server"))
        raise CliError(
            f"the Temporal dev server did not accept connections on {settings.address} within "
            f"{SERVER_START_SECONDS:g} s; see {log}"
        )
    return True


def ensure_worker(settings: Settings) -> bool:
    """Start a background worker unless ``forklab up`` already runs one; True if started."""
    pidfile = _pidfile(settings, "worker")
    if processes.running(pidfile):
        return False
    log = settings.logs_dir / "worker.log"
    argv = [sys.executable, "-m", "forklab.cli", "worker"]
    processes.start_background(argv, pidfile, log, _child_env(settings))
    time.sleep(WORKER_SETTLE_SECONDS)
    if not processes.running(pidfile):
        raise CliError(f"the ForkLab worker exited right after starting; see {log}")
    return True


def stop_services(settings: Settings, worker: bool = True, server: bool = True) -> list[str]:
    """Stop what ``up`` started (worker first, so it can finish its current step)."""
    stopped = []
    if worker and processes.stop(_pidfile(settings, "worker")):
        stopped.append("worker")
    if server and processes.stop(_pidfile(settings, "server")):
        stopped.append("server")
    return stopped


def cmd_server(args: argparse.Namespace) -> int:
    settings = settings_from(args)
    if reachable(settings.host, settings.port):
        raise CliError(
            f"something already listens on {settings.address}; stop it or pass another --address"
        )
    settings.home.mkdir(parents=True, exist_ok=True)
    print(
        f"Temporal dev server on {settings.address}, Web UI {settings.ui_url}, "
        f"data in {settings.temporal_db}; Ctrl-C stops it"
    )
    proc = subprocess.Popen(server_argv(settings))

    def forward(signum: int, frame: FrameType | None) -> None:
        proc.send_signal(signal.SIGTERM)

    signal.signal(signal.SIGTERM, forward)
    try:
        code = proc.wait()
    except KeyboardInterrupt:
        proc.send_signal(signal.SIGTERM)
        code = proc.wait()
    return 0 if code in (0, -signal.SIGTERM, 130) else code


def cmd_worker(args: argparse.Namespace) -> int:
    settings = settings_from(args)
    if args.max_sandboxes is not None:
        settings = settings.model_copy(update={"max_sandboxes": args.max_sandboxes})
    print(
        f"ForkLab worker: task queue {settings.task_queue} on {settings.address} "
        f"(namespace {settings.namespace}), home {settings.home}; Ctrl-C stops it",
        flush=True,
    )
    try:
        run(lambda: run_worker(settings, command_runtime()))
    except RuntimeError as exc:
        raise CliError(
            f"the worker cannot connect to Temporal at {settings.address} "
            f"({str(exc).splitlines()[0]}); start it with `forklab up`"
        ) from None
    return 0


def cmd_up(args: argparse.Namespace) -> int:
    settings = settings_from(args)
    server = ensure_server(settings)
    worker = ensure_worker(settings)
    print(
        f"Temporal: {'started' if server else 'already running'} on {settings.address} "
        f"(data {settings.temporal_db})"
    )
    print(f"worker: {'started' if worker else 'already running'} (logs {settings.logs_dir})")
    print(f"Web UI: {settings.ui_url}")
    print("stop both with `forklab down`")
    return 0


def cmd_down(args: argparse.Namespace) -> int:
    settings = settings_from(args)
    stopped = stop_services(settings)
    if stopped:
        print(f"stopped: {' and '.join(stopped)}")
    else:
        print(f"nothing to stop: `forklab up` runs no server or worker under {settings.home}")
    return 0


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("server", help="run the embedded Temporal dev server (foreground)")
    add_connection_flags(p, ui=True)
    p.set_defaults(func=cmd_server)

    p = sub.add_parser("worker", help="run a ForkLab worker (foreground)")
    p.add_argument("--max-sandboxes", type=int, help="sandboxes at once (FORKLAB_MAX_SANDBOXES)")
    add_connection_flags(p)
    p.set_defaults(func=cmd_worker)

    p = sub.add_parser("up", help="start the dev server and a worker in the background")
    add_connection_flags(p, ui=True)
    p.set_defaults(func=cmd_up)

    p = sub.add_parser("down", help="stop what `forklab up` started")
    add_connection_flags(p)
    p.set_defaults(func=cmd_down)
