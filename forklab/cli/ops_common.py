"""What every operator command shares: settings from flags/env, the client, the handle."""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from forklab.cli.errors import CliError
from forklab.workers import processes
from forklab.workers.config import ConfigError, Settings
from forklab.workers.server import child_env, pidfile, reachable

if TYPE_CHECKING:
    # Temporal's SDK loads in about half a second: a command imports it when it talks to
    # Temporal, after ``open_client`` found the server's port open (``forklab status``
    # against no server answers before it would have loaded).
    from temporalio.api.taskqueue.v1 import PollerInfo
    from temporalio.client import Client, WorkflowExecutionDescription, WorkflowHandle

    from forklab.workflows.experiment.messages import ExperimentResult, StatusView

_T = TypeVar("_T")


#: Settings that some commands take as flags (the workers: the last four).
FLAGS = (
    "address",
    "namespace",
    "task_queue",
    "home",
    "ui_port",
    "http_port",
    "metrics_port",
    "max_sandboxes",
    "deployment",
    "build_id",
    "promote",
)


def settings_from(args: argparse.Namespace) -> Settings:
    """The settings from the command's flags and the environment; a bad one is bad input
    (exit 2, like a bad spec or flag), not a failure of the command."""
    flags = {name: getattr(args, name, None) for name in FLAGS}
    try:
        return Settings.load(flags)
    except ConfigError as exc:
        raise CliError(str(exc), code=2) from None


def add_connection_flags(
    p: argparse.ArgumentParser, ui: bool = False, dev_server: bool = False
) -> None:
    g = p.add_argument_group("connection (default: FORKLAB_* environment, then built-ins)")
    g.add_argument("--address", help="Temporal frontend host:port (FORKLAB_ADDRESS)")
    g.add_argument("--namespace", help="Temporal namespace (FORKLAB_NAMESPACE)")
    g.add_argument("--task-queue", dest="task_queue", help="task queue (FORKLAB_TASK_QUEUE)")
    g.add_argument("--home", type=Path, help="ForkLab home folder (FORKLAB_HOME, ~/.forklab)")
    if ui:
        g.add_argument("--ui-port", dest="ui_port", type=int, help="Web UI port (8233)")
    if dev_server:
        g.add_argument(
            "--http-port",
            dest="http_port",
            type=int,
            help="the dev server's HTTP API port (FORKLAB_HTTP_PORT; default: address port + 10)",
        )
        g.add_argument(
            "--metrics-port",
            dest="metrics_port",
            type=int,
            help="the dev server's /metrics port (FORKLAB_METRICS_PORT; default: address "
            "port + 11)",
        )


def add_version_flags(p: argparse.ArgumentParser) -> None:
    """``forklab worker`` and ``agent-worker``: worker versioning
    (``forklab.workers.versioning``)."""
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
    process ends: ``forklab.cli.main.main`` ends it without interpreter finalisation."""

    async def main() -> _T:
        return await coro_fn()

    return asyncio.run(main())


def check_reachable(settings: Settings) -> None:
    """Refuse at once when nothing listens on the Temporal address: the SDK would load
    and then retry the connection before saying the same."""
    if not reachable(settings.host, settings.port):
        raise CliError(
            f"cannot reach Temporal at {settings.address} (nothing listens there); "
            "start it with `forklab up` or point FORKLAB_ADDRESS at your server"
        )


def command(
    fn: Callable[[argparse.Namespace], Awaitable[_T]],
) -> Callable[[argparse.Namespace], _T]:
    """A command's ``func``: its coroutine run on the parsed arguments."""
    return lambda args: run(lambda: fn(args))


async def open_client(settings: Settings) -> Client:
    check_reachable(settings)
    from forklab.workers.client import connect

    try:
        return await connect(settings)
    except RuntimeError as exc:
        raise _unreachable(settings, exc) from None


