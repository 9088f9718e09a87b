"""Reading a team out of recorded Temporal histories: which workflows a run signalled,
updated or started as children, and which signalled, updated or started it — each message
placed in both histories by position (``forklab.experiments.runfork.team_cut``).

Links, as the histories record them:

- a signal from a workflow: ``SignalExternalWorkflowExecutionInitiated`` in the sender
  (target and name), ``WorkflowExecutionSignaled`` in the receiver, which names the
  sending execution; the k-th such signal of a name from one sender to one receiver is
  the k-th the receiver got from it;
- an update: workflows send updates from activities (``team.send_update``), whose update
  id names the sending activity (``forklab.contracts.team``); the receiver's
  ``UpdateAccepted`` carries it, and the sender's step is the activity with that id;
- a child: ``StartChildWorkflowExecutionInitiated`` in the parent, the child's start
  naming its parent, and the parent's ``ChildWorkflowExecution{Completed,Failed,...}``.

Anything else (a client's signal or update, a child or target outside the team) is a
message with one end outside. Steps are counted as ``forklab steps`` numbers them (activity
calls in the order they completed, those that never did last; a fork's inherited and
decided steps included) across a continue-as-new chain, so a cut at a member's step N
holds the calls a fork of it at step N inherits. Everything read here comes from history
and is treated as untrusted data: names and ids are kept as strings, never interpreted.
"""

from __future__ import annotations

import asyncio
import json
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from temporalio.api.common.v1 import Payload
from temporalio.api.history.v1 import HistoryEvent
from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.service import RPCError, RPCStatusCode

from forklab.activities.runfork.history_events import TERMINAL_EVENTS, fetched_page, started_page
from forklab.contracts.runfork import (
    FETCH_PREFIX,
    INTERNAL_PREFIX,
    MARKER_MEMO_KEY,
    STEP_DECISION,
    TEAM_RELEASE_SIGNAL,
    StepDecisionInput,
    TeamPart,
)
from forklab.contracts.team import TEAM_UPDATE_ACTIVITY, TeamUpdateCall, parse_update_id
from forklab.experiments.runfork.overrides import ForkSignal
from forklab.experiments.runfork.team_cut import (
    EdgeTreatment,
    Member,
    Message,
    MessageKind,
    Position,
    Team,
    TeamCut,
)

#: A team read by following edges stops growing here.
MAX_MEMBERS = 100

_CHILD_CLOSES = {
    "child_workflow_execution_completed_event_attributes": "completed",
    "child_workflow_execution_failed_event_attributes": "failed",
    "child_workflow_execution_canceled_event_attributes": "canceled",
    "child_workflow_execution_timed_out_event_attributes": "timed out",
    "child_workflow_execution_terminated_event_attributes": "terminated",
}
_CLOSED = {
    WorkflowExecutionStatus.COMPLETED,
    WorkflowExecutionStatus.FAILED,
    WorkflowExecutionStatus.CANCELED,
    WorkflowExecutionStatus.TERMINATED,
    WorkflowExecutionStatus.TIMED_OUT,
}


class TeamReadError(LookupError):
    """A team that cannot be read; the message names the workflow."""


@dataclass
class _Send:
    target: str
    name: str
    at: Position
    #: the signal's arguments as recorded (JSON), or None when they are not JSON
    args: list[Any] | None = None


def _json_args(payloads: Any) -> list[Any] | None:
    try:
        return [json.loads(p.data) if p.data else None for p in payloads]
    except ValueError:
        return None


@dataclass
class _Receipt:
    sender: str | None
    name: str
    at: Position


@dataclass
class _UpdateCall:
    """A ``team.send_update`` step: the update it sends, as its input names it."""

    target: str
    name: str
    activity_id: str


@dataclass
class _Update:
    update_id: str
    name: str
    accepted: Position
    completed: Position | None = None


@dataclass
class _Child:
    workflow_id: str
    workflow_type: str
    started: Position
    closed: Position | None = None


