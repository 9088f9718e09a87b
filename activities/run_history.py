"""Reading an agent run's steps out of Temporal's recorded history.

A run's steps are its activity calls in scheduling order, numbered from 1 across its
continue-as-new chain. A fork's steps start with the ones it inherited (recorded in its
``forklab.fetch_prefix`` results) and include the calls its policies served or blocked
(recorded as ``forklab.step_decision`` activities), so a fork of a fork sees the same
numbering. Everything read here comes from history and is treated as untrusted data.
"""

from __future__ import annotations

import base64
import dataclasses
import json
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Protocol

from pydantic import BaseModel, ConfigDict
from temporalio import activity
from temporalio.api.common.v1 import Payload, WorkflowExecution
from temporalio.api.enums.v1 import EventType
from temporalio.api.history.v1 import HistoryEvent
from temporalio.api.workflowservice.v1 import GetWorkflowExecutionHistoryReverseRequest
from temporalio.client import (
    Client,
    WorkflowExecutionDescription,
    WorkflowExecutionStatus,
    WorkflowHistory,
)
from temporalio.service import RPCError, RPCStatusCode

from activities.fork_models import (
    BASE_STEP_MEMO_KEY,
    FETCH_PREFIX,
    INTERNAL_PREFIX,
    MARKER_MEMO_KEY,
    MODEL_FIELDS,
    RECEIPT_MEMO_KEY,
    STEP_DECISION,
    FetchPrefixInput,
    ForkMarker,
    PrefixPage,
    StepDecisionInput,
)
from experiments.runfork.receipt import ForkReceipt, PrefixEvent
from experiments.runfork.steps import Step, StepStatus, payload_digest

#: Events that reach a workflow besides activity results; a fork does not see them again.
_OTHER_INPUTS = {
    "timer_fired_event_attributes": "timer",
    "start_child_workflow_execution_initiated_event_attributes": "child workflow",
    "workflow_execution_signaled_event_attributes": "signal",
    "workflow_execution_update_accepted_event_attributes": "update",
    "nexus_operation_scheduled_event_attributes": "nexus operation",
}


_CLOSE_EVENTS = {
    EventType.EVENT_TYPE_WORKFLOW_EXECUTION_COMPLETED,
    EventType.EVENT_TYPE_WORKFLOW_EXECUTION_FAILED,
    EventType.EVENT_TYPE_WORKFLOW_EXECUTION_TIMED_OUT,
    EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CANCELED,
    EventType.EVENT_TYPE_WORKFLOW_EXECUTION_TERMINATED,
    EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CONTINUED_AS_NEW,
}


class RunNotFound(LookupError):
    pass


def digest_payloads(payloads: list[Payload]) -> str:
    return payload_digest([(p.metadata.get("encoding", b""), p.data) for p in payloads])


def _b64(payload: Payload) -> str:
    return base64.b64encode(payload.SerializeToString()).decode()


def _label(activity_type: str, payloads: list[Payload]) -> str:
    field_name = MODEL_FIELDS.get(activity_type)
    if field_name is None or not payloads:
        return activity_type
    try:
        data = json.loads(payloads[0].data)
    except ValueError:
        return activity_type
    model = data.get(field_name) if isinstance(data, dict) else None
    return f"{activity_type} ({model})" if isinstance(model, str) else activity_type


@dataclass
class RunRecord:
    """One run of a chain as read from its history."""

    workflow_id: str
    run_id: str
    workflow_type: str
    task_queue: str
    input: list[Payload]
    base_step: int
    steps: list[Step]
    others: list[PrefixEvent]
    marker: ForkMarker | None
    receipt: ForkReceipt | None
    previous_run_id: str | None
    status: str = ""
    close: dict[str, Any] = field(default_factory=dict)
    event_count: int = 0
    #: the run has closed (completed, failed, continued-as-new, …): its history is final
    closed: bool = False


@dataclass
class _Own:
    """A step the run executed itself, filled in as its events arrive."""

    index: int
    activity_type: str
    input_sha256: str
    label: str
    scheduled_s: float
    status: StepStatus = StepStatus.pending
    result_sha256: str | None = None
    result_b64: str | None = None
    duration_ms: float | None = None


def _seconds(event: HistoryEvent) -> float:
    return event.event_time.seconds + event.event_time.nanos / 1e9


