"""Fork agent runs from Python: ``await AgentLab(client, agent_settings).fork(run, at_step=…)``.

The CLI commands (``forklab fork|steps|diff|trail|outcome|promote|watch``) are thin
shells around this class. A fork is a new workflow; the parent is only read.
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import getpass
import json
import re
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from temporalio.api.common.v1 import Payload
from temporalio.client import (
    Client,
    WorkflowHandle,
)
from temporalio.common import (
    RawValue,
    SearchAttributePair,
    TypedSearchAttributes,
    WorkflowIDReusePolicy,
)
from temporalio.exceptions import WorkflowAlreadyStartedError
from temporalio.service import RPCError, RPCStatusCode

from forklab.activities.runfork.fork_keys import issuer_key
from forklab.activities.runfork.history_events import (
    ClosedRuns,
    RunRecord,
    chain_steps,
    digest_payloads,
)
from forklab.activities.runfork.history_reads import (
    RunNotFound,
    latest_start,
    locate_step,
    read_chain,
)
from forklab.activities.runfork.overrides import override_b64
from forklab.activities.runfork.workspace import (
    agent_workspaces_root,
    collect_agent_layers,
    run_pins,
)
from forklab.activities.sandbox.workspace import GcResult, LayerStore, WorkspaceError, layer_lock
from forklab.activities.stores.fork_registry import ForkRegistry
from forklab.activities.stores.run_log import LogEvent, RunLog
from forklab.contracts.fork_signature import sign_marker
from forklab.contracts.runfork import (
    MARKER_MEMO_KEY,
    RECEIPT_MEMO_KEY,
    WORKSPACE_LAYER_FIELD,
    ForkMarker,
    ModelSwap,
    fork_task_queue,
)
from forklab.experiments.runfork import identity
from forklab.experiments.runfork.call_match import keyed
from forklab.experiments.runfork.diff import StateDiff, diff_states, divergence_step
from forklab.experiments.runfork.fork_at import ForkAtError, not_forkable, resolve_at
from forklab.experiments.runfork.overrides import (
    ForkSignal,
    InputOverride,
    ResultOverride,
    overridden,
)
from forklab.experiments.runfork.policy import DEFAULT_KEY, ToolPolicy, unknown_tools
from forklab.experiments.runfork.promotion import SiblingRun
from forklab.experiments.runfork.receipt import (
    BoundaryError,
    BoundaryMode,
    ForkReceipt,
    PrefixEvent,
    ends_its_run,
    fork_summary,
    make_receipt,
    receipt_markdown,
    resolve_boundary,
)
from forklab.experiments.runfork.steps import Step, StepOrigin, StepStatus
from forklab.workers.runfork.agent_config import AgentSettings
from forklab.workers.runfork.plugin import search_attributes_hint
from forklab.workers.runfork.start_links import forked_from, with_start_links
from forklab.workers.stores import effect_ledger
from forklab.workflows.runfork.search_attributes import BOUNDARY, LINEAGE_ROOT, PARENT, RUN

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:/-]{0,199}$")
#: What a run does besides its steps that a fork's policies reach: ``forklab steps`` shows
#: them, and their names (local activity and child workflow types) are tools to name.
ACTING_KINDS = ("local activity", "child workflow")
#: How deep into children (and their children) the tools of a run are looked for, and how
#: many children are read at most.
_CHILD_DEPTH = 3
_MAX_CHILDREN = 100
_MAX_LISTED = 40


class ForkError(ValueError):
    """A fork request that cannot be honoured; the message says which field and why."""


@dataclass
class Fork:
    receipt: ForkReceipt
    handle: WorkflowHandle[Any, Any]


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


def _step_layer(step: Step) -> str | None:
    """The workspace layer ``step``'s recorded result reports (None: none)."""
    if step.result_b64 is None:
        return None
    payload = Payload.FromString(base64.b64decode(step.result_b64))
    try:
        result = json.loads(payload.data)
    except ValueError:
        return None
    if isinstance(result, dict) and isinstance(result.get(WORKSPACE_LAYER_FIELD), str):
        return str(result[WORKSPACE_LAYER_FIELD])
    return None


def workspace_layer_at(prefix: list[Step]) -> str | None:
    """The workspace layer the last step of ``prefix`` that reported one returned."""
    for step in reversed(prefix):
        if (layer := _step_layer(step)) is not None:
            return layer
    return None


