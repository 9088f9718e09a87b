"""Fork agent runs from Python: ``await AgentLab(client, agent_settings).fork(run, at_step=…)``.

The CLI commands (``forklab fork|steps|diff|trail|outcome|promote|watch``) are thin
shells around this class. A fork is a new workflow; the parent is only read.
"""

from __future__ import annotations

import getpass
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.service import RPCError, RPCStatusCode

from forklab.activities.runfork.fork_start import (
    Fork,
    ForkError,
    ForkStarter,
    final_state,
    workspace_layer_at,
    workspace_layer_in,
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
from forklab.experiments.runfork import identity
from forklab.experiments.runfork.diff import StateDiff, diff_states, divergence_step
from forklab.experiments.runfork.policy import ToolPolicy
from forklab.experiments.runfork.receipt import BoundaryMode
from forklab.experiments.runfork.steps import Step, StepOrigin
from forklab.workers.runfork.agent_config import AgentSettings
from forklab.workers.runfork.plugin import search_attributes_hint
from forklab.workers.stores import effect_ledger

__all__ = [
    "AgentLab",
    "Fork",
    "ForkError",
    "RunDiff",
    "final_state",
    "workspace_layer_at",
    "workspace_layer_in",
]


@dataclass
class RunDiff:
    a: str
    b: str
    common_ancestor: str | None
    divergence_step: int | None
    diff: StateDiff


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

    async def fork(
        self,
        run: str,
        at_step: int,
        *,
        name: str | None = None,
        intervention: dict[str, Any] | None = None,
        model: str | None = None,
        tool_policies: dict[str, ToolPolicy] | None = None,
        boundary: BoundaryMode = BoundaryMode.exact,
        requested_by: str | None = None,
    ) -> Fork:
        """Start a fork of ``run`` that inherits steps 1..at_step and continues live
        (``ForkStarter.fork``); a namespace without ForkLab's search attributes is told
        how to add them."""
        try:
            return await self.starter.fork(
                run,
                at_step,
                name=name,
                intervention=intervention,
                model=model,
                tool_policies=tool_policies,
                boundary=boundary,
                requested_by=requested_by,
            )
        except RPCError as exc:
            if exc.status is RPCStatusCode.INVALID_ARGUMENT and "search attribute" in str(exc):
                raise ForkError(search_attributes_hint(self.client.namespace)) from None
            raise

    async def collect_layers(self, min_age_seconds: float) -> GcResult | None:
        """Remove the agent-run workspace layers nothing needs (None: this home has no
        agent layers): kept are each open run's current layer and each layer a recorded
        fork receipt names. Whether a run is open is asked of Temporal; an error other
        than "not found" stops before anything is removed. An open fork's current layer
        is read from its history: a write its policy served from the parent's record ran
        no tool, so it recorded no pin. Everything is read under the store's lock held
        exclusive: no fork records a receipt, and no call records a layer, meanwhile."""
        root = agent_workspaces_root(self.agent.home)
        if not (root / "layers").is_dir():
            return None
        async with layer_lock(root).hold_async(exclusive=True):
            return await self._collect_layers(root, min_age_seconds)

    async def _collect_layers(self, root: Path, min_age_seconds: float) -> GcResult:
        receipts = self.registry.receipts()
        needed = {r.workspace_layer_sha256 for r in receipts if r.workspace_layer_sha256}
        open_runs: set[str] = set()
        for wid in {pin.workflow_id for pin in run_pins(root)}:
            if await self._is_open(wid):
                open_runs.add(wid)
        for r in receipts:
            if await self._is_open(r.fork_workflow_id):
                current = workspace_layer_at(await self.steps(r.fork_workflow_id))
                if current is not None:
                    needed.add(current)
        return collect_agent_layers(root, open_runs, needed, min_age_seconds)

    async def _is_open(self, workflow_id: str) -> bool:
        try:
            desc = await self.client.get_workflow_handle(workflow_id).describe()
        except RPCError as exc:
            if exc.status is RPCStatusCode.NOT_FOUND:
                return False
            raise
        return desc.status is WorkflowExecutionStatus.RUNNING

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
        }

    def outcome(self, run: str, label: str, score: float | None, by: str | None = None) -> None:
        self.registry.record(run, "outcome", by or getpass.getuser(), label=label, score=score)

    async def promote(self, run: str, by: str | None = None) -> list[str]:
        """Record ``run`` as the winner and close its siblings (forks of the same parent,
        and the parent itself); returns the closed ones. Nothing is rewritten."""
        receipt = self.registry.receipt(run)
        if receipt is None:
            raise ForkError(f"{run!r} is not a fork ForkLab made; only forks can be promoted")
        siblings = [
            r.fork_workflow_id
            for r in self.registry.children(receipt.parent_workflow_id)
            if r.fork_workflow_id != run
        ]
        closed = [receipt.parent_workflow_id, *siblings]
        self.registry.promote(run, closed, by or getpass.getuser())
        return closed

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


def _signature(s: Step) -> tuple[str, str, str | None, str]:
    """A step's call and outcome: two runs diverge where these first differ."""
    return (s.activity_type, s.input_sha256, s.result_sha256, s.status.value)