@dataclass
class MemberHistory:
    """What one member's history says about its messages."""

    workflow_id: str
    run_id: str
    workflow_type: str
    task_queue: str = ""
    steps: int = 0
    closed: bool = False
    #: the runs of its continue-as-new chain (1: the latest run is the whole chain)
    runs: int = 1
    parent: str | None = None
    sends: list[_Send] = field(default_factory=list)
    received: list[_Receipt] = field(default_factory=list)
    updates: list[_Update] = field(default_factory=list)
    update_calls: list[_UpdateCall] = field(default_factory=list)
    children: list[_Child] = field(default_factory=list)
    #: activity id of an activity step -> the position its messages take
    activity_positions: dict[str, Position] = field(default_factory=dict)
    end: Position | None = None
    #: workflows this one names in its messages (to follow when finding a team)
    neighbours: set[str] = field(default_factory=set)


def _acting(payloads: Sequence[Payload]) -> bool:
    """Whether a ``forklab.step_decision`` records a refused local activity or child
    workflow (no step) rather than a call the fork's policy decided (a step)."""
    if not payloads:
        return False
    try:
        return StepDecisionInput.model_validate_json(payloads[0].data).acting is not None
    except ValueError:
        return False


class _Walker:
    """Counts steps and places message events while one chain's events go by."""

    def __init__(self, member: MemberHistory, team: TeamPart | None = None) -> None:
        self.m = member
        self.gap: dict[int, int] = defaultdict(int)
        #: steps scheduled and not yet completed: scheduled event id -> activity id (None
        #: for a call the fork's policy decided, whose messages are not its own)
        self.running: dict[int, str | None] = {}
        #: the member is a team fork's: its sends went where these addresses say
        self.team = team
        #: the prefix page the run's start carries (``started_page``), which a fetch's
        #: verdict in its history stands for
        self.in_start: bytes | None = None

    def here(self) -> Position:
        pos = Position(after_step=self.m.steps, seq=self.gap[self.m.steps])
        self.gap[self.m.steps] += 1
        return pos

    def step(self, activity_id: str | None = None) -> None:
        """A step completes (or, at a run's end, is left running): the next number."""
        if activity_id is not None:
            # an activity's messages are part of its step: they sit after what the member
            # saw before the step completed, and a fork holds them when it inherits it
            at = Position(after_step=self.m.steps, seq=self.gap[self.m.steps])
            self.m.activity_positions[activity_id] = at
        self.m.steps += 1

    def end_run(self) -> None:
        """The run's calls that never completed are numbered last, in scheduling order."""
        for activity_id in list(self.running.values()):
            self.step(activity_id)
        self.running.clear()

    def _update_call(self, data: bytes, activity_id: str) -> None:
        try:
            call = TeamUpdateCall.model_validate_json(data)
        except ValueError:
            return  # not ForkLab's form: the receiver's history still names the sender
        target = (self.team.address(call.target) if self.team else None) or call.target
        self.m.update_calls.append(_UpdateCall(target, call.update, activity_id))
        self.m.neighbours.add(target)

    def event(self, ev: HistoryEvent, scheduled: dict[int, str]) -> None:
        kind = ev.WhichOneof("attributes")
        m = self.m
        if kind == "activity_task_scheduled_event_attributes":
            a = ev.activity_task_scheduled_event_attributes
            name = a.activity_type.name
            scheduled[ev.event_id] = name
            if name == STEP_DECISION:
                if not _acting(a.input.payloads):
                    self.running[ev.event_id] = None
            elif not name.startswith(INTERNAL_PREFIX):
                self.running[ev.event_id] = a.activity_id
                if name == TEAM_UPDATE_ACTIVITY and a.input.payloads:
                    self._update_call(a.input.payloads[0].data, a.activity_id)
        elif kind in TERMINAL_EVENTS and getattr(ev, kind).scheduled_event_id in self.running:
            self.step(self.running.pop(getattr(ev, kind).scheduled_event_id))
        elif kind == "activity_task_completed_event_attributes":
            c = ev.activity_task_completed_event_attributes
            if scheduled.get(c.scheduled_event_id) == FETCH_PREFIX and c.result.payloads:
                try:
                    page = fetched_page(c.result.payloads[0].data, self.in_start)
                    if page is None:
                        raise ValueError("a verdict on a page the start does not carry")
                except ValueError:
                    raise TeamReadError(
                        f"{m.workflow_id!r} holds a fork prefix ForkLab cannot read; "
                        "leave it out of the team (--members)"
                    ) from None
                m.steps += len(page.steps)  # a fork's inherited steps
        elif kind == "signal_external_workflow_execution_initiated_event_attributes":
            out = ev.signal_external_workflow_execution_initiated_event_attributes
            target = out.workflow_execution.workflow_id
            args = _json_args(out.input.payloads)
            m.sends.append(_Send(target=target, name=out.signal_name, at=self.here(), args=args))
            m.neighbours.add(target)
        elif kind == "workflow_execution_signaled_event_attributes":
            s = ev.workflow_execution_signaled_event_attributes
            if s.signal_name == TEAM_RELEASE_SIGNAL:
                return  # a team fork's coordinator releasing this member: no team message
            sender = s.external_workflow_execution.workflow_id or None
            m.received.append(_Receipt(sender=sender, name=s.signal_name, at=self.here()))
            if sender:
                m.neighbours.add(sender)
        elif kind == "workflow_execution_update_accepted_event_attributes":
            req = ev.workflow_execution_update_accepted_event_attributes.accepted_request
            up = _Update(update_id=req.meta.update_id, name=req.input.name, accepted=self.here())
            m.updates.append(up)
            caller = parse_update_id(up.update_id)
            if caller is not None:
                m.neighbours.add(caller.workflow_id)
        elif kind == "workflow_execution_update_completed_event_attributes":
            done = ev.workflow_execution_update_completed_event_attributes.meta.update_id
            for up in m.updates:
                if up.update_id == done and up.completed is None:
                    up.completed = self.here()
                    break
        elif kind == "start_child_workflow_execution_initiated_event_attributes":
            init = ev.start_child_workflow_execution_initiated_event_attributes
            child = _Child(init.workflow_id, init.workflow_type.name, self.here())
            m.children.append(child)
            m.neighbours.add(init.workflow_id)
        elif kind in _CHILD_CLOSES:
            wid = getattr(ev, kind).workflow_execution.workflow_id
            for child in m.children:
                if child.workflow_id == wid and child.closed is None:
                    child.closed = self.here()
                    break


