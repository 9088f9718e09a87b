"""An agent run's steps, parsed out of its recorded history events.

A run's steps are its activity calls in the order they completed (the pending ones last,
in scheduling order), numbered from 1 across its continue-as-new chain; each keeps its
place in the scheduling order (``Step.call``: the fork interceptor's ``forklab-step``
header where present, else counted). A fork's steps start with the ones it inherited
(recorded in its ``forklab.fetch_prefix`` results) and include the calls its policies
served or blocked (recorded as ``forklab.step_decision`` activities), so a fork of a fork
sees the same numbering. Parsing only: the reads through a client are ``history_reads``. Everything
parsed here comes from history and is treated as untrusted data.
"""

from __future__ import annotations

import base64
import bisect
import contextlib
import dataclasses
import json
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError
from temporalio.api.common.v1 import Payload, Payloads
from temporalio.api.enums.v1 import EventType, SignalExternalWorkflowExecutionFailedCause
from temporalio.api.history.v1 import HistoryEvent
from temporalio.client import WorkflowHistory

from forklab.contracts.runfork import (
    BASE_STEP_MEMO_KEY,
    FETCH_PREFIX,
    INTERNAL_PREFIX,
    MARKER_MEMO_KEY,
    MODEL_FIELDS,
    PREFIX_PAGE_HEADER,
    RECEIPT_HEADER,
    RECEIPT_MEMO_KEY,
    RECORD_DRIFT,
    SIDE_EFFECTS_PATCH,
    STEP_DECISION,
    STEP_HEADER,
    ForkMarker,
    PrefixPage,
    RunSummary,
    StepDecisionInput,
)
from forklab.experiments.runfork.approximations import DriftRecord, holds
from forklab.experiments.runfork.prefix_messages import (
    MessageKind,
    Ordinals,
    PrefixMessage,
    timer_name,
)
from forklab.experiments.runfork.receipt import (
    CANCEL_REQUEST_KIND,
    SENT_SIGNAL_KIND,
    ForkReceipt,
    PrefixEvent,
)
from forklab.experiments.runfork.side_effects import randomness_seed
from forklab.experiments.runfork.steps import Step, StepOrigin, StepStatus, payload_digest

#: Events that reach a workflow besides activity results; a fork does not see them again.
_OTHER_INPUTS = {
    "start_child_workflow_execution_initiated_event_attributes": "child workflow",
    "nexus_operation_scheduled_event_attributes": "nexus operation",
}

#: The events that close a child workflow; a fork is served the first two (its result or
#: failure), and cannot be served a child that ended another way.
_ENDED = {
    "child_workflow_execution_canceled_event_attributes": "canceled",
    "child_workflow_execution_timed_out_event_attributes": "timed out",
    "child_workflow_execution_terminated_event_attributes": "terminated",
}
_CHILD_CLOSED = {
    "child_workflow_execution_completed_event_attributes",
    "child_workflow_execution_failed_event_attributes",
    *_ENDED,
}


#: The events that end an activity call: its step takes its number from the first of them.
TERMINAL_EVENTS = {
    "activity_task_completed_event_attributes",
    "activity_task_failed_event_attributes",
    "activity_task_timed_out_event_attributes",
    "activity_task_canceled_event_attributes",
}

_CLOSE_EVENTS = {
    EventType.EVENT_TYPE_WORKFLOW_EXECUTION_COMPLETED,
    EventType.EVENT_TYPE_WORKFLOW_EXECUTION_FAILED,
    EventType.EVENT_TYPE_WORKFLOW_EXECUTION_TIMED_OUT,
    EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CANCELED,
    EventType.EVENT_TYPE_WORKFLOW_EXECUTION_TERMINATED,
    EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CONTINUED_AS_NEW,
}


def digest_payloads(payloads: list[Payload]) -> str:
    return payload_digest([(p.metadata.get("encoding", b""), p.data) for p in payloads])