def workspace_layers_named(chain: list[RunRecord]) -> set[str]:
    """Every workspace layer a chain's history names — each step's result (served steps
    of a fork included) and each run's recorded input: the layers a fork of it at any
    step may start from."""
    named = {layer for run in chain if (layer := workspace_layer_in(run.input)) is not None}
    return named | {layer for s in chain_steps(chain) if (layer := _step_layer(s)) is not None}


def workspace_layer_in(inputs: list[Payload]) -> str | None:
    """The workspace layer a run's recorded input carries: ``workspace_layer`` in its first
    argument, or in an object one level inside it (an agent's state handed over whole).
    This is how a run continued-as-new starts from its predecessor's files, and so the
    layer in effect at a step when no step of its own run wrote one yet."""
    if not inputs:
        return None
    try:
        value = json.loads(inputs[0].data)
    except ValueError:
        return None
    if not isinstance(value, dict):
        return None
    for obj in (value, *(v for v in value.values() if isinstance(v, dict))):
        layer = obj.get(WORKSPACE_LAYER_FIELD)
        if isinstance(layer, str):
            return layer
    return None


def _check_overridable(steps: list[Step], at_step: int) -> None:
    """Step ``at_step`` must be one of ``steps`` with a recorded outcome to replace."""
    step = next((s for s in steps if s.index == at_step), None)
    if step is None:
        raise ForkError(f"--override-result {at_step}: the run has no step {at_step}")
    if step.status not in (StepStatus.completed, StepStatus.failed):
        raise ForkError(
            f"--override-result {at_step}: step {at_step} ({step.activity_type}) is "
            f"{step.status.value}; only a completed or failed step's result can be replaced"
        )


def _input_override(
    steps: list[Step], at_step: int, step: int, value: Any, boundary: BoundaryMode
) -> InputOverride:
    """The parent's step ``step`` (which must come right after the boundary, in the run
    holding it) by what it is, to run live with ``value`` as its input."""
    if step != at_step + 1:
        raise ForkError(
            f"--override-input names step {step} but the fork is at step {at_step}; it "
            f"changes the step right after the boundary (fork at {step - 1})"
        )
    if boundary is BoundaryMode.lineage_only:
        raise ForkError("--override-input needs an inherited prefix; lineage_only has none")
    for key, s in keyed(steps, with_input=boundary is BoundaryMode.exact).items():
        if s.index == step:
            return InputOverride(
                step=step,
                value=value,
                activity_type=s.activity_type,
                input_sha256=s.input_sha256,
                ordinal=key.ordinal,
            )
    raise ForkError(f"--override-input {step}: the run holding step {at_step} has no step {step}")


def final_state(chain: list[RunRecord]) -> Any:
    close = chain[-1].close
    if "result" in close:
        return close["result"]
    return close.get("details")