async def read_member(client: Client, workflow_id: str) -> MemberHistory:
    """One member's message events, across its continue-as-new chain (latest run last)."""
    if client.data_converter.payload_codec is not None:
        raise TeamReadError(
            "payload codecs are not supported by the team reader yet; read teams with a "
            "client without a codec"
        )
    try:
        desc = await client.get_workflow_handle(workflow_id).describe()
    except RPCError as exc:
        if exc.status is RPCStatusCode.NOT_FOUND:
            raise TeamReadError(f"no workflow {workflow_id!r} in this namespace") from None
        raise
    # each run's history read once, latest first: its first event names the run before it
    chain: list[list[HistoryEvent]] = []
    run_id: str | None = desc.run_id
    while run_id:
        history = await client.get_workflow_handle(workflow_id, run_id=run_id).fetch_history()
        chain.append(list(history.events))
        started = chain[-1][0].workflow_execution_started_event_attributes
        run_id = started.continued_execution_run_id or None
    chain.reverse()
    first = chain[0][0].workflow_execution_started_event_attributes
    member = MemberHistory(
        workflow_id=workflow_id,
        run_id=desc.run_id,
        workflow_type=first.workflow_type.name,
        task_queue=first.task_queue.name,
        runs=len(chain),
        parent=first.parent_workflow_execution.workflow_id or None,
    )
    if member.parent:
        member.neighbours.add(member.parent)
    walker = _Walker(member, _team_of(chain[0][0]))
    for events in chain:
        scheduled: dict[int, str] = {}
        walker.in_start = started_page(events[0])
        for ev in events:
            walker.event(ev, scheduled)
        walker.end_run()
    member.closed = desc.status in _CLOSED
    if member.closed:
        member.end = walker.here()
    return member