@dataclass(frozen=True)
class RunStart:
    """What a run's first event says: its input, its place in the chain, its fork."""

    run_id: str
    previous_run_id: str | None
    #: steps of the chain before this run; None when unknown (a run that continued from
    #: one not written by the fork interceptor: count the earlier runs' steps instead)
    base_step: int | None
    marker: ForkMarker | None
    receipt: ForkReceipt | None
    input: list[Payload]
    workflow_type: str
    task_queue: str


def run_start(event: HistoryEvent, run_id: str) -> RunStart:
    started = event.workflow_execution_started_event_attributes
    fields = started.memo.fields
    marker = None
    if MARKER_MEMO_KEY in fields and fields[MARKER_MEMO_KEY].data:
        marker = ForkMarker.model_validate_json(fields[MARKER_MEMO_KEY].data)
    receipt = None
    if RECEIPT_MEMO_KEY in fields and fields[RECEIPT_MEMO_KEY].data:
        receipt = ForkReceipt.model_validate_json(fields[RECEIPT_MEMO_KEY].data)
    previous = started.continued_execution_run_id or None
    base: int | None = None
    if BASE_STEP_MEMO_KEY in fields and fields[BASE_STEP_MEMO_KEY].data:
        base = int(json.loads(fields[BASE_STEP_MEMO_KEY].data))
    elif marker is not None and not marker.continued:
        base = marker.base_step  # a fork's first run
    elif previous is None:
        base = 0
    return RunStart(
        run_id,
        previous,
        base,
        marker,
        receipt,
        list(started.input.payloads),
        started.workflow_type.name,
        started.task_queue.name,
    )


def parse_run(
    workflow_id: str, history: WorkflowHistory, base_step: int, run_id: str = ""
) -> RunRecord:
    """The steps and other inputs of one run's history (payloads assumed codec-free);
    ``base_step`` counts the chain's earlier steps when the run's memo does not."""
    events = list(history.events)
    started = events[0].workflow_execution_started_event_attributes
    start = run_start(events[0], run_id)
    marker, receipt = start.marker, start.receipt
    if start.base_step is not None:
        base_step = start.base_step
    rec = RunRecord(
        workflow_id=workflow_id,
        run_id=run_id,
        workflow_type=started.workflow_type.name,
        task_queue=started.task_queue.name,
        input=list(started.input.payloads),
        base_step=base_step,
        steps=[],
        others=[],
        marker=marker,
        receipt=receipt,
        previous_run_id=started.continued_execution_run_id or None,
        event_count=len(events),
    )
    rec.steps, rec.others = _parse_events(events, base_step, run_id)
    last = events[-1]
    rec.closed = last.event_type in _CLOSE_EVENTS
    if last.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_COMPLETED:
        r = last.workflow_execution_completed_event_attributes.result.payloads
        rec.close = {"result": _json(r[0]) if r else None}
    elif last.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_FAILED:
        f = last.workflow_execution_failed_event_attributes.failure
        details = f.application_failure_info.details.payloads
        rec.close = {"error": f.message, "details": _json(details[0]) if details else None}
    return rec


