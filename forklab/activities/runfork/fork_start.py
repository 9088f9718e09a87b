"""Starting a fork of a recorded run: resolve the boundary in the parent's history,
write the receipt and start the fork as a new workflow on ``<queue>@forklab`` with its
marker, signed with the home's fork issuer key (``fork_keys``). ``forklab fork``
(``forklab.cli.runfork.agent_lab``) and an experiment over a cohort
(``forklab.activities.runfork.cohort_forks``) both start forks here."""

from __future__ import annotations

import asyncio
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
from temporalio.client import Client, WorkflowHandle
from temporalio.common import (
    RawValue,
    SearchAttributePair,
    TypedSearchAttributes,
    WorkflowIDReusePolicy,
)
from temporalio.exceptions import WorkflowAlreadyStartedError

from forklab.activities.runfork.fork_builds import polling_builds
from forklab.activities.runfork.fork_keys import issuer_key
from forklab.activities.runfork.history_events import (
    ClosedRuns,
    RunRecord,
    chain_steps,
    digest_payloads,
    run_start,
)
from forklab.activities.runfork.history_reads import (
    Located,
    first_event,
    latest_start,
    locate_step,
    read_run,
)
from forklab.activities.runfork.overrides import override_b64
from forklab.activities.runfork.prefix_page import as_signed, page_payload, passed_page
from forklab.activities.runfork.start_links import forked_from, with_start_links
from forklab.activities.runfork.workspace import agent_workspaces_root
from forklab.activities.sandbox.workspace import LayerStore, WorkspaceError, layer_lock
from forklab.activities.stores.fork_registry import ForkRegistry
from forklab.contracts.fork_request import ForkRequest
from forklab.contracts.fork_signature import (
    issuer_public_key,
    marker_refusal,
    prefix_page_sha256,
    sign_marker,
)
from forklab.contracts.runfork import (
    MARKER_MEMO_KEY,
    PREFIX_PAGE_HEADER,
    RECEIPT_HEADER,
    WORKSPACE_LAYER_FIELD,
    FetchPrefixInput,
    ForkMarker,
    ModelSwap,
    TeamPart,
    fork_task_queue,
)
from forklab.contracts.search_attributes import BOUNDARY, EXPERIMENT, LINEAGE_ROOT, PARENT, RUN
from forklab.experiments.runfork import identity
from forklab.experiments.runfork.approximations import Approximation, id_drift
from forklab.experiments.runfork.call_match import keyed
from forklab.experiments.runfork.overrides import InputOverride, overridden
from forklab.experiments.runfork.policy import DEFAULT_KEY, ToolPolicy, uses_records
from forklab.experiments.runfork.receipt import (
    BoundaryError,
    BoundaryMode,
    ForkReceipt,
    ends_its_run,
    fork_summary,
    make_receipt,
    receipt_markdown,
    resolve_boundary,
)
from forklab.experiments.runfork.steps import Step, StepStatus

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:/-]{0,199}$")


class ForkError(ValueError):
    """A fork request that cannot be honoured; the message says which field and why."""


class ForkExists(ForkError):
    """The fork's name is taken: by an earlier fork's receipt, or by a workflow."""


@dataclass
class Fork:
    receipt: ForkReceipt
    handle: WorkflowHandle[Any, Any]


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


def _id_drift(
    source: RunRecord, prefix: list[Step], parent: str, fork_id: str
) -> list[Approximation]:
    """The inherited calls whose recorded input holds the parent's workflow id where
    nothing handed to its workflow did: the fork, under its own id, asks otherwise."""
    if not prefix or not source.inputs.holding_id:
        return []
    handed = [(0, p.data) for p in source.input]
    handed += [(s.index, base64.b64decode(s.result_b64)) for s in prefix if s.result_b64]
    handed += [
        (m.position, base64.b64decode(a)) for m in source.inputs.messages for a in m.args_b64
    ]
    return id_drift(prefix, source.inputs.holding_id, handed, parent, fork_id)


def final_state(chain: list[RunRecord]) -> Any:
    """A run's final state: its result, or the details of the failure it ended with."""
    close = chain[-1].close
    if "result" in close:
        return close["result"]
    return close.get("details")