async def plain_client(settings: Settings) -> Client:
    """A client with the pydantic converter alone, for the run-fork commands: they start
    forks with the parent's raw input payloads, so they need neither an agent framework
    nor its converter (nor their import time)."""
    from temporalio.client import Client
    from temporalio.contrib.pydantic import pydantic_data_converter

    try:
        return await Client.connect(
            settings.address, namespace=settings.namespace, data_converter=pydantic_data_converter
        )
    except RuntimeError as exc:
        raise _unreachable(settings, exc) from None


def _unreachable(settings: Settings, exc: RuntimeError) -> CliError:
    return CliError(
        f"cannot reach Temporal at {settings.address} ({str(exc).splitlines()[0]}); "
        "start it with `forklab up` or point FORKLAB_ADDRESS at your server"
    )


async def experiment_handle(
    settings: Settings, experiment: str
) -> WorkflowHandle[Any, ExperimentResult]:
    """The experiment's workflow, by name: importing ``forklab.workflows.experiment.workflow``
    would import every activity of the worker. Its messages (pydantic models of the spec and the
    analysis, with numpy) are imported here, not with this module: the agent-run commands
    share the rest of it and need none of them."""
    client = await open_client(settings)
    from temporalio.service import RPCError, RPCStatusCode

    from forklab.workflows.experiment.messages import ExperimentResult, workflow_id

    handle = client.get_workflow_handle(workflow_id(experiment), result_type=ExperimentResult)
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


#: How long a status query may take before the command looks whether any worker polls.
QUICK_ANSWER_SECONDS = 2.0
#: A live worker polls its task queue again at least once a long poll (about a minute).
#: The server keeps listing a gone worker's poller for minutes, with the time it was last
#: seen: one not seen for longer than this is gone. (The server's clock against this
#: machine's: a skew of seconds does not matter here.)
POLLER_GONE = timedelta(minutes=2)


async def query_status(settings: Settings, handle: WorkflowHandle[Any, Any]) -> StatusView:
    """The run's status query. A query that no worker picks up waits out the server's
    ~30 s; if it has not answered at once and no worker that could answer it is seen
    polling, the command says so on stderr right away, and still waits: a worker that
    has just started may not be listed yet, and a query it answers is the truth."""
    from temporalio.client import WorkflowQueryFailedError
    from temporalio.service import RPCError

    from forklab.workflows.experiment.messages import (  # (see ``experiment_handle``)
        STATUS_QUERY,
        StatusView,
    )

    query = asyncio.ensure_future(handle.query(STATUS_QUERY, result_type=StatusView))
    try:
        done, _ = await asyncio.wait({query}, timeout=QUICK_ANSWER_SECONDS)
        if not done and (nobody := await _no_worker(settings, handle)) is not None:
            print(f"forklab: {nobody}; waiting for the status query", file=sys.stderr, flush=True)
        view: StatusView = await query
        return view
    except RPCError as exc:
        raise CliError(
            f"the experiment did not answer its status query ({exc.message}); "
            f"{_which_worker(await pinned_build(handle))}"
        ) from None
    except WorkflowQueryFailedError as exc:
        raise CliError(
            f"workflow {handle.id} refused ForkLab's status query ({str(exc).splitlines()[0]}); "
            "it is not a ForkLab experiment (`temporal workflow describe` says what it is)"
        ) from None
    finally:
        query.cancel()  # (nothing to cancel once it answered)


def live_pollers(
    pollers: Sequence[PollerInfo], now: datetime, build_id: str | None
) -> list[PollerInfo]:
    """The pollers that may still be polling: seen within ``POLLER_GONE`` of ``now`` and,
    for a run pinned to a build (``build_id``), of that build."""
    return [
        poller
        for poller in pollers
        if now - poller.last_access_time.ToDatetime(tzinfo=UTC) < POLLER_GONE
        and (build_id is None or poller.deployment_options.build_id == build_id)
    ]