def _parse_events(
    events: list[HistoryEvent], base_step: int, run_id: str
) -> tuple[list[Step], list[PrefixEvent]]:
    """The steps (numbered after ``base_step``) and other inputs in ``events``: a whole
    run's history, or its tail from a step's scheduling on."""
    items: list[Step | _Own] = []
    own: dict[int, _Own] = {}
    others: list[PrefixEvent] = []
    scheduled: dict[int, str] = {}
    next_index = base_step + 1
    for ev in events:
        kind = ev.WhichOneof("attributes")
        if kind == "activity_task_scheduled_event_attributes":
            a = ev.activity_task_scheduled_event_attributes
            name = a.activity_type.name
            scheduled[ev.event_id] = name
            payloads = list(a.input.payloads)
            if name == STEP_DECISION:
                d = StepDecisionInput.model_validate_json(payloads[0].data)
                items.append(
                    Step(
                        index=next_index,
                        activity_type=d.activity_type,
                        input_sha256=d.input_sha256,
                        result_sha256=d.result_sha256,
                        status=StepStatus.completed if d.result_b64 else StepStatus.blocked,
                        run_id=run_id,
                        origin=d.decision,
                        label=f"{d.activity_type} [{d.decision} by policy {d.policy}]",
                        result_b64=d.result_b64,
                    )
                )
                next_index += 1
                continue
            if name.startswith(INTERNAL_PREFIX):
                continue
            step = _Own(
                index=next_index,
                activity_type=name,
                input_sha256=digest_payloads(payloads),
                label=_label(name, payloads),
                scheduled_s=_seconds(ev),
            )
            own[ev.event_id] = step
            items.append(step)
            next_index += 1
        elif kind == "activity_task_completed_event_attributes":
            c = ev.activity_task_completed_event_attributes
            results = list(c.result.payloads)
            mine = own.get(c.scheduled_event_id)
            if mine is None:
                # a ForkLab activity: the inherited prefix arrives in fetch_prefix results
                if results and scheduled.get(c.scheduled_event_id) == FETCH_PREFIX:
                    page = PrefixPage.model_validate_json(results[0].data)
                    items.extend(s.model_copy(update={"origin": "inherited"}) for s in page.steps)
                    next_index = base_step + len(items) + 1
                continue
            mine.status = StepStatus.completed
            mine.result_sha256 = digest_payloads(results)
            mine.result_b64 = _b64(results[0]) if results else None
            mine.duration_ms = (_seconds(ev) - mine.scheduled_s) * 1000
        elif kind in (
            "activity_task_failed_event_attributes",
            "activity_task_timed_out_event_attributes",
            "activity_task_canceled_event_attributes",
        ):
            mine = own.get(getattr(ev, kind).scheduled_event_id)
            if mine is not None:
                mine.status = StepStatus.failed
        elif kind in _OTHER_INPUTS:
            others.append(PrefixEvent(kind=_OTHER_INPUTS[kind], after_step=next_index - 1))
        elif kind == "marker_recorded_event_attributes":
            name = ev.marker_recorded_event_attributes.marker_name
            if name == "core_local_activity":
                others.append(PrefixEvent(kind="local activity", after_step=next_index - 1))
    steps = [
        item
        if isinstance(item, Step)
        else Step(
            index=item.index,
            activity_type=item.activity_type,
            input_sha256=item.input_sha256,
            result_sha256=item.result_sha256,
            status=item.status,
            run_id=run_id,
            duration_ms=item.duration_ms,
            label=item.label,
            result_b64=item.result_b64,
        )
        for item in items
    ]
    return steps, others


def _json(p: Payload) -> Any:
    try:
        return json.loads(p.data)
    except ValueError:
        return None


async def _history(client: Client, workflow_id: str, run_id: str | None) -> WorkflowHistory:
    handle = client.get_workflow_handle(workflow_id, run_id=run_id)
    try:
        history = await handle.fetch_history()
    except RPCError as exc:
        if exc.status is RPCStatusCode.NOT_FOUND:
            raise RunNotFound(f"no run {workflow_id!r} (run {run_id or 'latest'})") from None
        raise
    codec = client.data_converter.payload_codec
    if codec is not None:
        raise RunNotFound(
            "payload codecs are not supported by the fork reader yet; fork runs of a "
            "client without a codec"
        )
    return history


class ClosedRuns:
    """Parsed runs that have closed, least recently used out past ``max_bytes`` of
    results: a closed run's history never changes, so forks of one parent run (several
    steps, several interventions) read and parse it once per process. A run still running
    is never kept."""

    def __init__(self, max_bytes: int = 64 << 20) -> None:
        self.max_bytes = max_bytes
        self._runs: OrderedDict[tuple[str, str, int], tuple[RunRecord, int]] = OrderedDict()
        self._bytes = 0
        self.hits = 0

    def get(self, workflow_id: str, run_id: str, base_step: int) -> RunRecord | None:
        key = (workflow_id, run_id, base_step)
        found = self._runs.get(key)
        if found is None:
            return None
        self._runs.move_to_end(key)
        self.hits += 1
        return dataclasses.replace(found[0])

    def put(self, rec: RunRecord, base_step: int) -> None:
        if not rec.closed:
            return
        size = sum(len(s.result_b64 or "") + 400 for s in rec.steps)
        key = (rec.workflow_id, rec.run_id, base_step)
        if size > self.max_bytes or key in self._runs:
            return
        self._runs[key] = (dataclasses.replace(rec), size)
        self._bytes += size
        while self._bytes > self.max_bytes:
            _, (_, dropped) = self._runs.popitem(last=False)
            self._bytes -= dropped


