"""``ForkLabPlugin``: the one line that makes a Temporal worker fork-capable.

``Worker(client, task_queue=q, ..., plugins=[ForkLabPlugin()])`` gets, through the SDK's
plugin interface (``temporalio.plugin.SimplePlugin``):

- the fork interceptor (serves a fork's inherited steps from its parent's history) and
  the run-context interceptor (lineage headers for the effect ledger, the run log
  ``forklab watch`` reads);
- the fork activities (``forklab.verify_fork``, ``forklab.fetch_prefix``,
  ``forklab.step_decision``), the first of which serves a fork only when its marker is
  signed by an issuer the worker trusts (``forklab.workers.runfork.fork_issuers``);
- a team fork's coordinator (``forklab.workflows.runfork.team_fork``) and its activities,
  on every worker that runs workflows: ``forklab fork-team`` starts it on the fork queue
  of the member it forks, where it starts every member's fork held and releases them all
  together (or none);
- a second worker with the same configuration on ``q@forklab``: forks start there, so a
  worker without the plugin (a forgotten one, a rolling deploy) never picks one up and
  re-runs its inherited steps live as an ordinary run;
- ForkLab's search attributes, registered on the namespace when the worker starts (where
  the cluster does not allow that, the worker says which to create and how).

A ``Replayer`` with the plugin gets the fork interceptor, so it replays forks too.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from pathlib import Path

from temporalio.api.enums.v1 import IndexedValueType
from temporalio.api.operatorservice.v1 import (
    AddSearchAttributesRequest,
    ListSearchAttributesRequest,
)
from temporalio.client import Client
from temporalio.plugin import SimplePlugin
from temporalio.service import RPCError
from temporalio.worker import ReplayerConfig, Worker, WorkerConfig

from forklab.activities.runfork.fork_activities import ForkActivities
from forklab.activities.runfork.run_context import RunContextInterceptor
from forklab.activities.runfork.team_forks import TeamForkActivities
from forklab.activities.stores.run_log import RunLog
from forklab.contracts.runfork import FORK_QUEUE_SUFFIX, fork_task_queue
from forklab.workers.config import Settings
from forklab.workers.runfork.agent_config import AgentSettings
from forklab.workers.runfork.fork_issuers import registered_issuers
from forklab.workflows.runfork.finite_payloads import FinitePayloads
from forklab.workflows.runfork.interceptor import ForkInterceptor
from forklab.workflows.runfork.search_attributes import RUN_FORK_KEYS
from forklab.workflows.runfork.team_fork import TeamForkWorkflow

PLUGIN_NAME = "forklab.ForkLabPlugin"
_log = logging.getLogger(__name__)


class SearchAttributesMissing(RuntimeError):
    """ForkLab's search attributes are not on the namespace and cannot be added from here."""


def search_attributes_hint(namespace: str) -> str:
    """The one sentence that says which search attributes to create, and how."""
    names = ", ".join(key.name for key in RUN_FORK_KEYS)
    commands = "; ".join(
        f"temporal operator search-attribute create --namespace {namespace} "
        f"--name {key.name} --type Keyword"
        for key in RUN_FORK_KEYS
    )
    return (
        f"ForkLab needs the Keyword search attributes {names} on namespace {namespace!r} "
        f"and cannot add them from this client; create them once with: {commands}"
    )


async def ensure_search_attributes(client: Client) -> None:
    """Register ForkLab's search attributes on the client's namespace when missing;
    ``SearchAttributesMissing`` (with :func:`search_attributes_hint`) where the server
    does not let this client list or add them (Temporal Cloud, restricted operators)."""
    try:
        known = await client.operator_service.list_search_attributes(
            ListSearchAttributesRequest(namespace=client.namespace)
        )
        missing = {
            key.name: IndexedValueType.INDEXED_VALUE_TYPE_KEYWORD
            for key in RUN_FORK_KEYS
            if key.name not in known.custom_attributes
        }
        if missing:
            await client.operator_service.add_search_attributes(
                AddSearchAttributesRequest(namespace=client.namespace, search_attributes=missing)
            )
    except RPCError as exc:
        raise SearchAttributesMissing(search_attributes_hint(client.namespace)) from exc