def detached(payloads: Iterable[Payload]) -> list[Payload]:
    """Copies of ``payloads`` that hold nothing of the message they came from. A payload
    read out of a parsed history is a view into it (protobuf's upb runtime keeps a
    message's whole arena alive while any part of it is referenced), so a record that
    kept one would keep the run's whole history in memory: a cached closed run
    (``ClosedRuns``) would weigh its history, not what it keeps."""
    copies = []
    for p in payloads:
        copy = Payload()
        copy.CopyFrom(p)
        copies.append(copy)
    return copies


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
    #: the first run id of the chain (Temporal's ``first_execution_run_id``): with the
    #: workflow id and namespace, the chain's identity that no later run shares
    first_run_id: str = ""
    #: what besides its steps reached the run
    inputs: RunInputs = field(default_factory=lambda: RunInputs())
    #: the seed of the run's ``workflow.random()`` (None: not known)
    seed: int | None = None

    def builds_upto(self, at_step: int) -> str | None:
        """The builds that ran the workflow tasks handing over steps up to ``at_step``,
        comma-separated, oldest first (None: the history names none)."""
        seen = [b for n, b in self.inputs.builds if n <= at_step]
        return ", ".join(dict.fromkeys(seen)) or None


@dataclass
class RunInputs:
    """What reached a run besides its activity results, as a fork needs it to hand the
    same things over at the same points."""

    #: the signals, accepted updates, fired timers and closed children that reached the
    #: run (or that its fork prefix redelivered), in the order the workflow saw them
    messages: list[PrefixMessage] = field(default_factory=list)
    #: (steps handed over before the workflow task, the build that completed it)
    builds: list[tuple[int, str]] = field(default_factory=list)
    #: steps handed over → the time (ns) of the workflow task that handed the last of them
    #: over: what ``workflow.now()`` said right after (``side_effects.py``)
    clock: dict[int, int] = field(default_factory=dict)
    #: the seed a fork's prefix drew ``workflow.random()`` from (its parent's), when the
    #: run is such a fork
    served_seed: int | None = None
    #: the run's workflow id, looked for in its calls' inputs (empty: not looked for)
    look_for: str = ""
    #: the steps whose recorded input holds ``look_for``: their input payloads (encoding,
    #: data), from which a fork's input is predicted (``approximations.id_drift``)
    holding_id: dict[int, list[tuple[bytes, bytes]]] = field(default_factory=dict)
    #: the inherited calls this run (a fork) was served with a drifted input, as it
    #: recorded them (``forklab.record_drift``)
    drift: list[DriftRecord] = field(default_factory=list)


@dataclass
class _Own:
    """A step the run executed itself, filled in as its events arrive."""

    call: int
    activity_type: str
    input_sha256: str
    label: str
    scheduled_s: float
    scheduled_after: int
    index: int = 0
    status: StepStatus = StepStatus.pending
    result_sha256: str | None = None
    result_b64: str | None = None
    duration_ms: float | None = None
    #: its input payloads (encoding, data) when they hold the run's workflow id
    holding_id: list[tuple[bytes, bytes]] | None = None


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
    #: the first run id of the chain
    first_run_id: str = ""


def run_start(event: HistoryEvent, run_id: str) -> RunStart:
    started = event.workflow_execution_started_event_attributes
    fields = started.memo.fields
    marker = None
    if MARKER_MEMO_KEY in fields and fields[MARKER_MEMO_KEY].data:
        marker = ForkMarker.model_validate_json(fields[MARKER_MEMO_KEY].data)
    receipt = None
    headers = started.header.fields
    if RECEIPT_HEADER in headers and headers[RECEIPT_HEADER].data:
        receipt = ForkReceipt.model_validate_json(headers[RECEIPT_HEADER].data)
    elif RECEIPT_MEMO_KEY in fields and fields[RECEIPT_MEMO_KEY].data:  # an older fork
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
        detached(started.input.payloads),
        started.workflow_type.name,
        started.task_queue.name,
        started.first_execution_run_id,
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
        input=start.input,
        base_step=base_step,
        steps=[],
        others=[],
        marker=marker,
        receipt=receipt,
        previous_run_id=started.continued_execution_run_id or None,
        event_count=len(events),
        first_run_id=started.first_execution_run_id,
    )
    rec.inputs.look_for = workflow_id
    rec.steps, rec.others = parse_events(events, base_step, run_id, rec.inputs)
    original = started.original_execution_run_id
    rec.seed = rec.inputs.served_seed or (randomness_seed(original) if original else None)
    if marker is not None and marker.signals and not marker.continued:
        # delivered by the interceptor at the fork point, so not in history as events: a
        # fork of this fork past that point would not see them again
        rec.others.append(
            PrefixEvent(kind="signal (given at the fork point)", after_step=marker.at_step)
        )
        rec.others.sort(key=lambda e: e.after_step)
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


