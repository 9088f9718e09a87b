"""What every operator command shares: settings from flags/env, the client, the handle."""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

from temporalio.client import Client, WorkflowHandle
from temporalio.service import RPCError, RPCStatusCode

from forklab.errors import CliError
from workers import processes
from workers.config import ConfigError, Settings
from workers.server import child_env, pidfile
from workers.worker import connect
from workflows.experiment import ExperimentWorkflow
from workflows.messages import ExperimentResult, StatusView, workflow_id

_T = TypeVar("_T")


#: Settings that some commands take as flags (the workers: the last four).
_FLAGS = (
    "address",
    "namespace",
    "task_queue",
    "home",
    "ui_port",
    "max_sandboxes",
    "deployment",
    "build_id",
    "promote",
)


def settings_from(args: argparse.Namespace) -> Settings:
    """The settings from the command's flags and the environment; a bad one is bad input
    (exit 2, like a bad spec or flag), not a failure of the command."""
    flags = {name: getattr(args, name, None) for name in _FLAGS}
    try:
        return Settings.load(flags)
    except ConfigError as exc:
        raise CliError(str(exc), code=2) from None


def add_connection_flags(p: argparse.ArgumentParser, ui: bool = False) -> None:
    g = p.add_argument_group("connection (default: FORKLAB_* environment, then built-ins)")
    g.add_argument("--address", help="Temporal frontend host:port (FORKLAB_ADDRESS)")
    g.add_argument("--namespace", help="Temporal namespace (FORKLAB_NAMESPACE)")
    g.add_argument("--task-queue", dest="task_queue", help="task queue (FORKLAB_TASK_QUEUE)")
    g.add_argument("--home", type=Path, help="ForkLab home folder (FORKLAB_HOME, ~/.forklab)")
    if ui:
        g.add_argument("--ui-port", dest="ui_port", type=int, help="Web UI port (8233)")


def add_version_flags(p: argparse.ArgumentParser) -> None:
    """``forklab worker`` and ``agent-worker``: worker versioning (``workers.versioning``)."""
    g = p.add_argument_group("rolling upgrades (docs/deployment.md)")
    g.add_argument(
        "--deployment",
        help="worker deployment name: pin each run to this build (FORKLAB_DEPLOYMENT)",
    )
    g.add_argument(
        "--build-id",
        dest="build_id",
        help="this build's id (FORKLAB_BUILD_ID; default: a digest of ForkLab's code)",
    )
    g.add_argument(
        "--no-promote",
        dest="promote",
        action="store_const",
        const=False,
        help="leave the current build as it is (FORKLAB_PROMOTE=false); by default the "
        "newest build makes itself current, where new runs start",
    )


#: How long a background worker must stay alive after starting to count as started.
SETTLE_SECONDS = 2.0


def start_cli_worker(settings: Settings, command: str, what: str) -> bool:
    """Start ``forklab <command>`` in the background unless its pidfile names a live
    process; True if started. One that exits at once (a bad setting, no Temporal) is an
    error pointing at its log, ``<logs>/<command>.log``."""
    record = pidfile(settings, command)
    if processes.running(record):
        return False
    log = settings.logs_dir / f"{command}.log"
    argv = [sys.executable, "-m", "forklab.cli", command]
    processes.start_background(argv, record, log, child_env(settings))
    time.sleep(SETTLE_SECONDS)
    if not processes.running(record):
        raise CliError(f"{what} exited right after starting; see {log}")
    return True


def run(coro_fn: Callable[[], Awaitable[_T]]) -> _T:
    """Run one command's coroutine. The Temporal client it opens stays alive until the
    process ends: ``forklab.cli.main`` ends it without interpreter finalisation."""

    async def main() -> _T:
        return await coro_fn()

    return asyncio.run(main())


async def open_client(settings: Settings) -> Client:
    try:
        return await connect(settings)
    except RuntimeError as exc:
        raise CliError(
            f"cannot reach Temporal at {settings.address} ({str(exc).splitlines()[0]}); "
            "start it with `forklab up` or point FORKLAB_ADDRESS at your server"
        ) from None


async def experiment_handle(
    settings: Settings, experiment: str
) -> WorkflowHandle[ExperimentWorkflow, ExperimentResult]:
    client = await open_client(settings)
    handle = client.get_workflow_handle_for(ExperimentWorkflow.run, workflow_id(experiment))
    try:
        await handle.describe()
    except RPCError as exc:
        if exc.status is RPCStatusCode.NOT_FOUND:
            raise CliError(
                f"no experiment {experiment!r} (workflow {workflow_id(experiment)}) in namespace "
                f"{settings.namespace}; check the id with `temporal workflow list`"
            ) from None
        raise CliError(f"cannot look up experiment {experiment!r}: {exc.message}") from None
    return handle


async def query_status(handle: WorkflowHandle[Any, Any]) -> StatusView:
    try:
        return await handle.query(ExperimentWorkflow.status)
    except RPCError as exc:
        raise CliError(
            f"the experiment did not answer its status query ({exc.message}); "
            f"{await _which_worker(handle)}"
        ) from None


async def pinned_build(handle: WorkflowHandle[Any, Any]) -> tuple[str, str] | None:
    """The (deployment, build id) the run is pinned to; None if it is not versioned
    (docs/deployment.md, "Rolling upgrades") or cannot be described."""
    try:
        info = (await handle.describe()).raw_description.workflow_execution_info
    except RPCError:
        return None
    pinned = info.versioning_info.deployment_version
    return (pinned.deployment_name, pinned.build_id) if pinned.build_id else None


async def _which_worker(handle: WorkflowHandle[Any, Any]) -> str:
    """Which worker the run needs: one of the build it is pinned to, if it is pinned."""
    pinned = await pinned_build(handle)
    if pinned is None:
        return "is a ForkLab worker running (`forklab up`)?"
    deployment, build_id = pinned
    return (
        f"it runs on build {deployment}:{build_id} only; is a worker of that build running "
        f"(FORKLAB_DEPLOYMENT={deployment} FORKLAB_BUILD_ID={build_id} forklab worker)?"
    )