async def read_run(
    client: Client,
    workflow_id: str,
    run_id: str,
    base_step: int,
    runs: ClosedRuns | None = None,
) -> RunRecord:
    """One run, parsed; from ``runs`` when it holds it (and kept there once closed)."""
    known = runs.get(workflow_id, run_id, base_step) if runs is not None else None
    if known is not None:
        return known
    history = await _history(client, workflow_id, run_id)
    rec = parse_run(workflow_id, history, base_step, run_id)
    if runs is not None:
        runs.put(rec, base_step)
    return rec


async def _describe_latest(client: Client, workflow_id: str) -> WorkflowExecutionDescription:
    """The latest run of ``workflow_id``; ``RunNotFound`` when there is none."""
    try:
        return await client.get_workflow_handle(workflow_id).describe()
    except RPCError as exc:
        if exc.status is RPCStatusCode.NOT_FOUND:
            raise RunNotFound(f"no run {workflow_id!r} in this namespace") from None
        raise


async def read_chain(client: Client, workflow_id: str) -> list[RunRecord]:
    """Every run of a workflow's continue-as-new chain, oldest first, steps numbered
    across the chain; the last one carries the chain's status."""
    desc = await _describe_latest(client, workflow_id)
    # walk back through continued_execution_run_id, then number the steps forwards
    histories: list[tuple[str, WorkflowHistory]] = []
    run_id: str | None = desc.run_id
    while run_id:
        history = await _history(client, workflow_id, run_id)
        histories.append((run_id, history))
        first = history.events[0].workflow_execution_started_event_attributes
        run_id = first.continued_execution_run_id or None
    histories.reverse()
    chain: list[RunRecord] = []
    base = 0
    for rid, history in histories:
        rec = parse_run(workflow_id, history, base, rid)
        rec.status = "continued_as_new"
        chain.append(rec)
        base = rec.base_step + len(rec.steps)
    status = desc.status or WorkflowExecutionStatus.RUNNING
    chain[-1].status = status.name.lower()
    return chain


class RunSummary(BaseModel):
    """What locating a step needs of a run whose first event does not record its place in
    the chain (a run continued-as-new by a worker without this interceptor's memo). Runs
    that continued-as-new never change again, so their summaries may be cached."""

    model_config = ConfigDict(frozen=True)

    run_id: str
    steps: int
    previous_run_id: str | None
    #: the run's own base when its first event records it (a fork's first run, a run the
    #: fork interceptor continued-as-new); its steps are numbered after this
    fork_base_step: int | None = None
    marker_json: str | None = None
    receipt_json: str | None = None


class SummaryCache(Protocol):
    def get(self, run_id: str) -> RunSummary | None: ...

    def put(self, summary: RunSummary) -> None: ...


def summarize(rec: RunRecord, start: RunStart) -> RunSummary:
    return RunSummary(
        run_id=rec.run_id,
        steps=len(rec.steps),
        previous_run_id=rec.previous_run_id,
        fork_base_step=start.base_step,
        marker_json=rec.marker.model_dump_json() if rec.marker else None,
        receipt_json=rec.receipt.model_dump_json() if rec.receipt else None,
    )


@dataclass
class Located:
    """The run of a chain that holds a step, parsed, and the chain's fork identity."""

    source: RunRecord
    #: the chain's own fork marker and receipt (None for a run that is not a fork)
    marker: ForkMarker | None
    receipt: ForkReceipt | None
    latest_run_id: str
    #: the run that continued-as-new from ``source`` (None: ``source`` is the latest)
    next_run: RunStart | None = None
    #: ``source`` holds only the boundary step, read from the end of its history: the
    #: boundary ends the run with nothing after it (see :func:`_boundary_at_run_end`)
    tail_only: bool = False
    #: histories read in full, and runs known from their first event alone
    histories_read: int = 1
    starts_read: int = 0