def _team_of(first: HistoryEvent) -> TeamPart | None:
    """The team part of the fork marker in a run's first event, when it is a member of a
    team fork (its update calls name original ids, sent to the forks these map them to).
    Read for addresses only: a marker that does not parse is no team part."""
    field = first.workflow_execution_started_event_attributes.memo.fields.get(MARKER_MEMO_KEY)
    if field is None:
        return None
    try:
        marker = json.loads(field.data)
        return TeamPart.model_validate(marker.get("team")) if marker.get("team") else None
    except (ValueError, AttributeError):
        return None


def link(histories: dict[str, MemberHistory]) -> Team:
    """The team these members' histories make, every message placed in both."""
    messages: list[Message] = []
    # signals: the k-th (sender, receiver, name) send is the k-th such receipt
    receipts: dict[tuple[str, str, str], list[Position]] = defaultdict(list)
    for m in histories.values():
        for r in m.received:
            if r.sender in histories:
                receipts[(r.sender, m.workflow_id, r.name)].append(r.at)
            else:
                messages.append(
                    _message(MessageKind.signal, r.name, None, m.workflow_id, None, r.at)
                )
    for m in histories.values():
        counts: dict[tuple[str, str], int] = defaultdict(int)
        for s in m.sends:
            key = (m.workflow_id, s.target, s.name)
            k = counts[(s.target, s.name)]
            counts[(s.target, s.name)] += 1
            got = receipts.get(key, [])
            at = got[k] if k < len(got) else None
            receiver = s.target if s.target in histories else None
            messages.append(_message(MessageKind.signal, s.name, m.workflow_id, receiver, s.at, at))
    # updates: the id names the sending activity
    for m in histories.values():
        for up in m.updates:
            sender = parse_update_id(up.update_id)
            caller = histories.get(sender.workflow_id) if sender is not None else None
            call = (
                caller.activity_positions.get(sender.activity_id)
                if caller is not None and sender is not None
                else None
            )
            if caller is None or call is None:
                messages.append(
                    _message(MessageKind.update, up.name, None, m.workflow_id, None, up.accepted)
                )
                continue
            messages.append(
                _message(
                    MessageKind.update,
                    up.name,
                    caller.workflow_id,
                    m.workflow_id,
                    call,
                    up.accepted,
                )
            )
            if up.completed is not None:
                messages.append(
                    _message(
                        MessageKind.update_result,
                        up.name,
                        m.workflow_id,
                        caller.workflow_id,
                        up.completed,
                        call,
                    )
                )
    # updates to workflows outside the team, as the sending step's input names them
    for m in histories.values():
        for uc in m.update_calls:
            if uc.target not in histories:
                at = m.activity_positions[uc.activity_id]
                messages.append(
                    _message(MessageKind.update, uc.name, m.workflow_id, None, at, None)
                )
    # children
    for m in histories.values():
        for c in m.children:
            child = histories.get(c.workflow_id)
            if child is None or child.parent != m.workflow_id:
                messages.append(
                    _message(
                        MessageKind.child_start,
                        c.workflow_type,
                        m.workflow_id,
                        None,
                        c.started,
                        None,
                    )
                )
                continue
            messages.append(
                _message(
                    MessageKind.child_start,
                    c.workflow_type,
                    m.workflow_id,
                    child.workflow_id,
                    c.started,
                    Position(after_step=-1),
                )
            )
            if child.end is not None:
                messages.append(
                    _message(
                        MessageKind.child_result,
                        c.workflow_type,
                        child.workflow_id,
                        m.workflow_id,
                        child.end,
                        c.closed,
                    )
                )
    numbered = _number(messages)
    members = [
        Member(
            workflow_id=m.workflow_id,
            run_id=m.run_id,
            workflow_type=m.workflow_type,
            steps=m.steps,
            closed=m.closed,
        )
        for m in histories.values()
    ]
    return Team(members=members, messages=numbered)


