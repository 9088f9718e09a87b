"""The agent-run services ``forklab up`` starts next to the dev server and the experiment
worker: the local model server and payments/mail service (unless real endpoints are
configured) and the agent worker; ``forklab down`` stops them."""

from __future__ import annotations

import argparse
import sys

from forklab.cli.errors import CliError
from forklab.cli.ops_common import (
    add_connection_flags,
    add_version_flags,
    run,
    settings_from,
    start_cli_worker,
)
from forklab.workers import processes
from forklab.workers.config import ConfigError, Settings
from forklab.workers.runfork.agent_config import AgentSettings
from forklab.workers.runfork.fork_issuers import registered_issuers
from forklab.workers.server import child_env, pidfile, reachable, wait_reachable

START_SECONDS = 20.0


def agent_settings(settings: Settings) -> AgentSettings:
    try:
        return AgentSettings.load(settings)
    except ConfigError as exc:
        raise CliError(str(exc), code=2) from None


def _ensure_http(settings: Settings, name: str, module: str, port: int, extra: list[str]) -> bool:
    if reachable("127.0.0.1", port):
        return False
    log = settings.logs_dir / f"{name}.log"
    argv = [sys.executable, "-m", module, "--port", str(port), *extra]
    processes.start_background(argv, pidfile(settings, name), log, child_env(settings))
    if not wait_reachable("127.0.0.1", port, START_SECONDS):
        processes.stop(pidfile(settings, name))
        raise CliError(f"the {name} did not start on port {port}; see {log}")
    return True


def ensure_agent_services(settings: Settings) -> list[str]:
    """Start what is missing; returns what was started."""
    agent = agent_settings(settings)
    started = []
    if agent.local_model and _ensure_http(
        settings,
        "model-server",
        "forklab.workers.runfork.model_server",
        agent.model_port,
        ["--seed", str(agent.model_seed)],
    ):
        started.append(f"model server ({agent.resolved_model_url})")
    if agent.local_effects and _ensure_http(
        settings,
        "effects-service",
        "forklab.workers.runfork.effects_service",
        agent.effects_port,
        [],
    ):
        started.append(f"payments/mail service ({agent.resolved_effects_url})")
    if start_cli_worker(settings, "agent-worker", "the agent worker"):
        started.append(f"agent worker (task queue {agent.agent_task_queue})")
    return started


def stop_agent_services(settings: Settings) -> list[str]:
    stopped = []
    for name in ("agent-worker", "model-server", "effects-service"):
        if processes.stop(pidfile(settings, name)):
            stopped.append(name)
    return stopped


def cmd_agent_worker(args: argparse.Namespace) -> int:
    settings = settings_from(args)
    agent = agent_settings(settings)
    try:
        registered_issuers()  # a fork issuers setting that is no such thing stops it now
    except ConfigError as exc:
        raise CliError(str(exc), code=2) from None
    print(
        f"ForkLab agent worker: task queue {agent.agent_task_queue} on {settings.address}, "
        f"model {agent.resolved_model_url}; Ctrl-C stops it",
        flush=True,
    )
    from forklab.workers.runfork.agent_worker import (
        run_agent_worker,  # the agent framework loads slowly
    )

    try:
        run(lambda: run_agent_worker(settings, agent))
    except RuntimeError as exc:
        raise CliError(
            f"the agent worker cannot connect to Temporal at {settings.address} "
            f"({str(exc).splitlines()[0]}); start it with `forklab up`"
        ) from None
    return 0


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("agent-worker", help="run the agent-run worker (foreground)")
    add_version_flags(p)
    add_connection_flags(p)
    p.set_defaults(func=cmd_agent_worker)