async def _first_event(client: Client, workflow_id: str, run_id: str) -> HistoryEvent:
    handle = client.get_workflow_handle(workflow_id, run_id=run_id)
    try:
        async for event in handle.fetch_history_events(page_size=1):
            return event
    except RPCError as exc:
        if exc.status is RPCStatusCode.NOT_FOUND:
            raise RunNotFound(f"no run {workflow_id!r} (run {run_id})") from None
        raise
    raise RunNotFound(f"run {run_id} of {workflow_id!r} has no history")


async def locate_step(
    client: Client,
    workflow_id: str,
    at_step: int,
    cache: SummaryCache | None = None,
    runs: ClosedRuns | None = None,
) -> Located:
    """Find the run of ``workflow_id``'s continue-as-new chain that scheduled ``at_step``
    (the first run for step 0, the latest for a step past the end) and parse it.

    Every run continued by the fork interceptor records the chain's steps before it in its
    memo, so the walk back from the latest run reads one event per run, and only runs
    later than the one holding ``at_step``: the cost does not grow with ``at_step``. A run
    without that record sends the walk to :func:`_locate_by_counting`."""
    desc = await _describe_latest(client, workflow_id)
    starts = 0
    later: RunStart | None = None
    run_id: str | None = desc.run_id
    while True:
        assert run_id is not None
        start = run_start(await _first_event(client, workflow_id, run_id), run_id)
        starts += 1
        if start.base_step is None:
            return await _locate_by_counting(client, workflow_id, at_step, desc, cache)
        if at_step > start.base_step or start.previous_run_id is None:
            break
        later, run_id = start, start.previous_run_id
    if later is not None and later.base_step == at_step:
        tail = await _boundary_at_run_end(client, workflow_id, start, at_step)
        if tail is not None:
            return Located(
                source=tail,
                marker=start.marker,
                receipt=start.receipt,
                latest_run_id=desc.run_id,
                next_run=later,
                tail_only=True,
                histories_read=0,
                starts_read=starts,
            )
    source = await read_run(client, workflow_id, run_id, 0, runs)
    _set_status(source, desc)
    return Located(
        source=source,
        marker=start.marker,
        receipt=start.receipt,
        latest_run_id=desc.run_id,
        next_run=later,
        starts_read=starts,
    )


#: How far back from a run's end its last step is looked for (events).
TAIL_EVENTS = 1000


async def _boundary_at_run_end(
    client: Client, workflow_id: str, start: RunStart, at_step: int
) -> RunRecord | None:
    """The run's last step, ``at_step``, read from the end of its history (newest events
    first), when it completed and nothing else (timer, signal, update, child, local
    activity) reached the run after it: then the next run's recorded input is the state
    right after ``at_step``. None when that is not so or cannot be seen within
    ``TAIL_EVENTS`` events — the caller then reads the whole run."""
    if client.data_converter.payload_codec is not None:
        return None  # the whole-run reader refuses codecs with the reason
    tail: list[HistoryEvent] = []
    token = b""
    found = False
    while not found and len(tail) < TAIL_EVENTS:
        page = await client.workflow_service.get_workflow_execution_history_reverse(
            GetWorkflowExecutionHistoryReverseRequest(
                namespace=client.namespace,
                execution=WorkflowExecution(workflow_id=workflow_id, run_id=start.run_id),
                maximum_page_size=200,
                next_page_token=token,
            )
        )
        for ev in page.history.events:
            tail.append(ev)
            if ev.HasField("activity_task_scheduled_event_attributes"):
                name = ev.activity_task_scheduled_event_attributes.activity_type.name
                if name == FETCH_PREFIX:
                    return None  # the last steps were inherited: read the whole run
                if name == STEP_DECISION or not name.startswith(INTERNAL_PREFIX):
                    found = True
                    break
        token = page.next_page_token
        if not token:
            break
    if not found:
        return None
    tail.reverse()
    steps, others = _parse_events(tail, at_step - 1, start.run_id)
    if len(steps) != 1 or steps[0].status is not StepStatus.completed or others:
        return None
    return RunRecord(
        workflow_id=workflow_id,
        run_id=start.run_id,
        workflow_type=start.workflow_type,
        task_queue=start.task_queue,
        input=start.input,
        base_step=start.base_step if start.base_step is not None else at_step - 1,
        steps=steps,  # only the last one
        others=[],
        marker=start.marker,
        receipt=start.receipt,
        previous_run_id=start.previous_run_id,
        status="continued_as_new",
    )


