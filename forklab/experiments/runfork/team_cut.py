"""The consistent cut of an agent team: where each member can be forked so that no fork
holds a message its sender's fork has not sent yet.

A team is a set of workflow runs (members) and the messages between them, each placed in
its sender's and its receiver's history by a :class:`Position`: the number of steps
(activity calls, numbered in the order they completed, as ``forklab steps`` numbers them)
the member had completed before the event, as ``PrefixEvent.after_step`` counts, and the
event's place among the member's message events after that many steps.
A member's :class:`Point` says how much of its history a fork inherits:

- ``Point(step=N, events=k)``: steps 1..N, every message event after fewer than N steps,
  and the first k message events after step N. ``events=0`` is a fork "at step N" (step
  N+1 runs live, as for a single fork); ``events>0`` lands between two messages that reach
  the member before its next step — a parent between its child's start and its result;
- ``Point(step=steps + 1)`` (:meth:`Member.whole`): the whole recorded run, its close
  included;
- ``Point(step=-1)`` (:data:`ABSENT`): nothing; only a child workflow can be absent, when
  its parent's fork has not started it yet (the parent's fork starts it again, live).

A message is *inside* a member's cut when its position comes before the member's point.
The cut is **consistent** when every message received inside its receiver's cut was sent
inside its sender's: no fork starts knowing something from the future.
:func:`consistent_cut` finds the greatest consistent cut below the starting points (the
requested member at its step, everyone else whole): each violation moves the receiver back
to just before the receipt, which can make the receiver's own sends violate, and so on to
a fixpoint. Moves only lower points and the consistent cuts are closed under the pointwise
maximum, so the fixpoint is the maximal consistent cut: every member keeps all it can.

Pure: histories arrive parsed (``forklab.activities.runfork.team_history`` reads them).
"""

from __future__ import annotations

from collections import defaultdict, deque
from collections.abc import Iterable, Mapping
from enum import StrEnum

from pydantic import BaseModel, ConfigDict, Field, model_validator


class Position(BaseModel):
    """Where a message event sits in a member's history.

    A message an activity carries (an update sent by a step, and its answer) is part of
    that step: it sits after the message events the member saw before the step
    completed, and a fork holds it exactly when it inherits the step."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    #: steps completed before the event; -1 for a child's start (before everything)
    after_step: int = Field(ge=-1)
    #: the event's place among the member's message events after the same steps
    seq: int = Field(default=0, ge=0)

    def key(self) -> tuple[int, int]:
        return (self.after_step, self.seq)


class Point(BaseModel):
    """How much of a member's history a fork inherits (see the module docstring)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    step: int = Field(ge=-1)
    events: int = Field(default=0, ge=0)

    def key(self) -> tuple[int, int]:
        return (self.step, self.events)

    def holds(self, position: Position | None) -> bool:
        """Whether an event at ``position`` is inherited by a fork at this point."""
        return position is not None and position.key() < self.key()


#: The point of a child workflow its parent's fork has not started yet.
ABSENT = Point(step=-1)


def just_before(position: Position) -> Point:
    """The greatest point that does not hold an event at ``position``."""
    return Point(step=position.after_step, events=position.seq)


class MessageKind(StrEnum):
    #: a signal from one workflow to another (or from outside the team)
    signal = "signal"
    #: an update request, from the caller to the workflow whose handler runs it
    update = "update"
    #: the update's answer, from the handler's workflow back to the caller
    update_result = "update_result"
    #: a parent starting a child workflow (received before anything else in the child)
    child_start = "child_start"
    #: a child's close (result or failure), received by its parent
    child_result = "child_result"


class TeamCutError(ValueError):
    """A cut that cannot be computed as asked; the message names the member and cause."""


class Member(BaseModel):
    """One workflow run of the team, as its history says."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    workflow_id: str = Field(min_length=1)
    run_id: str
    workflow_type: str = ""
    #: steps (activity calls) recorded so far
    steps: int = Field(ge=0)
    #: the run has closed: its history is final
    closed: bool = False

    @property
    def whole(self) -> Point:
        """The point of the whole recorded run."""
        return Point(step=self.steps + 1)


class Message(BaseModel):
    """One message between two workflows, placed in both histories.

    ``sender``/``receiver`` are member workflow ids, or None for someone outside the team
    (a client, a person, a workflow not named as a member)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    #: stable within the team, e.g. ``signal:findings#1:researcher->writer``
    id: str = Field(min_length=1)
    kind: MessageKind
    #: the signal or update name, or the child's workflow type
    name: str
    sender: str | None
    receiver: str | None
    #: where the sender sent it (None: the sender is outside)
    sent_at: Position | None = None
    #: where the receiver received it; None: not received (yet), or outside
    received_at: Position | None = None

    @model_validator(mode="after")
    def _placed(self) -> Message:
        if self.sender is not None and self.sent_at is None:
            raise ValueError(f"message {self.id}: a member's send needs its position")
        if self.sender is None and self.receiver is None:
            raise ValueError(f"message {self.id}: neither end is a member of the team")
        return self

    @property
    def internal(self) -> bool:
        return self.sender is not None and self.receiver is not None