def started_page(first: HistoryEvent) -> bytes | None:
    """The JSON of the prefix page a fork's start carries (``PREFIX_PAGE_HEADER``), when
    ``first`` is the first event of a run that carries one."""
    if not first.HasField("workflow_execution_started_event_attributes"):
        return None
    passed = first.workflow_execution_started_event_attributes.header.fields.get(PREFIX_PAGE_HEADER)
    return passed.data if passed is not None else None


def fetched_page(result: bytes, in_start: bytes | None) -> PrefixPage | None:
    """The page a ``forklab.fetch_prefix`` result in a fork's history stands for: itself,
    or — a verdict on the page the fork's start carries (``PrefixPage.in_start``) — that
    page (``in_start``, from ``started_page``; None when the start carries none)."""
    page = PrefixPage.model_validate_json(result)
    if not page.in_start:
        return page
    return PrefixPage.model_validate_json(in_start) if in_start is not None else None


def _header_position(a: Any) -> int | None:
    """The call position the fork interceptor wrote into a scheduled call's header (None
    when absent or not a positive integer: history is untrusted)."""
    p = a.header.fields.get(STEP_HEADER)
    if p is None:
        return None
    try:
        value = json.loads(p.data)
    except ValueError:
        return None
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def parse_events(
    events: list[HistoryEvent],
    base_step: int,
    run_id: str,
    inputs: RunInputs | None = None,
) -> tuple[list[Step], list[PrefixEvent]]:
    """The steps (numbered after ``base_step`` in the order they completed, the pending
    ones last) and other inputs in ``events``: a whole run's history, or its tail from a
    step's scheduling on. Signals and accepted updates go into ``messages`` too, with
    their arguments and position (``experiments/runfork/prefix_messages.py``), with the
    builds, workflow task times and served seed, into ``inputs``."""
    done: list[Step] = []
    into = inputs if inputs is not None else RunInputs()
    found = into.messages
    # the order the workflow saw them in: by activation; in one, the SDK applies signals
    # and updates before timer fires and child outcomes; then as the history has them
    seen: dict[int, tuple[int, int, int]] = {}

    def saw(msg: PrefixMessage, activation: int, resolution: bool) -> None:
        seen[id(msg)] = (activation, int(resolution), len(seen))
        found.append(msg)

    tasks = _task_starts(events)
    in_start = started_page(events[0]) if events else None
    first = tasks.after(0)
    if first is not None:
        into.clock[base_step] = first  # what the run's code saw before any step
    # steps handed over before the activation of the last completed workflow task, and
    # of the one before it: a signal arriving now reaches the workflow in the next
    # activation, after the former; an update accepted now came in the last one
    task_started = last_task = task_before = 0
    # the k-th child of a type the run started, the k-th signal of a name it sent (served
    # ones too)
    ordinals = Ordinals()
    sent_ordinals = Ordinals()
    timers: dict[int, int] = {}
    #: initiated children and signals sent: their event in ``others`` and their ordinal
    children: dict[int, tuple[int, int]] = {}
    sent: dict[int, tuple[int, int]] = {}
    own: dict[int, _Own] = {}
    decided: dict[int, Step] = {}
    order: list[_Own | Step] = []
    others: list[PrefixEvent] = []
    scheduled: dict[int, str] = {}
    calls = base_step  # positions of calls whose header does not say

    def resolved(
        kind: MessageKind, known: tuple[int, int], ev: HistoryEvent, **outcome: Any
    ) -> None:
        """The child or the signal sent at ``others[at]`` closed with ``ev``: listed where,
        and handed to a fork there as a message (``known``: its place and ordinal)."""
        at, ordinal = known
        opened = others[at]
        position = base_step + len(done)
        others[at] = opened.model_copy(update={"closed_after": position})
        msg = PrefixMessage(
            kind=kind,
            name=opened.name,
            position=position,
            ordinal=ordinal,
            child_id=opened.child_id,
            time_ns=tasks.after(ev.event_id),
            **outcome,
        )
        saw(msg, tasks.activation_after(ev.event_id), True)

    def ended(known: tuple[int, int], how: str) -> None:
        """The child or the signal sent at ``others[at]`` ended unserved (the boundary says
        why)."""
        others[known[0]] = others[known[0]].model_copy(update={"ended": how})

    def finish(item: _Own | Step, at: int | None = None) -> None:
        index = base_step + len(done) + 1
        if at is not None and (time := tasks.after(at)) is not None:
            into.clock[index] = time
        if isinstance(item, Step):
            done.append(item.model_copy(update={"index": index}))
        else:
            item.index = index
            done.append(_own_step(item, run_id))
            if item.holding_id is not None:
                into.holding_id[index] = item.holding_id

    for ev in events:
        kind = ev.WhichOneof("attributes")
        if kind == "activity_task_scheduled_event_attributes":
            a = ev.activity_task_scheduled_event_attributes
            name = a.activity_type.name
            scheduled[ev.event_id] = name
            payloads = list(a.input.payloads)
            if name == STEP_DECISION:
                d = StepDecisionInput.model_validate_json(payloads[0].data)
                if d.acting is not None:
                    others.append(
                        PrefixEvent(
                            kind=d.acting,
                            after_step=base_step + len(done),
                            name=d.activity_type,
                            blocked=True,
                        )
                    )
                    continue
                calls += 1
                step = Step(
                    index=max(d.index, 1),
                    activity_type=d.activity_type,
                    input_sha256=d.input_sha256,
                    result_sha256=d.result_sha256,
                    status=StepStatus.completed if d.result_b64 else StepStatus.blocked,
                    run_id=run_id,
                    origin=d.decision,
                    label=f"{d.activity_type} [{d.decision} by policy {d.policy}]",
                    result_b64=d.result_b64,
                    call=d.index,
                    scheduled_after=base_step + len(done),
                )
                decided[ev.event_id] = step
                order.append(step)
                continue
            if name == RECORD_DRIFT:
                with contextlib.suppress(ValidationError):  # history is untrusted
                    into.drift.append(DriftRecord.model_validate_json(payloads[0].data))
                continue
            if name.startswith(INTERNAL_PREFIX):
                continue
            calls += 1
            call = _Own(
                call=_header_position(a) or calls,
                activity_type=name,
                input_sha256=digest_payloads(payloads),
                label=_label(name, payloads),
                scheduled_s=_seconds(ev),
                scheduled_after=base_step + len(done),
            )
            if into.look_for and any(holds(p.data, into.look_for) for p in payloads):
                call.holding_id = [(p.metadata.get("encoding", b""), p.data) for p in payloads]
            own[ev.event_id] = call
            order.append(call)
        elif kind in TERMINAL_EVENTS:
            attrs = getattr(ev, kind)
            sid = attrs.scheduled_event_id
            if sid in decided:
                finish(decided.pop(sid), ev.event_id)
                continue
            mine = own.pop(sid, None)
            if mine is None:
                # a ForkLab activity: the inherited prefix arrives in fetch_prefix results
                results = (
                    list(attrs.result.payloads)
                    if kind == "activity_task_completed_event_attributes"
                    else []
                )
                page = (
                    fetched_page(results[0].data, in_start)
                    if results and scheduled.get(sid) == FETCH_PREFIX
                    else None
                )
                if page is not None:
                    for m in page.messages:  # redelivered by the interceptor, first
                        saw(m, -1, False)
                    into.clock.update(page.clock)
                    if page.seed is not None and tasks.patched_side_effects:
                        into.served_seed = page.seed
                    for m in page.messages:
                        if m.ordinal is not None:
                            served = m.kind is MessageKind.sent_signal
                            (sent_ordinals if served else ordinals).take(m.name, m.ordinal)
                        others.append(_message_event(m))
                    done.extend(
                        s
                        if s.origin is StepOrigin.overridden
                        else s.model_copy(update={"origin": StepOrigin.inherited})
                        for s in page.steps
                    )
                    calls = max(calls, base_step + len(done))
                continue
            if kind == "activity_task_completed_event_attributes":
                results = list(attrs.result.payloads)
                mine.status = StepStatus.completed
                mine.result_sha256 = digest_payloads(results)
                mine.result_b64 = _b64(results[0]) if results else None
            else:
                mine.status = StepStatus.failed
            mine.duration_ms = (_seconds(ev) - mine.scheduled_s) * 1000
            finish(mine, ev.event_id)
        elif kind == "start_child_workflow_execution_initiated_event_attributes":
            init = ev.start_child_workflow_execution_initiated_event_attributes
            ordinal = ordinals.next(init.workflow_type.name)
            children[ev.event_id] = (len(others), ordinal)
            others.append(
                PrefixEvent(
                    kind=_OTHER_INPUTS[kind],
                    after_step=base_step + len(done),
                    name=init.workflow_type.name,
                    child_id=init.workflow_id,
                )
            )
        elif kind in _CHILD_CLOSED:
            attrs = getattr(ev, kind)
            known = children.pop(attrs.initiated_event_id, None)
            if known is None:
                continue
            if kind == "child_workflow_execution_completed_event_attributes":
                results = list(attrs.result.payloads)
                resolved(
                    MessageKind.child, known, ev, result_b64=_b64(results[0]) if results else None
                )
            elif kind == "child_workflow_execution_failed_event_attributes":
                failure = base64.b64encode(attrs.failure.SerializeToString()).decode()
                resolved(MessageKind.child, known, ev, failure_b64=failure)
            else:  # canceled, timed out, terminated: not served
                ended(known, _ENDED[kind])
        elif kind == "signal_external_workflow_execution_initiated_event_attributes":
            out = ev.signal_external_workflow_execution_initiated_event_attributes
            ordinal = sent_ordinals.next(out.signal_name)
            sent[ev.event_id] = (len(others), ordinal)
            others.append(
                PrefixEvent(
                    kind=SENT_SIGNAL_KIND,
                    after_step=base_step + len(done),
                    name=out.signal_name,
                    child_id=out.workflow_execution.workflow_id,
                )
            )
        elif kind == "external_workflow_execution_signaled_event_attributes":
            acked = ev.external_workflow_execution_signaled_event_attributes
            known = sent.pop(acked.initiated_event_id, None)
            if known is not None:
                resolved(MessageKind.sent_signal, known, ev)
        elif kind == "signal_external_workflow_execution_failed_event_attributes":
            failed = ev.signal_external_workflow_execution_failed_event_attributes
            known = sent.pop(failed.initiated_event_id, None)
            if known is not None:
                cause = SignalExternalWorkflowExecutionFailedCause.Name(failed.cause)
                why = cause.removeprefix("SIGNAL_EXTERNAL_WORKFLOW_EXECUTION_FAILED_CAUSE_")
                ended(known, f"failed ({why.lower().replace('_', ' ')})")
        elif kind == "request_cancel_external_workflow_execution_initiated_event_attributes":
            asked = ev.request_cancel_external_workflow_execution_initiated_event_attributes
            others.append(
                PrefixEvent(
                    kind=CANCEL_REQUEST_KIND,
                    after_step=base_step + len(done),
                    child_id=asked.workflow_execution.workflow_id,
                )
            )
        elif kind == "timer_started_event_attributes":
            ns = ev.timer_started_event_attributes.start_to_fire_timeout.ToNanoseconds()
            timers[ev.event_id] = ns
        elif kind == "timer_fired_event_attributes":
            ns = timers.pop(ev.timer_fired_event_attributes.started_event_id, -1)
            if ns < 0:
                continue
            msg = PrefixMessage(
                kind=MessageKind.timer,
                name=timer_name(ns),
                position=base_step + len(done),
                duration_ns=ns,
                time_ns=tasks.after(ev.event_id),
            )
            saw(msg, tasks.activation_after(ev.event_id), True)
            others.append(_message_event(msg))
        elif kind == "workflow_task_started_event_attributes":
            task_started = len(done)
        elif kind == "workflow_task_completed_event_attributes":
            task_before, last_task = last_task, task_started
            build = _build(ev)
            if build:
                into.builds.append((base_step + task_started, build))
        elif kind == "workflow_execution_signaled_event_attributes":
            sig = ev.workflow_execution_signaled_event_attributes
            msg = PrefixMessage(
                kind=MessageKind.signal,
                name=sig.signal_name,
                position=base_step + last_task,
                time_ns=tasks.after(ev.event_id),
                args_b64=[_b64(p) for p in sig.input.payloads],
                headers_b64={k: _b64(v) for k, v in sig.header.fields.items()},
            )
            saw(msg, tasks.activation_after(ev.event_id), False)
            others.append(_message_event(msg))
        elif kind == "workflow_execution_update_accepted_event_attributes":
            req = ev.workflow_execution_update_accepted_event_attributes.accepted_request
            msg = PrefixMessage(
                kind=MessageKind.update,
                name=req.input.name,
                position=base_step + task_before,
                time_ns=tasks.before(ev.event_id),
                args_b64=[_b64(p) for p in req.input.args.payloads],
                headers_b64={k: _b64(v) for k, v in req.input.header.fields.items()},
                update_id=req.meta.update_id,
            )
            saw(msg, tasks.activation_after(ev.event_id) - 1, False)
            others.append(_message_event(msg))
        elif kind in _OTHER_INPUTS:
            others.append(PrefixEvent(kind=_OTHER_INPUTS[kind], after_step=base_step + len(done)))
        elif kind == "marker_recorded_event_attributes":
            recorded = ev.marker_recorded_event_attributes
            if recorded.marker_name == "core_local_activity":
                others.append(
                    PrefixEvent(
                        kind="local activity",
                        after_step=base_step + len(done),
                        name=_local_activity_type(recorded.details.get("data")),
                    )
                )
    found.sort(key=lambda m: seen.get(id(m), (-1, 0, 0)))
    others.sort(key=lambda e: e.after_step)
    for item in order:  # calls still running (or abandoned), in scheduling order
        if isinstance(item, Step):
            if any(d is item for d in decided.values()):
                finish(item)
        elif item.status is StepStatus.pending:
            finish(item)
    return done, others


