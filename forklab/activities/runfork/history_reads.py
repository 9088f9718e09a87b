"""Reading an agent run's history through a Temporal client: one run, a whole
continue-as-new chain, or just the run that holds a given step (parsing is
``history_events``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from temporalio.api.common.v1 import WorkflowExecution
from temporalio.api.history.v1 import HistoryEvent
from temporalio.api.workflowservice.v1 import GetWorkflowExecutionHistoryReverseRequest
from temporalio.client import (
    Client,
    WorkflowExecutionDescription,
    WorkflowExecutionStatus,
    WorkflowHistory,
)
from temporalio.service import RPCError, RPCStatusCode

from forklab.activities.runfork.history_events import (
    TERMINAL_EVENTS,
    ClosedRuns,
    RunInputs,
    RunRecord,
    RunStart,
    parse_events,
    parse_run,
    run_start,
    summarize,
)
from forklab.contracts.runfork import (
    FETCH_PREFIX,
    INTERNAL_PREFIX,
    STEP_DECISION,
    ForkMarker,
    RunSummary,
)
from forklab.experiments.runfork.receipt import ForkReceipt
from forklab.experiments.runfork.steps import StepStatus


class RunNotFound(LookupError):
    pass


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


async def latest_start(client: Client, workflow_id: str) -> RunStart:
    """What the first event of ``workflow_id``'s latest run says (its chain's first run
    id, its fork marker); ``RunNotFound`` when there is none."""
    desc = await _describe_latest(client, workflow_id)
    return run_start(await first_event(client, workflow_id, desc.run_id), desc.run_id)


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


class SummaryCache(Protocol):
    def get(self, run_id: str) -> RunSummary | None: ...

    def put(self, summary: RunSummary) -> None: ...


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


async def first_event(client: Client, workflow_id: str, run_id: str) -> HistoryEvent:
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
        start = run_start(await first_event(client, workflow_id, run_id), run_id)
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
#: The reverse read's page, in the server's unit: a batch of events written together (a
#: workflow task's completion and the commands it made, 20 calls scheduled at once among
#: them), not an event. The tail a boundary needs is a few batches; a page of 200 answered
#: with 1,338 events of a 500-step run here and took 22 ms of a 28 ms locate, a page of 20
#: answers in 3–4 ms, and a longer tail reads on page by page.
TAIL_PAGE_BATCHES = 20


async def _boundary_at_run_end(
    client: Client, workflow_id: str, start: RunStart, at_step: int
) -> RunRecord | None:
    """The run's last step, ``at_step``, read from the end of its history (newest events
    first, back to the scheduling of the last call and of every call completing after
    it: calls in parallel), when it completed and nothing else (timer, signal, update,
    child, local activity) reached the run in that tail: then the next run's recorded
    input is the state right after ``at_step``. None when that is not so or cannot be
    seen within ``TAIL_EVENTS`` events — the caller then reads the whole run."""
    if client.data_converter.payload_codec is not None:
        return None  # the whole-run reader refuses codecs with the reason
    tail: list[HistoryEvent] = []  # newest first
    token = b""
    found = False
    while len(tail) < TAIL_EVENTS:
        page = await client.workflow_service.get_workflow_execution_history_reverse(
            GetWorkflowExecutionHistoryReverseRequest(
                namespace=client.namespace,
                execution=WorkflowExecution(workflow_id=workflow_id, run_id=start.run_id),
                maximum_page_size=TAIL_PAGE_BATCHES,
                next_page_token=token,
            )
        )
        for ev in page.history.events:
            tail.append(ev)
            if not ev.HasField("activity_task_scheduled_event_attributes"):
                continue
            name = ev.activity_task_scheduled_event_attributes.activity_type.name
            if name == FETCH_PREFIX:
                return None  # the last steps were inherited: read the whole run
            if name == STEP_DECISION or not name.startswith(INTERNAL_PREFIX):
                found = True
            # calls in parallel: the last to complete may be scheduled earlier, so the
            # tail reaches back to the scheduling of every call that completes in it
            if found and not _completes_earlier_calls(tail):
                break
        else:
            token = page.next_page_token
            if token:
                continue
        break
    if not found or _completes_earlier_calls(tail):
        return None
    tail.reverse()
    inputs = RunInputs()
    completions = sum(1 for ev in tail if ev.WhichOneof("attributes") in TERMINAL_EVENTS)
    steps, others = parse_events(tail, at_step - completions, start.run_id, inputs)
    if (
        not steps
        or steps[-1].index != at_step
        or any(s.status is not StepStatus.completed for s in steps)
        or others
    ):
        return None
    return RunRecord(
        workflow_id=workflow_id,
        run_id=start.run_id,
        workflow_type=start.workflow_type,
        task_queue=start.task_queue,
        input=start.input,
        base_step=start.base_step if start.base_step is not None else at_step - len(steps),
        steps=steps,  # the run's last steps: those completing after the last scheduling
        others=[],
        marker=start.marker,
        receipt=start.receipt,
        previous_run_id=start.previous_run_id,
        status="continued_as_new",
        first_run_id=start.first_run_id,
        inputs=inputs,
    )


def _completes_earlier_calls(tail: list[HistoryEvent]) -> bool:
    """Whether an activity scheduled before ``tail`` (events in either order) completes
    inside it."""
    first = min(tail[0].event_id, tail[-1].event_id)
    for ev in tail:
        kind = ev.WhichOneof("attributes")
        if kind in TERMINAL_EVENTS and getattr(ev, kind).scheduled_event_id < first:
            return True
    return False


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
        next_run = run_start(await first_event(client, workflow_id, later_id), later_id)
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