def _default_home() -> Path:
    return AgentSettings.load(Settings.load()).home


class ForkLabPlugin(SimplePlugin):
    """Add to every worker that runs (or replays) workflows that may be forked, and to the
    ``Replayer`` that replays them.

    ``run_log``: the run log file ``forklab watch`` reads (default: ``runlog.sqlite`` in
    ``home``). ``home``: the ForkLab home whose fork issuer key the worker trusts when
    ``FORKLAB_FORK_ISSUERS`` names no issuers (default: the run log's folder when
    ``run_log`` is given, else ``FORKLAB_HOME``). ``fork_queue``: also poll the fork
    queue ``<task queue>@forklab`` (default). Turn it off only for a worker that runs
    ordinary runs and never forks. ``strict_payloads``: refuse workflow inputs, signals,
    updates and activity inputs holding a non-finite number or nested too deeply
    (``forklab.workflows.runfork.finite_payloads``); ForkLab's own agent workers turn it
    on, a user's worker keeps its own rule by default.
    """

    def __init__(
        self,
        run_log: Path | str | None = None,
        *,
        home: Path | str | None = None,
        fork_queue: bool = True,
        strict_payloads: bool = False,
    ) -> None:
        super().__init__(PLUGIN_NAME)
        self._run_log = Path(run_log).expanduser() if run_log is not None else None
        if home is not None:
            self._home = Path(home).expanduser()
        else:
            self._home = self._run_log.parent if self._run_log is not None else _default_home()
        self._issuers = registered_issuers()
        self._fork_queue = fork_queue
        self._strict_payloads = strict_payloads
        self._registered: set[tuple[int, str]] = set()

    def configure_worker(self, config: WorkerConfig) -> WorkerConfig:
        config = super().configure_worker(config)
        forks = ForkActivities(config["client"], self._home, self._issuers)
        config["activities"] = [
            *config.get("activities", []),
            forks.verify_fork,
            forks.fetch_prefix,
            forks.step_decision,
            forks.record_drift,
        ]
        if config.get("workflows"):
            teams = TeamForkActivities(config["client"], self._home)
            config["workflows"] = [*config["workflows"], TeamForkWorkflow]
            config["activities"] = [
                *config["activities"],
                teams.fork_members,
                teams.abort_members,
            ]
        log = RunLog(self._run_log or self._home / "runlog.sqlite")
        # first in the list: the outbound interceptor listed last runs first, so the fork
        # mechanism sees a call as the worker's own interceptors leave it (LangGraphInputs
        # steadies node inputs before they are matched)
        # the finite check first: the inbound interceptor listed first sees a call first
        config["interceptors"] = [
            *([FinitePayloads()] if self._strict_payloads else []),
            ForkInterceptor(),
            RunContextInterceptor(log),
            *config.get("interceptors", []),
        ]
        return config

    def configure_replayer(self, config: ReplayerConfig) -> ReplayerConfig:
        config = super().configure_replayer(config)
        config["interceptors"] = [
            *([FinitePayloads()] if self._strict_payloads else []),
            ForkInterceptor(),
            *config.get("interceptors", []),
        ]
        return config

    async def run_worker(self, worker: Worker, next: Callable[[Worker], Awaitable[None]]) -> None:
        await self._register(worker.client)
        queue = worker.task_queue
        if not self._fork_queue or queue.endswith(FORK_QUEUE_SUFFIX):
            await next(worker)
            return
        # the same worker (the initial configuration, so every plugin applies once) on the
        # fork queue; it stops when this one does
        config = worker.config()
        config["task_queue"] = fork_task_queue(queue)
        sibling = Worker(**config)
        async with sibling:
            await next(worker)

    async def _register(self, client: Client) -> None:
        """Once per client and namespace: a missing attribute is logged with the sentence
        that says how to create it, and the worker runs (ordinary runs do not need them;
        ``forklab fork`` refuses with the same sentence)."""
        key = (id(client), client.namespace)
        if key in self._registered:
            return
        try:
            await ensure_search_attributes(client)
        except SearchAttributesMissing as exc:
            _log.warning("%s", exc)
            return
        self._registered.add(key)