class AgentLab:
    def __init__(self, client: Client, agent: AgentSettings) -> None:
        self.client = client
        self.agent = agent
        self.registry = ForkRegistry(agent.forks_path)
        self.run_log = RunLog(agent.run_log_path)
        self.ledger = effect_ledger(agent)
        self.runs = ClosedRuns()

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
        point: str | None = None,
        result_override: ResultOverride | None = None,
        input_override: tuple[int, Any] | None = None,
        signals: list[ForkSignal] | None = None,
    ) -> Fork:
        """Start a fork of ``run`` that inherits steps 1..at_step and continues live.

        When the run keeps a workspace, the fork's files start from the layer step
        ``at_step`` left (verified first; a damaged layer refuses the fork), recorded in
        the receipt's ``workspace_layer_sha256``. ``point`` records the fork point by
        meaning ``at_step`` was resolved from (:meth:`resolve_at`). ``result_override``
        (``make_override``) serves the fork its JSON as step ``at_step``'s result;
        ``input_override`` (step, JSON) runs that step, ``at_step + 1``, live with the JSON
        as its input; ``signals`` reach the workflow's handlers at the fork point."""
        fork_id = name or f"{run}--fork-{uuid.uuid4().hex[:8]}"
        if not _NAME.match(fork_id):
            raise ForkError(
                f"fork name {fork_id!r}: use 1-200 letters, digits and . _ : / - "
                "(starting with a letter or digit)"
            )
        if self.registry.receipt(fork_id) is not None:
            raise ForkError(f"fork name {fork_id!r} is taken by an earlier fork; choose another")
        policies = dict(tool_policies or {})
        policies.setdefault(DEFAULT_KEY, ToolPolicy.auto)
        if signals and boundary is BoundaryMode.lineage_only:
            raise ForkError("--signal is delivered at the fork point; lineage_only has none")
        if result_override is not None and boundary is BoundaryMode.lineage_only:
            raise ForkError("--override-result needs an inherited prefix; lineage_only has none")
        if result_override is not None and result_override.step != at_step:
            raise ForkError(
                f"--override-result names step {result_override.step} but the fork is at "
                f"step {at_step}; an override replaces the result of the fork's last step"
            )
        located = await locate_step(self.client, run, at_step, self.registry, self.runs)
        if len(policies) > 1:
            await self._check_tools(run, policies)
        source = located.source
        override_b = override_b64(result_override) if result_override is not None else ""
        if result_override is not None:
            _check_overridable(source.steps, at_step)
            source = dataclasses.replace(
                source, steps=overridden(source.steps, result_override, override_b)
            )
        asked = (
            _input_override(source.steps, at_step, *input_override, boundary)
            if input_override is not None
            else None
        )
        try:
            resolution = resolve_boundary(
                source.steps,
                source.others,
                at_step,
                boundary,
                base_step=source.base_step,
            )
        except BoundaryError as exc:
            raise ForkError(str(exc)) from None
        prefix_layer = workspace_layer_at(resolution.prefix)
        # where the fork starts: the recorded input of the run holding the boundary (its
        # earlier steps served from that run's history), or — when the boundary ends a run
        # that continued-as-new — the next run's recorded input, a checkpoint at the
        # boundary itself: nothing is served and the parent's continue-as-new (which the
        # server may delay) is not repeated
        start_run, start_input, base_step = source.run_id, source.input, source.base_step
        nxt = located.next_run
        if (
            boundary is not BoundaryMode.lineage_only
            and result_override is None  # the next run's input holds the recorded result
            and asked is None
            and nxt is not None
            and ends_its_run(resolution, source.steps, source.others)
        ):
            start_run, start_input, base_step = nxt.run_id, nxt.input, resolution.resolved_step
            resolution = resolution.model_copy(update={"prefix": []})  # nothing is served
        # from checking the layer until the receipt names it: `layers gc` reads the
        # receipts under the same lock, so it cannot remove the layer in between
        async with self._referencing_layers():
            # the layer in effect at the boundary: the last one a step up to it returned, else
            # the one the fork's start input carries (written earlier in the chain)
            layer = (
                self._checked_layer(prefix_layer or workspace_layer_in(start_input), at_step)
                if boundary is not BoundaryMode.lineage_only
                else None
            )
            parent_receipt, first_marker = located.receipt, located.marker
            lineage = [*(parent_receipt.lineage if parent_receipt else []), run]
            receipt = make_receipt(
                resolution,
                fork_workflow_id=fork_id,
                name=name or fork_id,
                parent_workflow_id=run,
                parent_run_id=located.latest_run_id,
                source_run_id=start_run,
                base_step=base_step,
                source_input_sha256=digest_payloads(start_input),
                lineage=lineage,
                boundary=boundary,
                intervention=intervention,
                model=model,
                tool_policies=policies,
                requested_by=requested_by or getpass.getuser(),
                created_at=datetime.now(UTC),
                workspace_layer_sha256=layer,
                requested_point=point,
                result_override=result_override,
                input_override=asked,
                signals=signals,
            )
            inherited_swaps = [
                swap
                for swap in (first_marker.model_swaps if first_marker else [])
                if swap.after_step < at_step
            ]
            own_swap = [ModelSwap(after_step=at_step, model=model)] if model is not None else []
            marker = ForkMarker(
                parent_workflow_id=run,
                source_run_id=start_run,
                base_step=base_step,
                at_step=resolution.resolved_step
                if boundary is not BoundaryMode.lineage_only
                else 0,
                boundary=boundary,
                lineage_root=first_marker.lineage_root
                if first_marker is not None
                else identity.lineage_root(run, located.source.first_run_id),
                model=model,
                model_swaps=inherited_swaps + own_swap,
                tool_policies=policies,
                intervention=intervention,
                fork_workflow_id=fork_id,
                start_input_sha256=digest_payloads(start_input),
                issued_at=datetime.now(UTC),
                result_override=result_override,
                input_override=asked,
                signals=signals or [],
            )
            # signed with this home's issuer key: a worker serves the parent's steps (and
            # the lineage's effects) only to a marker an issuer it trusts made for this run
            marker = sign_marker(marker, issuer_key(self.agent.home))
            try:
                handle = await self._start(source, start_input, marker, receipt)
            except WorkflowAlreadyStartedError:
                raise ForkError(
                    f"fork name {fork_id!r} is the id of an existing workflow; choose another"
                ) from None
            try:
                self.registry.add_receipt(receipt)
            except BaseException:
                # a fork without its receipt would be promoted, diffed and collected as
                # something else: stop it rather than leave it half-recorded
                await handle.terminate("forklab fork could not record the fork's receipt")
                raise
        return Fork(receipt=receipt, handle=handle)

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

    async def _start(
        self,
        source: RunRecord,
        start_input: list[Payload],
        marker: ForkMarker,
        receipt: ForkReceipt,
    ) -> WorkflowHandle[Any, Any]:
        """Start the fork under a workflow id never used before: not as a second run of a
        closed workflow (an unrelated run's or an earlier fork's), whose history ``steps``,
        ``diff`` and ``promote`` would then read as this fork's. It starts on the fork
        queue of the parent's (``<queue>@forklab``), which only ``ForkLabPlugin`` workers
        poll: no worker without the fork interceptor can run it as an ordinary run."""
        try:
            return await self._start_workflow(source, start_input, marker, receipt)
        except RPCError as exc:
            if exc.status is RPCStatusCode.INVALID_ARGUMENT and "search attribute" in str(exc):
                raise ForkError(search_attributes_hint(self.client.namespace)) from None
            raise

    async def _start_workflow(
        self,
        source: RunRecord,
        start_input: list[Payload],
        marker: ForkMarker,
        receipt: ForkReceipt,
    ) -> WorkflowHandle[Any, Any]:
        fork_id, parent = receipt.fork_workflow_id, marker.parent_workflow_id
        boundary = marker.boundary.value
        # the model the fork's calls after the boundary use: its own swap, else one it
        # inherits from the forks before it (None: the workflow's own choice)
        model = marker.model_at(receipt.requested_step + 1)
        # linked to the run it starts from: the Web UI shows that on its first event
        link = forked_from(self.client.namespace, parent, marker.source_run_id)
        return await with_start_links(self.client, [link]).start_workflow(
            source.workflow_type,
            args=[RawValue(p) for p in start_input],
            id=fork_id,
            id_reuse_policy=WorkflowIDReusePolicy.REJECT_DUPLICATE,
            task_queue=fork_task_queue(source.task_queue),
            memo={
                MARKER_MEMO_KEY: marker.model_dump(mode="json"),
                RECEIPT_MEMO_KEY: receipt.model_dump(mode="json"),
            },
            search_attributes=TypedSearchAttributes(
                [
                    SearchAttributePair(RUN, fork_id),
                    SearchAttributePair(PARENT, parent),
                    SearchAttributePair(LINEAGE_ROOT, marker.lineage_root),
                    SearchAttributePair(BOUNDARY, boundary),
                ]
            ),
            static_summary=fork_summary(receipt, model),
            static_details=receipt_markdown(receipt, model),
        )

    def _referencing_layers(self) -> contextlib.AbstractAsyncContextManager[None]:
        """The agent layer store's lock, shared (nothing when the store is not here)."""
        root = agent_workspaces_root(self.agent.home)
        if not (root / "layers").is_dir():
            return contextlib.nullcontext()
        return layer_lock(root).hold_async()

    def _checked_layer(self, layer: str | None, at_step: int) -> str | None:
        """``layer`` (the one holding the run's workspace after ``at_step``; None: none),
        verified against its manifest digest and seal when the layer store is on this
        host (the worker verifies it again before mounting it)."""
        if layer is None:
            return None
        root = agent_workspaces_root(self.agent.home)
        if not (root / "layers").is_dir():
            return layer
        try:
            LayerStore(root).stack(layer)
        except WorkspaceError as exc:
            raise ForkError(
                f"cannot fork at step {at_step}: the workspace layer of that step is unusable: "
                f"{exc}"
            ) from None
        return layer

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


def _signature(s: Step) -> tuple[str, str, str | None, str]:
    """A step's call and outcome: two runs diverge where these first differ."""
    return (s.activity_type, s.input_sha256, s.result_sha256, s.status.value)