def composed_team(team: TeamPart | None, inherited: TeamPart | None) -> TeamPart | None:
    """``team`` as a member whose parent is itself a team fork's member (``inherited``)
    must carry it: the code names the ids the parent's code named, so each id the parent
    addressed to one of its team's forks goes to the fork standing for that fork here, or
    nowhere when it has none."""
    if team is None or inherited is None:
        return team
    own = team.all_addresses
    addresses = dict(team.addresses)
    without = set(team.without_fork) | set(inherited.without_fork)
    for original, parent_fork in inherited.all_addresses.items():
        if parent_fork not in own:
            without.add(original)
        elif original not in own:
            addresses.setdefault(original, own[parent_fork])
    return team.model_copy(update={"addresses": addresses, "without_fork": sorted(without)})


def _passed_prefix(located: Located, marker: ForkMarker, client: Client) -> bytes | None:
    """The page of the fork's prefix its first ``forklab.fetch_prefix`` would read, cut
    from the run ``located`` parsed (``prefix_page.passed_page``), to pass in the fork's
    start. None where the fork's fetch reads instead: it inherits nothing, the run was
    read from its end only, or the page is not one ``passed_page`` passes."""
    if client.data_converter.payload_codec is not None or located.tail_only:
        return None
    inherits = marker.at_step > marker.base_step or uses_records(marker.tool_policies)
    if marker.boundary is BoundaryMode.lineage_only or not inherits:
        return None
    req = FetchPrefixInput(
        workflow_id=marker.parent_workflow_id,
        run_id=marker.source_run_id,
        base_step=marker.base_step,
        from_step=marker.base_step + 1,
        upto_step=marker.at_step,
        result_override=marker.result_override,
    )
    return passed_page(located.source, req)


