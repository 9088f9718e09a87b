"""``forklab server|worker|up|down``: the embedded Temporal dev server and a ForkLab worker."""

from __future__ import annotations

import argparse
import signal
import subprocess
import sys
from collections.abc import Collection
from types import FrameType

from forklab.cli.errors import CliError
from forklab.cli.ops_common import (
    add_connection_flags,
    add_version_flags,
    run,
    settings_from,
    start_cli_worker,
)
from forklab.cli.runfork.agent_services import (
    agent_settings,
    ensure_agent_services,
    stop_agent_services,
)
from forklab.workers import processes
from forklab.workers.config import ENV, ConfigError, Settings
from forklab.workers.ports import OwnedPort, holder
from forklab.workers.runfork.agent_config import AGENT_ENV
from forklab.workers.server import (
    ServerError,
    pidfile,
    reachable,
    server_argv,
    start_server,
    stop_server,
)


def owned_ports(settings: Settings) -> list[OwnedPort]:
    """Every port ``forklab up`` opens under these settings, with the service that opens it."""
    agent = agent_settings(settings)
    ports = [
        OwnedPort(settings.port, "server", "the Temporal frontend", ENV["address"]),
        OwnedPort(settings.ui_port, "server", "the Web UI", ENV["ui_port"]),
        OwnedPort(settings.dev_http_port, "server", "the dev server's HTTP API", ENV["http_port"]),
        OwnedPort(
            settings.dev_metrics_port, "server", "the dev server's metrics", ENV["metrics_port"]
        ),
    ]
    if agent.local_model:
        ports.append(
            OwnedPort(
                agent.model_port, "model-server", "the local model server", AGENT_ENV["model_port"]
            )
        )
    if agent.local_effects:
        ports.append(
            OwnedPort(
                agent.effects_port,
                "effects-service",
                "the payments/mail service",
                AGENT_ENV["effects_port"],
            )
        )
    return ports


def claim_ports(settings: Settings, services: Collection[str] | None = None) -> None:
    """Refuse, before anything starts, a port that two settings share or that something
    ``forklab up`` did not start holds: it would otherwise take that something for its own
    service (another user's dev server, or their payments stand-in). ``services``: only
    the ports of these (default: all)."""
    ports = [p for p in owned_ports(settings) if services is None or p.service in services]
    seen: dict[int, OwnedPort] = {}
    for owned in ports:
        if (other := seen.setdefault(owned.port, owned)) is not owned:
            raise CliError(
                f"{other.setting} and {owned.setting} both give port {owned.port}; "
                "give each its own port",
                code=2,
            )
    for owned in ports:
        if processes.running(pidfile(settings, owned.service)) is not None:
            continue  # ours: `forklab up` started it and it still runs
        host = settings.host if owned.service == "server" else "127.0.0.1"
        if reachable(host, owned.port):
            hint = (
                " (to use that server as it is, run only a worker: `forklab worker`)"
                if owned.setting == ENV["address"]
                else ""
            )
            raise CliError(
                f"port {owned.port} ({owned.what}, setting {owned.setting}) is held by "
                f"{holder(owned.port)}, which `forklab up` did not start; stop it or set "
                f"{owned.setting} to a free port{hint}"
            )


def ensure_server(settings: Settings) -> bool:
    """Start the dev server in the background unless one answers; True if it was started."""
    try:
        return start_server(settings)
    except ServerError as exc:
        raise CliError(str(exc)) from None


def ensure_worker(settings: Settings) -> bool:
    """Start a background worker unless ``forklab up`` already runs one; True if started."""
    return start_cli_worker(settings, "worker", "the ForkLab worker")


def stop_services(settings: Settings, worker: bool = True, server: bool = True) -> list[str]:
    """Stop what ``up`` started (workers first, so they can finish their current step)."""
    stopped = stop_agent_services(settings) if worker else []
    if worker and processes.stop(pidfile(settings, "worker")):
        stopped.append("worker")
    if server and stop_server(settings):
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
    print(
        f"ForkLab worker: task queue {settings.task_queue} on {settings.address} "
        f"(namespace {settings.namespace}), home {settings.home}; Ctrl-C stops it",
        flush=True,
    )
    # the worker's activities, analysis and store clients: imported by this command only
    from forklab.workers.experiment.worker import AnalysisPoolError, run_worker

    try:
        run(lambda: run_worker(settings))
    except ConfigError as exc:
        raise CliError(str(exc), code=2) from None
    except AnalysisPoolError as exc:
        raise CliError(str(exc)) from None
    except RuntimeError as exc:
        raise CliError(
            f"the worker cannot connect to Temporal at {settings.address} "
            f"({str(exc).splitlines()[0]}); start it with `forklab up`"
        ) from None
    return 0


def cmd_up(args: argparse.Namespace) -> int:
    from forklab.activities.sandbox.jail import (
        bubblewrap,  # the sandbox modules: only `up` needs them
    )

    settings = settings_from(args)
    agent_settings(settings)  # a bad agent setting stops `up` before anything starts
    claim_ports(settings)  # and so does a port that something else holds
    server = ensure_server(settings)
    worker = ensure_worker(settings)
    agent_services = ensure_agent_services(settings)
    print(
        f"Temporal: {'started' if server else 'already running'} on {settings.address} "
        f"(data {settings.temporal_db})"
    )
    print(f"worker: {'started' if worker else 'already running'} (logs {settings.logs_dir})")
    bwrap, why_not = bubblewrap()
    if bwrap is None:
        then = (
            "sandboxes will run as confined processes and every report says what that does "
            "not protect"
            if settings.allow_unconfined_workloads
            else "the worker runs no workload code, so every experiment fails before approval "
            "(FORKLAB_ALLOW_UNCONFINED_WORKLOADS=1 accepts the confined-process fallback)"
        )
        print(f"forklab: warning: {why_not}; {then} (docs/sandboxes.md)", file=sys.stderr)
    print(f"agent runs: {'started ' + ', '.join(agent_services) if agent_services else 'running'}")
    print(f"Web UI: {settings.ui_url}")
    print("stop them with `forklab down`")
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
    add_connection_flags(p, ui=True, dev_server=True)
    p.set_defaults(func=cmd_server)

    p = sub.add_parser("worker", help="run a ForkLab worker (foreground)")
    p.add_argument("--max-sandboxes", type=int, help="sandboxes at once (FORKLAB_MAX_SANDBOXES)")
    add_version_flags(p)
    add_connection_flags(p)
    p.set_defaults(func=cmd_worker)

    p = sub.add_parser("up", help="start the dev server and a worker in the background")
    add_connection_flags(p, ui=True, dev_server=True)
    p.set_defaults(func=cmd_up)

    p = sub.add_parser("down", help="stop what `forklab up` started")
    add_connection_flags(p)
    p.set_defaults(func=cmd_down)