def _message(
    kind: MessageKind,
    name: str,
    sender: str | None,
    receiver: str | None,
    sent: Position | None,
    received: Position | None,
) -> Message:
    return Message(
        id="-",
        kind=kind,
        name=name,
        sender=sender,
        receiver=receiver,
        sent_at=sent,
        received_at=received,
    )


def _number(messages: list[Message]) -> list[Message]:
    """Ids a person can read: ``kind:name#k:sender->receiver``."""
    seen: dict[str, int] = defaultdict(int)
    out = []
    for msg in messages:
        ends = f"{msg.sender or '(outside)'}->{msg.receiver or '(outside)'}"
        base = f"{msg.kind.value}:{msg.name}:{ends}"
        seen[base] += 1
        out.append(msg.model_copy(update={"id": f"{base}#{seen[base]}"}))
    return out


async def read_team(
    client: Client, member: str, members: list[str] | None = None, max_members: int = MAX_MEMBERS
) -> Team:
    """The team of ``member``: exactly ``members`` (and ``member``) when given; otherwise
    found by following every message edge from ``member``, up to ``max_members``."""
    return link(await read_histories(client, member, members, max_members))


def delivered_at_start(
    histories: dict[str, MemberHistory], cut: TeamCut
) -> dict[str, list[ForkSignal]]:
    """The signals in flight at ``cut`` that its receivers' forks get at their start,
    per receiver, in the order the senders sent them, with the arguments the senders'
    histories recorded. A signal whose arguments cannot be delivered (not JSON, or more
    than one) refuses the team fork: ``TeamReadError`` naming it."""
    out: dict[str, list[ForkSignal]] = defaultdict(list)
    for edge in cut.edges:
        msg = edge.message
        if edge.treatment is not EdgeTreatment.delivered_at_start:
            continue
        if msg.kind is not MessageKind.signal or msg.sender is None or msg.receiver is None:
            raise TeamReadError(
                f"message {msg.id} is in flight at the cut, and only signals can be "
                "delivered to a fork at its start; cut elsewhere"
            )
        send = next(
            (
                s
                for s in histories[msg.sender].sends
                if s.target == msg.receiver and s.name == msg.name and s.at == msg.sent_at
            ),
            None,
        )
        if send is None or send.args is None or len(send.args) > 1:
            raise TeamReadError(
                f"signal {msg.id} is in flight at the cut, and its recorded arguments "
                "cannot be delivered to the receiver's fork (one JSON value at most); "
                "cut elsewhere"
            )
        try:
            out[msg.receiver].append(ForkSignal(name=msg.name, args=send.args))
        except ValueError:
            raise TeamReadError(
                f"signal {msg.id} is in flight at the cut, and its name or arguments "
                "cannot be given to a fork; cut elsewhere"
            ) from None
    return dict(out)


async def read_histories(
    client: Client, member: str, members: list[str] | None = None, max_members: int = MAX_MEMBERS
) -> dict[str, MemberHistory]:
    """The histories of ``member``'s team, read as :func:`read_team` says: the named
    members at once, then each ring of neighbours found at once (the reads are round trips
    to the server; one after another they were most of a small team fork's time)."""
    histories: dict[str, MemberHistory] = {}
    outside: set[str] = set()
    named = [member, *(members or [])]
    explicit = members is not None
    ring = list(dict.fromkeys(named))
    while ring:
        if len(histories) + len(ring) > max_members:
            raise TeamReadError(
                f"the team of {member!r} has more than {max_members} members; name them "
                "with --members"
            )
        read = await asyncio.gather(*(read_member(client, w) for w in ring), return_exceptions=True)
        for wid, outcome in zip(ring, read, strict=True):
            if isinstance(outcome, MemberHistory):
                histories[wid] = outcome
            elif isinstance(outcome, TeamReadError) and wid not in named:
                outside.add(wid)  # a neighbour that does not exist (a signal that failed)
            else:
                raise outcome
        if explicit:
            break
        found = {n for wid in ring if wid in histories for n in histories[wid].neighbours}
        ring = sorted(found - set(histories) - outside)
    return histories