class _TaskStarts:
    """The start times of a history's completed workflow tasks: the activation an event
    reached the workflow in is the first one that started after it."""

    def __init__(self, starts: list[tuple[int, int]], patched_side_effects: bool) -> None:
        self._ids = [i for i, _ in starts]
        self._times = [t for _, t in starts]
        #: the run is a fork that drew its prefix's side effects from its parent
        self.patched_side_effects = patched_side_effects

    def activation_after(self, event_id: int) -> int:
        """The index of the first completed workflow task that started after the event."""
        return bisect.bisect_right(self._ids, event_id)

    def after(self, event_id: int) -> int | None:
        at = self.activation_after(event_id)
        return self._times[at] if at < len(self._times) else None

    def before(self, event_id: int) -> int | None:
        at = bisect.bisect_left(self._ids, event_id) - 1
        return self._times[at] if at >= 0 else None


def _task_starts(events: list[HistoryEvent]) -> _TaskStarts:
    starts: list[tuple[int, int]] = []
    started: tuple[int, int] | None = None
    patched = False
    for ev in events:
        kind = ev.WhichOneof("attributes")
        if kind == "workflow_task_started_event_attributes":
            started = (ev.event_id, ev.event_time.ToNanoseconds())
        elif kind == "workflow_task_completed_event_attributes" and started is not None:
            starts.append(started)
            started = None
        elif kind == "marker_recorded_event_attributes":
            patch = ev.marker_recorded_event_attributes.details.get("patch-data")
            patched = patched or any(
                SIDE_EFFECTS_PATCH.encode() in p.data for p in (patch.payloads if patch else [])
            )
    return _TaskStarts(starts, patched)