def _set_status(source: RunRecord, desc: WorkflowExecutionDescription) -> None:
    status = desc.status or WorkflowExecutionStatus.RUNNING
    source.status = status.name.lower() if source.run_id == desc.run_id else "continued_as_new"


async def _locate_by_counting(
    client: Client,
    workflow_id: str,
    at_step: int,
    desc: WorkflowExecutionDescription,
    cache: SummaryCache | None,
) -> Located:
    """:func:`locate_step` for chains whose runs do not record their base: count the steps
    of every earlier run (from ``cache`` when it knows the run)."""
    latest_run_id = desc.run_id
    summaries: list[RunSummary] = []
    fetched: dict[str, WorkflowHistory] = {}
    run_id: str | None = latest_run_id
    while run_id:
        known = cache.get(run_id) if cache is not None and run_id != latest_run_id else None
        if known is None:
            history = await _history(client, workflow_id, run_id)
            rec = parse_run(workflow_id, history, 0, run_id)
            fetched[run_id] = history
            known = summarize(rec, run_start(history.events[0], run_id))
            if cache is not None and run_id != latest_run_id:
                cache.put(known)
        summaries.append(known)
        run_id = known.previous_run_id
    summaries.reverse()
    bases: list[int] = []
    base = summaries[0].fork_base_step or 0
    for summary in summaries:
        own = summary.fork_base_step if summary.fork_base_step is not None else base
        bases.append(own)
        base = own + summary.steps
    pick = len(summaries) - 1
    for i, summary in enumerate(summaries):
        if bases[i] < at_step <= bases[i] + summary.steps or (i == 0 and at_step <= bases[0]):
            pick = i
            break
    chosen, chosen_base = summaries[pick], bases[pick]
    history = fetched.get(chosen.run_id) or await _history(client, workflow_id, chosen.run_id)
    source = parse_run(workflow_id, history, chosen_base, chosen.run_id)
    _set_status(source, desc)
    next_run = None
    if pick + 1 < len(summaries):
        later_id = summaries[pick + 1].run_id
        next_run = run_start(await _first_event(client, workflow_id, later_id), later_id)
    first = summaries[0]
    return Located(
        source=source,
        marker=ForkMarker.model_validate_json(first.marker_json) if first.marker_json else None,
        receipt=(
            ForkReceipt.model_validate_json(first.receipt_json) if first.receipt_json else None
        ),
        latest_run_id=latest_run_id,
        next_run=next_run,
        histories_read=len(fetched) + (chosen.run_id not in fetched),
        starts_read=int(next_run is not None),
    )


def chain_steps(chain: list[RunRecord]) -> list[Step]:
    return [s for run in chain for s in run.steps]


class ForkActivities:
    """Activities a fork's workflow runs through the worker interceptor."""

    def __init__(self, client: Client) -> None:
        self._client = client
        self.runs = ClosedRuns()

    @activity.defn(name=FETCH_PREFIX)
    async def fetch_prefix(self, req: FetchPrefixInput) -> PrefixPage:
        """Steps ``from_step..upto_step`` of the parent's run, with their results, in pages
        of at most ``max_bytes`` (a Temporal payload must stay small)."""
        rec = await read_run(self._client, req.workflow_id, req.run_id, req.base_step, self.runs)
        wanted = [s for s in rec.steps if req.from_step <= s.index <= req.upto_step]
        out: list[Step] = []
        size = 0
        for s in wanted:
            size += len(s.result_b64 or "") + 400
            if out and size > req.max_bytes:
                return PrefixPage(steps=out, next_step=s.index)
            out.append(s)
        after = [
            s
            for s in rec.steps
            if s.index > req.upto_step and s.status is StepStatus.completed and s.result_b64
        ]
        kept: list[Step] = []
        for s in after:
            size += len(s.result_b64 or "") + 400
            if size > req.max_bytes:
                break
            kept.append(s)
        return PrefixPage(steps=out, recorded_after=kept)

    @activity.defn(name=STEP_DECISION)
    async def step_decision(self, req: StepDecisionInput) -> StepDecisionInput:
        """Records, visibly in history and the Web UI, a live call the fork's policy served
        from the record or blocked; returns the record it was given."""
        return req
