"""Fork agent runs from Python:
``await AgentLab(client, agent_settings).fork(ForkRequest(run=…, at_step=…))``.

The CLI commands (``forklab fork|steps|diff|trail|outcome|promote|watch``) are thin
shells around this class. A fork is a new workflow; the parent is only read.
"""

from __future__ import annotations

import asyncio
import getpass
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

from temporalio.client import (
    Client,
    WorkflowExecutionStatus,
    WorkflowFailureError,
    WorkflowHandle,
    WorkflowQueryFailedError,
    WorkflowQueryRejectedError,
)
from temporalio.exceptions import ApplicationError, FailureError
from temporalio.service import RPCError, RPCStatusCode

from forklab.activities.runfork.fork_start import (
    Fork,
    ForkError,
    ForkStarter,
    final_state,
    workspace_layer_at,
    workspace_layer_in,
    workspace_layers_named,
)
from forklab.activities.runfork.history_events import ClosedRuns, RunRecord, chain_steps
from forklab.activities.runfork.history_reads import RunNotFound, latest_start, read_chain
from forklab.activities.runfork.workspace import (
    agent_workspaces_root,
    collect_agent_layers,
    run_pins,
)
from forklab.activities.sandbox.workspace import GcResult, layer_lock
from forklab.activities.stores.fork_registry import ForkRegistry
from forklab.activities.stores.run_log import LogEvent, RunLog
from forklab.contracts.fork_request import ForkRequest
from forklab.contracts.runfork import FORK_POINT_QUERY, ForkPoint
from forklab.experiments.runfork import identity
from forklab.experiments.runfork.diff import StateDiff, diff_states, divergence_step
from forklab.experiments.runfork.fork_at import ForkAtError, not_forkable, resolve_at
from forklab.experiments.runfork.policy import DEFAULT_KEY, ToolPolicy, unknown_tools
from forklab.experiments.runfork.promotion import SiblingRun
from forklab.experiments.runfork.receipt import PrefixEvent
from forklab.experiments.runfork.steps import Step, StepOrigin, step_numbers
from forklab.workers.runfork.agent_config import AgentSettings
from forklab.workers.runfork.plugin import search_attributes_hint
from forklab.workers.stores import effect_ledger

__all__ = [
    "AgentLab",
    "Fork",
    "ForkError",
    "ForkRequest",
    "RunDiff",
    "final_state",
    "workspace_layer_at",
    "workspace_layer_in",
    "workspace_layers_named",
]

#: What a run does besides its steps that a fork's policies reach: ``forklab steps`` shows
#: them, and their names (local activity and child workflow types) are tools to name.
ACTING_KINDS = ("local activity", "child workflow")
#: How deep into children (and their children) the tools of a run are looked for, and how
#: many children are read at most.
_CHILD_DEPTH = 3
_MAX_CHILDREN = 100
_MAX_LISTED = 40


@dataclass
class Timeline:
    """What ``forklab steps`` shows: the steps, the other events and the forkable steps."""

    steps: list[Step]
    events: list[PrefixEvent]
    #: per step index: why a fork there is refused exactly (None: it forks exactly)
    not_forkable: dict[int, str | None]


@dataclass
class Promotion:
    """A promoted fork and what promoting it did to each sibling's run in Temporal."""

    winner: str
    siblings: dict[str, SiblingRun]

    @property
    def closed(self) -> list[str]:
        return list(self.siblings)


@dataclass
class RunDiff:
    a: str
    b: str
    common_ancestor: str | None
    divergence_step: int | None
    diff: StateDiff


#: How long one question to a fork about its fork point may wait for a worker to answer
#: (a closed fork with no worker polling its queue would otherwise hold the CLI).
_QUERY_TIMEOUT = timedelta(seconds=5)