def _build(ev: HistoryEvent) -> str:
    """The build that completed a workflow task: its Worker Deployment Version, else its
    build id (the Python SDK's default is a digest of the worker's loaded modules)."""
    done = ev.workflow_task_completed_event_attributes
    version = done.deployment_version
    if version.deployment_name and version.build_id:
        return f"{version.deployment_name}.{version.build_id}"
    return version.build_id or done.worker_version.build_id or done.binary_checksum


def _message_event(m: PrefixMessage) -> PrefixEvent:
    """How ``forklab steps`` and the boundary see a message (a child served to a fork is
    listed where it closed)."""
    if m.kind is MessageKind.child or m.kind is MessageKind.sent_signal:
        return PrefixEvent(
            kind=m.kind.value,
            after_step=m.position,
            name=m.name,
            child_id=m.child_id,
            closed_after=m.position,
        )
    return PrefixEvent(kind=m.kind.value, after_step=m.position, name=m.name)


def _own_step(item: _Own, run_id: str) -> Step:
    return Step(
        index=item.index,
        activity_type=item.activity_type,
        input_sha256=item.input_sha256,
        result_sha256=item.result_sha256,
        status=item.status,
        run_id=run_id,
        duration_ms=item.duration_ms,
        label=item.label,
        result_b64=item.result_b64,
        call=item.call,
        scheduled_after=item.scheduled_after,
    )