class Team(BaseModel):
    """Members and the messages between them (and from or to outside)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    members: list[Member] = Field(min_length=1)
    messages: list[Message] = Field(default_factory=list)

    @model_validator(mode="after")
    def _coherent(self) -> Team:
        ids = [m.workflow_id for m in self.members]
        if len(set(ids)) != len(ids):
            raise ValueError("a workflow is named twice among the team's members")
        steps = {m.workflow_id: m.steps for m in self.members}
        seen: set[str] = set()
        for msg in self.messages:
            if msg.id in seen:
                raise ValueError(f"message id {msg.id!r} is used twice")
            seen.add(msg.id)
            for end, pos in ((msg.sender, msg.sent_at), (msg.receiver, msg.received_at)):
                if end is None:
                    continue
                if end not in steps:
                    raise ValueError(f"message {msg.id}: {end!r} is not a member of the team")
                if pos is not None and pos.after_step > steps[end]:
                    raise ValueError(
                        f"message {msg.id}: position after step {pos.after_step} is past "
                        f"{end!r}'s {steps[end]} steps"
                    )
        return self

    def member(self, workflow_id: str) -> Member:
        for m in self.members:
            if m.workflow_id == workflow_id:
                return m
        names = ", ".join(m.workflow_id for m in self.members)
        raise TeamCutError(f"{workflow_id!r} is not a member of the team (members: {names})")


class MemberCut(BaseModel):
    """Where one member is cut."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    workflow_id: str
    run_id: str
    steps: int = Field(ge=0)
    point: Point
    frozen: bool = False
    closed: bool = False
    #: the ids of the messages that moved this member back, in the order they did
    moved_by: list[str] = Field(default_factory=list)

    @property
    def whole(self) -> bool:
        return self.point.step > self.steps

    @property
    def absent(self) -> bool:
        return self.point.step < 0

    @property
    def at_step(self) -> int:
        """The last step a fork of this member inherits."""
        return max(0, min(self.point.step, self.steps))

    def label(self) -> str:
        if self.absent:
            return "not started (its parent's fork starts it)"
        if self.whole:
            return f"whole run ({self.steps} steps)"
        extra = self.point.events
        more = f" and the next {extra} message event{'s' if extra > 1 else ''}" if extra else ""
        return f"at step {self.point.step} of {self.steps}{more}"


class EdgeStatus(StrEnum):
    #: sent and received inside the cut: part of both prefixes
    inherited = "inherited"
    #: sent inside the sender's cut, received after the receiver's (or never): in flight
    in_flight = "in_flight"
    #: sent after the sender's cut: no fork inherits it; a live fork may send it again
    after_cut = "after_cut"


class EdgeTreatment(StrEnum):
    #: part of the prefixes: the receiver's fork gets it at the same point of its history
    in_prefix = "in_prefix"
    #: in flight: delivered to the receiver's fork at its start, and recorded
    delivered_at_start = "delivered_at_start"
    #: in flight to a frozen member: it never continues, so it never receives it
    dropped_frozen_receiver = "dropped_frozen_receiver"
    #: after the cut: left to the live forks, which address their sends to the forks
    regenerated = "regenerated"
    #: after the cut of a frozen sender: it never continues, so it never sends it
    never_sent_frozen_sender = "never_sent_frozen_sender"
    #: from outside the team, after the receiver's cut: the fork does not get it (a fork
    #: hears only its team; deliver it with a signal override if it should)
    outside_not_delivered = "outside_not_delivered"
    #: to outside the team, after the sender's cut: a fork sending it again would reach
    #: a workflow outside the fork world, so the send is blocked
    outside_blocked = "outside_blocked"