class AgentLab:
    def __init__(self, client: Client, agent: AgentSettings) -> None:
        self.client = client
        self.agent = agent
        self.registry = ForkRegistry(agent.forks_path)
        self.run_log = RunLog(agent.run_log_path)
        self.ledger = effect_ledger(agent)
        self.runs = ClosedRuns()
        self.starter = ForkStarter(client, self.registry, agent.home, self.runs)

    async def chain(self, run: str) -> list[RunRecord]:
        return await read_chain(self.client, run)

    async def steps(self, run: str) -> list[Step]:
        return chain_steps(await self.chain(run))

    async def acting_calls(self, run: str) -> list[PrefixEvent]:
        """The run's local activities and child workflows, each after the step it followed."""
        return [e for rec in await self.chain(run) for e in rec.others if e.kind in ACTING_KINDS]

    async def tools(self, run: str) -> set[str]:
        """Every activity, local activity and child workflow type the run and its children
        (to a depth of 3, at most 100 children) called: what a tool policy may name."""
        found: set[str] = set()
        todo, read = [(run, 0)], 0
        while todo:
            wid, depth = todo.pop()
            try:
                chain = await self.chain(wid)
            except RunNotFound:
                if depth == 0:
                    raise
                continue  # a child gone with its retention: its parent's record still names it
            found.update(s.activity_type for s in chain_steps(chain))
            for e in (e for rec in chain for e in rec.others if e.kind in ACTING_KINDS):
                found.add(e.name)
                if e.child_id and depth < _CHILD_DEPTH and read < _MAX_CHILDREN:
                    todo.append((e.child_id, depth + 1))
                    read += 1
        found.discard("")
        return found

    async def resolve_at(self, run: str, at: str) -> tuple[str, int]:
        """A fork point by meaning (``failed``, ``tool:NAME[#k]``,
        ``last_model_call_before_failure``, ``step:N``) over ``run``'s steps: the point as
        resolved, and the step a fork there inherits up to."""
        try:
            point, at_step = resolve_at(at, await self.steps(run))
        except ForkAtError as exc:
            raise ForkError(str(exc)) from None
        return point.text, at_step

    async def timeline(self, run: str) -> Timeline:
        """``run``'s steps, the other events that reached it (timers, children, signals,
        updates, local activities) and why each step cannot be forked at exactly."""
        chain = await self.chain(run)
        refused: dict[int, str | None] = {}
        for rec in chain:
            refused.update(not_forkable(rec.steps, rec.others, rec.base_step))
        return Timeline(
            steps=chain_steps(chain),
            events=[e for rec in chain for e in rec.others],
            not_forkable=refused,
        )

    async def fork(self, request: ForkRequest) -> Fork:
        """Start the fork ``request`` asks for (``ForkStarter.fork``; ``ForkRequest`` says
        what each field does), after refusing a tool policy that names a tool the run
        never called; a namespace without ForkLab's search attributes is told how to add
        them."""
        if any(key != DEFAULT_KEY for key in request.tool_policies):
            await self._check_tools(request.run, dict(request.tool_policies))
        try:
            return await self.starter.fork(request)
        except RPCError as exc:
            if exc.status is RPCStatusCode.INVALID_ARGUMENT and "search attribute" in str(exc):
                raise ForkError(search_attributes_hint(self.client.namespace)) from None
            raise

    async def fork_point(self, fork: Fork, timeout: float = 30.0) -> ForkPoint | None:
        """Waits until ``fork`` is past its prefix (every inherited result and message
        handed over): its fork point, with the inherited calls it was served approximately
        and its build. ``ForkError`` with the fork's own sentence when it closed without
        completing before that (a prefix that diverged, an update it could not hand over);
        None when it has not got there within ``timeout`` seconds (no worker with the
        plugin polls its queue yet, or a long prefix)."""
        handle = fork.handle
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            status = (await handle.describe()).status
            closed = status not in (None, WorkflowExecutionStatus.RUNNING)
            try:  # a closed fork answers too (its history replayed): it may have failed live
                point = ForkPoint.model_validate(
                    await handle.query(FORK_POINT_QUERY, rpc_timeout=_QUERY_TIMEOUT)
                )
            except (RPCError, WorkflowQueryFailedError, WorkflowQueryRejectedError):
                point = None  # no workflow task has run yet
            if point is not None and point.reached:
                return point
            if closed and status is not WorkflowExecutionStatus.COMPLETED:
                raise ForkError(
                    f"fork {handle.id} did not get past its prefix: {await _why(handle)}"
                )
            if point is not None and closed:
                return point
            if loop.time() > deadline:
                return None
            await asyncio.sleep(0.05)

    async def _check_tools(self, run: str, policies: dict[str, ToolPolicy]) -> None:
        """Refuses a policy naming a tool the run never called (a misspelt name would leave
        that tool under the default policy: a charge meant to be blocked would run)."""
        tools = await self.tools(run)
        unknown = unknown_tools(policies, tools)
        if unknown:
            listed = sorted(tools)
            more = f" and {len(listed) - _MAX_LISTED} more" if len(listed) > _MAX_LISTED else ""
            raise ForkError(
                f"--tool-policy names {', '.join(repr(t) for t in unknown[:5])}, which run "
                f"{run!r} never called; its tools: {', '.join(listed[:_MAX_LISTED]) or 'none'}"
                f"{more}"
            )

    async def collect_layers(self, min_age_seconds: float) -> GcResult | None:
        """Remove the agent-run workspace layers nothing needs (None: this home has no
        agent layers). A run can be forked at any step for as long as Temporal keeps its
        history, so kept are every layer the history of a retained run names (each run
        that recorded a layer here, each fork with a receipt), each retained run's current
        layer (a call may have recorded it before its result reached the history) and
        the layer each retained fork's receipt says it started from. A run's record is
        dropped, and its layers become collectable, only once Temporal answers that its
        history is gone (the namespace's retention period has passed, or it was deleted).
        An error other than "not found" stops before anything is removed. Everything is
        read under the store's lock held exclusive: no fork records a receipt, and no call
        records a layer, meanwhile."""
        root = agent_workspaces_root(self.agent.home)
        if not (root / "layers").is_dir():
            return None
        async with layer_lock(root).hold_async(exclusive=True):
            return await self._collect_layers(root, min_age_seconds)

    async def _collect_layers(self, root: Path, min_age_seconds: float) -> GcResult:
        started_from = {
            r.fork_workflow_id: r.workspace_layer_sha256 for r in self.registry.receipts()
        }
        needed: set[str] = set()
        retained: set[str] = set()
        for wid in sorted({pin.workflow_id for pin in run_pins(root)} | set(started_from)):
            if await self._is_retained(wid):
                retained.add(wid)
                needed |= workspace_layers_named(await self.chain(wid))
                if (layer := started_from.get(wid)) is not None:
                    needed.add(layer)
        return collect_agent_layers(root, retained, needed, min_age_seconds)

    async def _is_retained(self, workflow_id: str) -> bool:
        """Whether Temporal still holds a history of ``workflow_id`` (open or closed)."""
        try:
            await self.client.get_workflow_handle(workflow_id).describe()
        except RPCError as exc:
            if exc.status is RPCStatusCode.NOT_FOUND:
                return False
            raise
        return True

    async def diff(self, a: str, b: str) -> RunDiff:
        chain_a, chain_b = await self.chain(a), await self.chain(b)
        lineage_a = [*(chain_a[0].receipt.lineage if chain_a[0].receipt else []), a]
        lineage_b = [*(chain_b[0].receipt.lineage if chain_b[0].receipt else []), b]
        common = None
        for x in lineage_a:
            if x in lineage_b:
                common = x
        sig_a = [_signature(s) for s in chain_steps(chain_a)]
        sig_b = [_signature(s) for s in chain_steps(chain_b)]
        return RunDiff(
            a=a,
            b=b,
            common_ancestor=common,
            divergence_step=divergence_step(sig_a, sig_b),
            diff=diff_states(final_state(chain_a), final_state(chain_b)),
        )

    async def trail(self, run: str) -> dict[str, Any]:
        chain = await self.chain(run)
        receipt = chain[0].receipt
        lineage = [*(receipt.lineage if receipt else []), run]
        receipts = [r for r in (self.registry.receipt(w) for w in lineage) if r is not None]
        decisions = [
            {**s.model_dump(include={"index", "activity_type", "origin", "status"})}
            for s in chain_steps(chain)
            if s.origin in (StepOrigin.replayed, StepOrigin.blocked)
        ]
        return {
            "run": run,
            "lineage": lineage,
            "receipts": [r.model_dump(mode="json") for r in receipts],
            "policy_decisions": decisions,
            "ledger": [
                e.model_dump(mode="json") for e in self.ledger.entries(await self.effect_scope(run))
            ],
            "decisions": self.registry.decisions(run),
            "closed_siblings": self.registry.closed_by(run),
            # what the fork's own history recorded once it ran (the receipt, written
            # before, never changes): the inherited calls served with a drifted input,
            # and the build that ran its first workflow task
            "drift": [
                d.approximation().model_dump(mode="json") for r in chain for d in r.inputs.drift
            ],
            "build_ran": chain[0].inputs.builds[0][1] if chain[0].inputs.builds else None,
        }

    def outcome(self, run: str, label: str, score: float | None, by: str | None = None) -> None:
        self.registry.record(run, "outcome", by or getpass.getuser(), label=label, score=score)

    async def promote(
        self, run: str, by: str | None = None, keep_running: bool = False
    ) -> Promotion:
        """Record ``run`` as the winner and close its siblings (forks of the same parent,
        and the parent itself): in the registry, and in Temporal, where a sibling still
        running has its cancellation requested (or, with ``keep_running``, is left
        running). Each sibling's ``closed`` row says which. Nothing is rewritten."""
        receipt = self.registry.receipt(run)
        if receipt is None:
            raise ForkError(f"{run!r} is not a fork ForkLab made; only forks can be promoted")
        siblings = [
            receipt.parent_workflow_id,
            *(
                r.fork_workflow_id
                for r in self.registry.children(receipt.parent_workflow_id)
                if r.fork_workflow_id != run
            ),
        ]
        runs = {s: await self._close_in_temporal(s, keep_running) for s in siblings}
        self.registry.promote(run, runs, by or getpass.getuser())
        return Promotion(winner=run, siblings=runs)

    async def _close_in_temporal(self, workflow_id: str, keep_running: bool) -> SiblingRun:
        try:
            if await self.is_closed(workflow_id):
                return SiblingRun.already_closed
        except RunNotFound:  # gone with its retention
            return SiblingRun.already_closed
        if keep_running:
            return SiblingRun.left_running
        try:
            await self.client.get_workflow_handle(workflow_id).cancel()
        except RPCError as exc:
            if exc.status is RPCStatusCode.NOT_FOUND:  # it closed meanwhile
                return SiblingRun.already_closed
            raise
        return SiblingRun.cancelled

    async def is_closed(self, run: str) -> bool:
        """Whether ``run``'s latest run has closed; ``RunNotFound`` if Temporal has no
        workflow ``run`` (a typo would otherwise watch an empty log for ever)."""
        try:
            desc = await self.client.get_workflow_handle(run).describe()
        except RPCError as exc:
            if exc.status is RPCStatusCode.NOT_FOUND:
                raise RunNotFound(f"no run {run!r} (no workflow has that id)") from None
            raise
        return desc.close_time is not None

    async def effect_scope(self, run: str) -> str:
        """The effect ledger's key of ``run``'s latest chain: this namespace and its lineage
        root (its fork marker's, else the chain's own), never the bare workflow id, which
        an earlier run of the same id, or a run in another namespace, may have used."""
        start = await latest_start(self.client, run)
        root = (
            start.marker.lineage_root
            if start.marker is not None
            else identity.lineage_root(run, start.first_run_id)
        )
        return identity.effect_scope(self.client.namespace, root)

    async def run_stream(self, run: str) -> str:
        """The run log stream of ``run``'s latest chain (``RunNotFound`` if none)."""
        start = await latest_start(self.client, run)
        return identity.run_stream(self.client.namespace, run, start.first_run_id)

    def watch(self, stream: str, after: int = -1, limit: int = 1000) -> list[LogEvent]:
        """Events of a stream from :meth:`run_stream` after offset ``after``."""
        return self.run_log.read(stream, after, limit)

    async def numbered(self, run: str, events: list[LogEvent]) -> list[dict[str, Any]]:
        """``events`` of ``run``'s log, each with the step number ``forklab steps`` gives
        its call now (``step``: None while the call is pending). The log records a call by
        its place in the scheduling order (``call``), all a worker knows when it starts;
        calls in parallel complete, and are numbered, in another order."""
        if not events:
            return []
        numbers = step_numbers(await self.steps(run))
        out = []
        for e in events:
            call = e.event.get("call")
            out.append({**e.event, "step": numbers.get(call) if isinstance(call, int) else None})
        return out


def _signature(s: Step) -> tuple[str, str, str | None, str]:
    """A step's call and outcome: two runs diverge where these first differ."""
    return (s.activity_type, s.input_sha256, s.result_sha256, s.status.value)


async def _why(handle: WorkflowHandle[Any, Any]) -> str:
    """The sentence a fork that closed without completing failed with."""
    try:
        await handle.result()
    except WorkflowFailureError as exc:
        cause = exc.cause
        while cause.__cause__ is not None and not isinstance(cause, ApplicationError):
            cause = cause.__cause__
        return cause.message if isinstance(cause, FailureError) else str(cause)
    return "it closed"