class ForkStarter:
    """Starts forks for one namespace (``client``), recording receipts in ``registry``;
    ``home`` holds the fork issuer key every marker is signed with (the workers serving
    the forks must trust it: ``forklab.verify_fork``) and the agent runs' workspace
    layers, when they keep any."""

    def __init__(
        self,
        client: Client,
        registry: ForkRegistry,
        home: Path,
        runs: ClosedRuns | None = None,
    ) -> None:
        self.client = client
        self.registry = registry
        self.home = home
        #: closed runs' histories never change: read once, shared with the caller's reads
        self.runs = runs if runs is not None else ClosedRuns()

    async def fork(self, request: ForkRequest) -> Fork:
        """Start the fork ``request`` asks for: of its run, inheriting steps 1..at_step
        and continuing live (``ForkRequest`` says what each field asks).

        When the run keeps a workspace, the fork's files start from the layer step
        ``at_step`` left (verified first; a damaged layer refuses the fork), recorded in
        the receipt's ``workspace_layer_sha256``. The receipt and the marker name the
        builds that recorded the prefix."""
        run, at_step, boundary = request.run, request.at_step, request.boundary
        name, model, result_override = request.name, request.model, request.result_override
        fork_id = name or f"{run}--fork-{uuid.uuid4().hex[:8]}"
        if not _NAME.match(fork_id):
            raise ForkError(
                f"fork name {fork_id!r}: use 1-200 letters, digits and . _ : / - "
                "(starting with a letter or digit)"
            )
        # the registry is SQLite, and its writes wait for the disk: in a thread, so that a
        # worker sharing this event loop (an experiment's fork activity, the in-process
        # API beside a worker) goes on meanwhile — with the fork itself, once it started
        if await asyncio.to_thread(self.registry.receipt, fork_id) is not None:
            raise ForkExists(f"fork name {fork_id!r} is taken by an earlier fork; choose another")
        policies = dict(request.tool_policies)
        policies.setdefault(DEFAULT_KEY, ToolPolicy.auto)
        if request.signals and boundary is BoundaryMode.lineage_only:
            raise ForkError("--signal is delivered at the fork point; lineage_only has none")
        if result_override is not None and boundary is BoundaryMode.lineage_only:
            raise ForkError("--override-result needs an inherited prefix; lineage_only has none")
        if result_override is not None and result_override.step != at_step:
            raise ForkError(
                f"--override-result names step {result_override.step} but the fork is at "
                f"step {at_step}; an override replaces the result of the fork's last step"
            )
        located = (
            await self._closed_run(run, request.run_id) if request.run_id is not None else None
        ) or await locate_step(self.client, run, at_step, self.registry, self.runs)
        source = located.source
        if result_override is not None:
            _check_overridable(source.steps, at_step)
            source = dataclasses.replace(
                source,
                steps=overridden(source.steps, result_override, override_b64(result_override)),
            )
        asked = (
            _input_override(source.steps, at_step, *request.input_override, boundary)
            if request.input_override is not None
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
        drift = _id_drift(source, resolution.prefix, run, fork_id)
        if drift:  # known before the fork starts: refused when exact, listed when approximate
            try:
                resolution = resolve_boundary(
                    source.steps, source.others, at_step, boundary, source.base_step, drift
                )
            except BoundaryError as exc:
                raise ForkError(str(exc)) from None
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
                intervention=request.intervention,
                model=model,
                tool_policies=policies,
                requested_by=request.requested_by or getpass.getuser(),
                created_at=datetime.now(UTC),
                workspace_layer_sha256=layer,
                requested_point=request.point,
                result_override=result_override,
                input_override=asked,
                signals=request.signals,
                parent_build=source.builds_upto(at_step),
                fork_build=await polling_builds(self.client, fork_task_queue(source.task_queue)),
                allow_build_change=request.allow_build_change,
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
                intervention=request.intervention,
                result_override=result_override,
                input_override=asked,
                signals=request.signals,
                cohort=request.cohort,
                team=composed_team(request.team, first_marker.team if first_marker else None),
                fork_workflow_id=fork_id,
                start_input_sha256=digest_payloads(start_input),
                issued_at=datetime.now(UTC),
                parent_build=receipt.parent_build,
                allow_build_change=request.allow_build_change,
            )
            # the prefix page the fork's fetch would read, cut from the run parsed above and
            # passed in the fork's start, its digest signed with the marker
            page = _passed_prefix(located, marker, self.client)
            if page is not None:
                digest = prefix_page_sha256(marker, page)
                marker = marker.model_copy(update={"prefix_page_sha256": digest})
            # signed with this home's issuer key: a worker serves the parent's steps (and
            # the lineage's effects) only to a marker an issuer it trusts made for this run
            marker = sign_marker(marker, issuer_key(self.home))
            try:
                handle = await self._start_workflow(
                    source, start_input, marker, receipt, request.experiment_tag, page
                )
            except WorkflowAlreadyStartedError:
                raise ForkExists(
                    f"fork name {fork_id!r} is the id of an existing workflow; choose another"
                ) from None
            if not request.record:
                return Fork(receipt=receipt, handle=handle)
            try:
                await asyncio.to_thread(self.registry.add_receipt, receipt)
            except BaseException:
                # a fork without its receipt would be promoted, diffed and collected as
                # something else: stop it rather than leave it half-recorded
                await handle.terminate("forklab fork could not record the fork's receipt")
                raise
        return Fork(receipt=receipt, handle=handle)

    async def _closed_run(self, run: str, run_id: str) -> Located | None:
        """Run ``run_id`` of ``run`` as :func:`locate_step` would locate it, when it has
        closed and no run came before it (a chain of one run holds every step); else None.
        Its history is the server's for that workflow and run, as any located run's."""
        source = await read_run(self.client, run, run_id, 0, self.runs)
        if not source.closed or source.previous_run_id is not None:
            return None
        return Located(
            source=source, marker=source.marker, receipt=source.receipt, latest_run_id=run_id
        )

    async def record_started(self, fork_id: str) -> None:
        """Records the receipt of fork ``fork_id`` when its workflow was started here but
        its receipt never recorded (the process died between the two, and a retry found
        the workflow). The receipt is read from the fork's first event, and taken only when
        the marker beside it was signed with this home's key for this workflow and start
        input; else ``ForkExists``: the id is another workflow's."""
        if self.registry.receipt(fork_id) is not None:
            return
        first_run = (await latest_start(self.client, fork_id)).first_run_id
        event = await first_event(self.client, fork_id, first_run)
        start = run_start(event, first_run)
        refusal = (
            marker_refusal(
                as_signed(start.marker, event.workflow_execution_started_event_attributes),
                trusted={issuer_public_key(issuer_key(self.home)): "this home"},
                workflow_id=fork_id,
                start_input_sha256=digest_payloads(start.input),
                started_at=event.event_time.ToDatetime(tzinfo=UTC),
            )
            if start.marker is not None
            else "it carries no fork marker"
        )
        if refusal is not None or start.receipt is None:
            raise ForkExists(
                f"fork name {fork_id!r} is the id of a workflow this home did not start as "
                f"that fork ({refusal or 'it carries no receipt'})"
            )
        if start.receipt.fork_workflow_id != fork_id:
            raise ForkExists(f"fork name {fork_id!r}: its workflow's receipt names another fork")
        self.registry.add_receipt(start.receipt)

    async def _start_workflow(
        self,
        source: RunRecord,
        start_input: list[Payload],
        marker: ForkMarker,
        receipt: ForkReceipt,
        experiment_tag: str | None = None,
        page: bytes | None = None,
    ) -> WorkflowHandle[Any, Any]:
        """Start the fork under a workflow id never used before: not as a second run of a
        closed workflow (an unrelated run's or an earlier fork's), whose history ``steps``,
        ``diff`` and ``promote`` would then read as this fork's. It starts on the fork
        queue of the parent's (``<queue>@forklab``), which only ``ForkLabPlugin`` workers
        poll: no worker without the fork interceptor can run it as an ordinary run.
        ``page``: the prefix page passed in its start header (``_passed_prefix``);
        ``experiment_tag``: the experiment run whose cleanup finds the fork."""
        fork_id, parent = receipt.fork_workflow_id, marker.parent_workflow_id
        boundary = marker.boundary.value
        # the model the fork's calls after the boundary use: its own swap, else one it
        # inherits from the forks before it (None: the workflow's own choice)
        model = marker.model_at(receipt.requested_step + 1)
        # linked to the run it starts from: the Web UI shows that on its first event
        link = forked_from(self.client.namespace, parent, marker.source_run_id)
        # the receipt travels in a start header (RECEIPT_HEADER: no memo size warning),
        # and the prefix page the fork's fetch would read when one is passed
        headers = {
            RECEIPT_HEADER: Payload(
                metadata={"encoding": b"json/plain"},
                data=receipt.model_dump_json(exclude_defaults=True).encode(),
            )
        }
        if page is not None:
            headers[PREFIX_PAGE_HEADER] = page_payload(page)
        return await with_start_links(self.client, [link], headers).start_workflow(
            source.workflow_type,
            args=[RawValue(p) for p in start_input],
            id=fork_id,
            id_reuse_policy=WorkflowIDReusePolicy.REJECT_DUPLICATE,
            task_queue=fork_task_queue(source.task_queue),
            # fields at their defaults left out: Temporal warns (on the client's stdout,
            # which `forklab fork --json` writes to) past 2 KiB of memo; so is the page's
            # digest, which the page in the start header stands for (``as_signed``)
            memo={
                MARKER_MEMO_KEY: marker.model_dump(
                    mode="json", exclude_defaults=True, exclude={"prefix_page_sha256"}
                )
            },
            search_attributes=TypedSearchAttributes(
                [
                    SearchAttributePair(RUN, fork_id),
                    SearchAttributePair(PARENT, parent),
                    SearchAttributePair(LINEAGE_ROOT, marker.lineage_root),
                    SearchAttributePair(BOUNDARY, boundary),
                    *(
                        []
                        if experiment_tag is None
                        else [SearchAttributePair(EXPERIMENT, experiment_tag)]
                    ),
                ]
            ),
            static_summary=fork_summary(receipt, model),
            static_details=receipt_markdown(receipt, model),
        )

    def _referencing_layers(self) -> contextlib.AbstractAsyncContextManager[None]:
        """The agent layer store's lock, shared (nothing when the store is not here)."""
        root = agent_workspaces_root(self.home)
        if not (root / "layers").is_dir():
            return contextlib.nullcontext()
        return layer_lock(root).hold_async()

    def _checked_layer(self, layer: str | None, at_step: int) -> str | None:
        """``layer`` (the one holding the run's workspace after ``at_step``; None: none),
        verified against its manifest digest and seal when the layer store is on this
        host (the worker verifies it again before mounting it)."""
        if layer is None:
            return None
        root = agent_workspaces_root(self.home)
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