class EdgeCrossing(BaseModel):
    """One message and what the cut does with it."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    message: Message
    status: EdgeStatus
    treatment: EdgeTreatment

    @property
    def crosses(self) -> bool:
        """Sent before the cut and received after it (the cut's crossing edges)."""
        return self.status is EdgeStatus.in_flight


class TeamCut(BaseModel):
    """The consistent cut of a team for a requested member and step."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    requested_member: str
    requested_step: int = Field(ge=0)
    members: list[MemberCut]
    edges: list[EdgeCrossing]

    def of(self, workflow_id: str) -> MemberCut:
        for m in self.members:
            if m.workflow_id == workflow_id:
                return m
        raise TeamCutError(f"{workflow_id!r} is not a member of the cut")

    def points(self) -> dict[str, Point]:
        return {m.workflow_id: m.point for m in self.members}


def violates(msg: Message, points: Mapping[str, Point]) -> bool:
    """Whether ``msg`` is received inside its receiver's cut but sent after its sender's."""
    if msg.sender is None or msg.receiver is None:
        return False
    return points[msg.receiver].holds(msg.received_at) and not points[msg.sender].holds(msg.sent_at)


def is_consistent(team: Team, points: Mapping[str, Point]) -> bool:
    """No message between members comes from the future of its sender's cut."""
    return not any(violates(msg, points) for msg in team.messages)


def _start_points(
    team: Team, member: str, at_step: int, bounds: Mapping[str, int] | None
) -> dict[str, Point]:
    requested = team.member(member)
    if not 0 <= at_step <= requested.steps:
        raise TeamCutError(
            f"{member!r} has {requested.steps} steps; the step to cut it at must be "
            f"0..{requested.steps}"
        )
    points = {m.workflow_id: m.whole for m in team.members}
    for workflow_id, bound in (bounds or {}).items():
        m = team.member(workflow_id)
        if not 0 <= bound <= m.steps:
            raise TeamCutError(
                f"the bound for {workflow_id!r} is step {bound}; it has {m.steps} steps"
            )
        points[workflow_id] = min(points[workflow_id], Point(step=bound), key=Point.key)
    points[member] = Point(step=at_step)
    return points


def consistent_cut(
    team: Team,
    member: str,
    at_step: int,
    *,
    frozen: Iterable[str] = (),
    bounds: Mapping[str, int] | None = None,
) -> TeamCut:
    """The maximal consistent cut with ``member`` at step ``at_step`` and every other
    member at most its whole run (or the step ``bounds`` gives it).

    ``frozen`` members are cut like the others (their state at the cut is what the fork
    world keeps) but never continue: that changes how messages to and from them are
    treated. When keeping the cut consistent would move ``member`` itself back, the
    request is refused with the message that forces it: the requested boundary is never
    quietly replaced."""
    frozen_set = set(frozen)
    for workflow_id in frozen_set:
        team.member(workflow_id)
    if member in frozen_set:
        raise TeamCutError(f"{member!r} is the member to fork; it cannot also be frozen")
    points = _start_points(team, member, at_step, bounds)
    moved_by: dict[str, list[str]] = defaultdict(list)
    sent_by: dict[str, list[Message]] = defaultdict(list)
    for msg in team.messages:
        if msg.internal:
            assert msg.sender is not None
            sent_by[msg.sender].append(msg)
    work: deque[Message] = deque(m for m in team.messages if m.internal)
    while work:
        msg = work.popleft()
        if not violates(msg, points):
            continue
        assert msg.receiver is not None and msg.received_at is not None
        points[msg.receiver] = just_before(msg.received_at)
        moved_by[msg.receiver].append(msg.id)
        work.extend(sent_by[msg.receiver])
    if points[member] != Point(step=at_step):
        raise TeamCutError(_moved_requested(team, member, at_step, moved_by))
    cuts = [
        MemberCut(
            workflow_id=m.workflow_id,
            run_id=m.run_id,
            steps=m.steps,
            point=points[m.workflow_id],
            frozen=m.workflow_id in frozen_set,
            closed=m.closed,
            moved_by=moved_by.get(m.workflow_id, []),
        )
        for m in team.members
    ]
    edges = [classify(msg, points, frozen_set) for msg in team.messages]
    return TeamCut(requested_member=member, requested_step=at_step, members=cuts, edges=edges)


def _moved_requested(
    team: Team, member: str, at_step: int, moved_by: Mapping[str, list[str]]
) -> str:
    msg = next(m for m in team.messages if m.id == moved_by[member][0])
    sender = msg.sender
    why = (
        f"{sender} was moved back by {', '.join(moved_by[sender])}"
        if sender is not None and moved_by.get(sender)
        else "the histories do not follow real time, or a bound is too low"
    )
    return (
        f"cannot cut {member!r} at step {at_step}: {msg.kind.value} {msg.name!r} from "
        f"{sender!r} reached it before that step, and the cut has to place {sender!r} "
        f"before sending it ({why})"
    )


def classify(msg: Message, points: Mapping[str, Point], frozen: set[str]) -> EdgeCrossing:
    """What a consistent cut (``points``) does with one message."""
    sent = msg.sender is None or points[msg.sender].holds(msg.sent_at)
    received = msg.receiver is not None and points[msg.receiver].holds(msg.received_at)
    if msg.sender is None:  # from outside the team
        status = EdgeStatus.inherited if received else EdgeStatus.after_cut
        treatment = EdgeTreatment.in_prefix if received else EdgeTreatment.outside_not_delivered
    elif not sent:
        status = EdgeStatus.after_cut
        if msg.sender in frozen:
            treatment = EdgeTreatment.never_sent_frozen_sender
        elif msg.receiver is None:
            treatment = EdgeTreatment.outside_blocked
        else:
            treatment = EdgeTreatment.regenerated
    elif received or msg.receiver is None:  # to outside, inside the cut: it happened once
        status, treatment = EdgeStatus.inherited, EdgeTreatment.in_prefix
    else:
        status = EdgeStatus.in_flight
        treatment = (
            EdgeTreatment.dropped_frozen_receiver
            if msg.receiver in frozen
            else EdgeTreatment.delivered_at_start
        )
    return EdgeCrossing(message=msg, status=status, treatment=treatment)