async def workflow_pollers(client: Client, namespace: str, task_queue: str) -> list[PollerInfo]:
    """The workflow pollers the server lists for ``task_queue``. Two views: the plain one
    lists the task queue's root partition only, but with every worker deployment's
    pollers and their build; the enhanced one lists every partition, but not the pollers
    of worker deployments. A worker shows in at least one of them once its polls reach
    the server (a versioned one's within a long poll or so, when it polls the root)."""
    from temporalio.api.enums.v1 import DescribeTaskQueueMode, TaskQueueKind, TaskQueueType
    from temporalio.api.taskqueue.v1 import TaskQueue
    from temporalio.api.workflowservice.v1 import DescribeTaskQueueRequest

    queue = TaskQueue(name=task_queue, kind=TaskQueueKind.TASK_QUEUE_KIND_NORMAL)
    workflow = TaskQueueType.TASK_QUEUE_TYPE_WORKFLOW
    service = client.workflow_service
    plain = await service.describe_task_queue(
        DescribeTaskQueueRequest(namespace=namespace, task_queue=queue, task_queue_type=workflow)
    )
    enhanced = await service.describe_task_queue(
        DescribeTaskQueueRequest(
            namespace=namespace,
            task_queue=queue,
            api_mode=DescribeTaskQueueMode.DESCRIBE_TASK_QUEUE_MODE_ENHANCED,
            task_queue_types=[workflow],
            report_pollers=True,
        )
    )
    pollers = list(plain.pollers)
    for version in enhanced.versions_info.values():
        for info in version.types_info.values():
            pollers += info.pollers
    return pollers


async def _no_worker(settings: Settings, handle: WorkflowHandle[Any, Any]) -> str | None:
    """Why no worker seems able to answer the run's queries now, or None if one may (or
    the server cannot tell)."""
    from temporalio.service import RPCError

    try:
        description = await handle.describe()
        client = await open_client(settings)
        pollers = await workflow_pollers(client, settings.namespace, description.task_queue)
    except RPCError:
        return None
    pinned = _pinned(description)
    if live_pollers(pollers, datetime.now(UTC), pinned[1] if pinned else None):
        return None
    queue, minutes = description.task_queue, POLLER_GONE.total_seconds() / 60
    if pinned is None:
        return (
            f"no worker has polled task queue {queue!r} in the last {minutes:g} minutes; "
            "start one with `forklab up` (or `forklab worker` where Temporal is reachable)"
        )
    deployment, build_id = pinned
    return (
        f"the run is pinned to build {deployment}:{build_id}, and no worker of that build "
        f"has polled task queue {queue!r} in the last {minutes:g} minutes; start one with "
        f"FORKLAB_DEPLOYMENT={deployment} FORKLAB_BUILD_ID={build_id} forklab worker"
    )


def _pinned(description: WorkflowExecutionDescription) -> tuple[str, str] | None:
    info = description.raw_description.workflow_execution_info
    version = info.versioning_info.deployment_version
    return (version.deployment_name, version.build_id) if version.build_id else None


async def pinned_build(handle: WorkflowHandle[Any, Any]) -> tuple[str, str] | None:
    """The (deployment, build id) the run is pinned to; None if it is not versioned
    (docs/deployment.md, "Rolling upgrades") or cannot be described."""
    from temporalio.service import RPCError

    try:
        return _pinned(await handle.describe())
    except RPCError:
        return None


def _which_worker(pinned: tuple[str, str] | None) -> str:
    """Which worker the run needs: one of the build it is pinned to, if it is pinned."""
    if pinned is None:
        return "is a ForkLab worker running (`forklab up`)?"
    deployment, build_id = pinned
    return (
        f"it runs on build {deployment}:{build_id} only; is a worker of that build running "
        f"(FORKLAB_DEPLOYMENT={deployment} FORKLAB_BUILD_ID={build_id} forklab worker)?"
    )