def _local_activity_type(data: Payloads | None) -> str:
    """The activity type a local activity marker names (its details' ``data``: JSON written
    by the SDK's core); empty when it names none."""
    value = _json(data.payloads[0]) if data is not None and data.payloads else None
    found = value.get("activity_type") if isinstance(value, dict) else None
    return found if isinstance(found, str) else ""


def _json(p: Payload) -> Any:
    try:
        return json.loads(p.data)
    except ValueError:
        return None


def kept_bytes(rec: RunRecord) -> int:
    """About what a parsed run keeps in memory: its steps (with their recorded results),
    its input and the messages a fork would be served. The history it was parsed from is
    not kept (``detached``). The constants are a run's and a step's Python objects as
    measured on a cohort's runs (docs/benchmarks/cohort-scale.md: 4.8 KB a run of two
    steps)."""
    steps = sum(len(s.result_b64 or "") + 800 for s in rec.steps)
    messages = sum(len(m.model_dump_json(exclude_defaults=True)) + 200 for m in rec.inputs.messages)
    inputs = sum(p.ByteSize() for p in rec.input)
    holding = sum(len(d) for held in rec.inputs.holding_id.values() for _, d in held)
    return 2500 + steps + messages + inputs + holding


class ClosedRuns:
    """Parsed runs that have closed, least recently used out past ``max_bytes`` of what
    they keep (``kept_bytes``): a closed run's history never changes, so forks of one
    parent run (several steps, several interventions) read and parse it once per process.
    A run still running is never kept."""

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
        size = kept_bytes(rec)
        key = (rec.workflow_id, rec.run_id, base_step)
        if size > self.max_bytes or key in self._runs:
            return
        self._runs[key] = (dataclasses.replace(rec), size)
        self._bytes += size
        while self._bytes > self.max_bytes:
            _, (_, dropped) = self._runs.popitem(last=False)
            self._bytes -= dropped


def summarize(rec: RunRecord, start: RunStart) -> RunSummary:
    return RunSummary(
        run_id=rec.run_id,
        steps=len(rec.steps),
        previous_run_id=rec.previous_run_id,
        fork_base_step=start.base_step,
        marker_json=rec.marker.model_dump_json() if rec.marker else None,
        receipt_json=rec.receipt.model_dump_json() if rec.receipt else None,
    )


def chain_steps(chain: list[RunRecord]) -> list[Step]:
    return [s for run in chain for s in run.steps]
