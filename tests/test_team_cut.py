"""The consistent cut of a team, on hand-built histories and on generated ones.

Hand-built: a researcher, a writer and a reviewer exchanging a signal and an update (a
cut that must move the writer back, one that cascades to the reviewer, an in-flight
signal), a parent with a child, frozen members and messages from and to outside. The
property tests simulate teams whose messages follow real time and check that the
computed cut is consistent and the greatest consistent one (against every cut, by brute
force); on histories that do not follow real time the cut is still the greatest, or the
request is refused exactly when no consistent cut keeps the requested step.
"""

from __future__ import annotations

import itertools
from datetime import UTC, datetime

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from forklab.experiments.runfork.policy import ToolPolicy
from forklab.experiments.runfork.receipt import BoundaryMode, ForkReceipt
from forklab.experiments.runfork.team_cut import (
    ABSENT,
    EdgeStatus,
    EdgeTreatment,
    Member,
    Message,
    MessageKind,
    Point,
    Position,
    Team,
    TeamCutError,
    consistent_cut,
    is_consistent,
    violates,
)
from forklab.experiments.runfork.team_receipt import (
    OverrideKind,
    SlotRole,
    TeamOverride,
    TeamReceipt,
    plan_team_fork,
    with_member_receipts,
)


def at(after_step: int, seq: int = 0) -> Position:
    return Position(after_step=after_step, seq=seq)


def msg(
    mid: str,
    sender: str | None,
    receiver: str | None,
    sent: Position | None,
    received: Position | None,
    kind: MessageKind = MessageKind.signal,
) -> Message:
    return Message(
        id=mid,
        kind=kind,
        name=mid,
        sender=sender,
        receiver=receiver,
        sent_at=sent,
        received_at=received,
    )


def research_team() -> Team:
    """researcher R (5 steps): its conclusion is step 3, then it signals ``findings`` to
    the writer W; W (3 steps) drafts at step 1, asks the reviewer V (2 steps) for a
    review by an update at step 2 (V accepts before its first step and answers after
    it), and signals ``progress`` back to R, which R receives after its 4th step. After
    its 5th step R signals an ``addendum`` that W receives before its 3rd step.

    W's update goes out from an activity (step 2): the request and its answer are part
    of that step, placed after the message events W saw before scheduling it."""
    return Team(
        members=[
            Member(workflow_id="R", run_id="r1", steps=5, closed=True),
            Member(workflow_id="W", run_id="w1", steps=3, closed=True),
            Member(workflow_id="V", run_id="v1", steps=2, closed=True),
        ],
        messages=[
            msg("findings", "R", "W", at(3), at(0)),
            msg("progress", "W", "R", at(1), at(4)),
            msg("review", "W", "V", at(1, 1), at(0), MessageKind.update),
            msg("review-answer", "V", "W", at(1), at(1, 1), MessageKind.update_result),
            msg("addendum", "R", "W", at(5), at(2)),
        ],
    )


def status(cut_edges: list, mid: str) -> tuple[EdgeStatus, EdgeTreatment]:
    e = next(e for e in cut_edges if e.message.id == mid)
    return e.status, e.treatment


def test_a_cut_before_the_senders_message_moves_the_receiver_back_and_cascades() -> None:
    team = research_team()
    cut = consistent_cut(team, "R", 3)
    assert cut.points() == {"R": Point(step=3), "W": Point(step=0), "V": Point(step=0)}
    assert is_consistent(team, cut.points())
    # the writer received the findings the researcher's fork has not sent yet
    assert cut.of("W").moved_by == ["findings"]
    # the reviewer accepted the writer's update the writer's fork has not sent yet
    assert cut.of("V").moved_by == ["review"]
    assert status(cut.edges, "findings") == (EdgeStatus.after_cut, EdgeTreatment.regenerated)
    assert status(cut.edges, "review") == (EdgeStatus.after_cut, EdgeTreatment.regenerated)
    assert [e.message.id for e in cut.edges if e.crosses] == []


def test_a_later_cut_keeps_what_it_can_and_delivers_what_is_in_flight() -> None:
    team = research_team()
    cut = consistent_cut(team, "R", 4)
    # the addendum (sent after R's 5th step) reached W before its 3rd step: W stops there
    assert cut.of("W").point == Point(step=2)
    assert cut.of("W").moved_by == ["addendum"]
    assert cut.of("W").label() == "at step 2 of 3"
    # W at step 2 still holds its update, so V and its answer stay whole
    assert cut.of("V").whole and cut.of("V").moved_by == []
    # W sent progress inside its cut; R receives it after its 4th step: in flight
    assert status(cut.edges, "progress") == (
        EdgeStatus.in_flight,
        EdgeTreatment.delivered_at_start,
    )
    assert [e.message.id for e in cut.edges if e.crosses] == ["progress"]
    assert status(cut.edges, "findings") == (EdgeStatus.inherited, EdgeTreatment.in_prefix)
    assert is_consistent(team, cut.points())


def test_without_the_fixpoint_the_cut_would_be_inconsistent() -> None:
    """The first move alone (W back before the findings) leaves V holding an update W's
    fork has not sent: only iterating moves V too."""
    team = research_team()
    one_pass = {"R": Point(step=3), "W": Point(step=0), "V": team.member("V").whole}
    assert not is_consistent(team, one_pass)
    bad = [m.id for m in team.messages if violates(m, one_pass)]
    assert bad == ["review"]
    # listed the other way round, one pass over the messages would stop there
    reversed_team = Team(members=team.members, messages=team.messages[::-1])
    assert consistent_cut(reversed_team, "R", 3).points() == consistent_cut(team, "R", 3).points()


def test_the_update_answer_keeps_the_handler_whole_while_the_caller_holds_it() -> None:
    team = research_team()
    # W at step 2 holds the answer: V must hold its sending, so V stays whole
    assert consistent_cut(team, "W", 2).of("V").whole
    # W at step 1 has not sent the update: V goes back before accepting it
    cut = consistent_cut(team, "W", 1)
    assert cut.of("V").point == Point(step=0) and cut.of("V").moved_by == ["review"]
    assert status(cut.edges, "review") == (EdgeStatus.after_cut, EdgeTreatment.regenerated)


def test_a_handler_cannot_be_cut_inside_an_update_its_caller_sent_from_an_activity() -> None:
    """V at step 1 has accepted W's update but not answered; W would have to be cut in
    the middle of the activity that sent it, which no fork can inherit: refused, naming
    the chain that moves V back."""
    with pytest.raises(
        TeamCutError,
        match=r"cannot cut 'V' at step 1: update 'review' from 'W' reached it before that "
        r"step, and the cut has to place 'W' before sending it \(W was moved back by "
        r"review-answer\)",
    ):
        consistent_cut(research_team(), "V", 1)


def child_team() -> Team:
    """P starts child C after its step 1 and waits for it; C (2 steps) finishes and P
    gets its result before its step 2."""
    return Team(
        members=[
            Member(workflow_id="P", run_id="p1", steps=2, closed=True),
            Member(workflow_id="C", run_id="c1", steps=2, closed=True),
        ],
        messages=[
            msg("start", "P", "C", at(1), at(-1), MessageKind.child_start),
            msg("result", "C", "P", at(2), at(1, 1), MessageKind.child_result),
        ],
    )


def test_a_parent_cut_before_the_child_start_leaves_the_child_absent() -> None:
    cut = consistent_cut(child_team(), "P", 1)
    assert cut.of("C").point == ABSENT and cut.of("C").absent
    assert cut.of("C").label() == "not started (its parent's fork starts it)"
    assert status(cut.edges, "start") == (EdgeStatus.after_cut, EdgeTreatment.regenerated)


def test_a_parent_holding_the_childs_result_keeps_the_whole_child() -> None:
    cut = consistent_cut(child_team(), "P", 2)
    assert cut.of("C").whole
    assert all(e.status is EdgeStatus.inherited for e in cut.edges)


def test_forking_inside_a_child_cuts_the_parent_between_the_start_and_the_result() -> None:
    cut = consistent_cut(child_team(), "C", 1)
    assert cut.of("P").point == Point(step=1, events=1)
    assert status(cut.edges, "start") == (EdgeStatus.inherited, EdgeTreatment.in_prefix)
    assert status(cut.edges, "result") == (EdgeStatus.after_cut, EdgeTreatment.regenerated)


def test_frozen_members_change_how_messages_are_treated_not_where_the_cut_is() -> None:
    team = research_team()
    cut = consistent_cut(team, "R", 3, frozen=["W"])
    assert cut.points() == consistent_cut(team, "R", 3).points()
    assert cut.of("W").frozen
    # W never continues: what it sent after its cut is never sent in the fork world
    assert status(cut.edges, "progress") == (
        EdgeStatus.after_cut,
        EdgeTreatment.never_sent_frozen_sender,
    )
    # in flight to a frozen member: it never receives it
    cut = consistent_cut(team, "W", 2, frozen=["R"], bounds={"R": 4})
    assert cut.of("R").point == Point(step=4)
    assert status(cut.edges, "progress") == (
        EdgeStatus.in_flight,
        EdgeTreatment.dropped_frozen_receiver,
    )
    assert status(cut.edges, "addendum") == (
        EdgeStatus.after_cut,
        EdgeTreatment.never_sent_frozen_sender,
    )


def test_messages_from_and_to_outside_the_team() -> None:
    team = Team(
        members=[Member(workflow_id="A", run_id="a", steps=3)],
        messages=[
            msg("go", None, "A", None, at(0)),
            msg("late-go", None, "A", None, at(2)),
            msg("notify", "A", None, at(1), None),
            msg("notify-late", "A", None, at(2), None),
        ],
    )
    cut = consistent_cut(team, "A", 2)
    assert status(cut.edges, "go") == (EdgeStatus.inherited, EdgeTreatment.in_prefix)
    assert status(cut.edges, "late-go") == (
        EdgeStatus.after_cut,
        EdgeTreatment.outside_not_delivered,
    )
    assert status(cut.edges, "notify") == (EdgeStatus.inherited, EdgeTreatment.in_prefix)
    assert status(cut.edges, "notify-late") == (
        EdgeStatus.after_cut,
        EdgeTreatment.outside_blocked,
    )


def test_bad_requests_name_the_member_and_what_to_do() -> None:
    team = research_team()
    with pytest.raises(TeamCutError, match=r"'X' is not a member of the team \(members: R, W, V\)"):
        consistent_cut(team, "X", 1)
    with pytest.raises(TeamCutError, match=r"'R' has 5 steps; the step to cut it at must be 0..5"):
        consistent_cut(team, "R", 6)
    with pytest.raises(TeamCutError, match="cannot also be frozen"):
        consistent_cut(team, "R", 2, frozen=["R"])
    with pytest.raises(TeamCutError, match="'Q' is not a member"):
        consistent_cut(team, "R", 2, frozen=["Q"])


def test_a_history_against_real_time_is_refused_rather_than_moving_the_request() -> None:
    # B received "x" before its step 1, sent by A after A's step 2; A received "y" before
    # its step 1, sent by B after its step 1: cutting A at step 2 would force A back
    team = Team(
        members=[
            Member(workflow_id="A", run_id="a", steps=3),
            Member(workflow_id="B", run_id="b", steps=3),
        ],
        messages=[msg("x", "A", "B", at(2), at(0)), msg("y", "B", "A", at(1), at(0))],
    )
    with pytest.raises(TeamCutError, match=r"cannot cut 'A' at step 2: signal 'y' from 'B'"):
        consistent_cut(team, "A", 2)


def test_a_team_that_does_not_add_up_is_refused() -> None:
    with pytest.raises(ValidationError, match="named twice"):
        Team(members=[Member(workflow_id="A", run_id="1", steps=1)] * 2)
    with pytest.raises(ValidationError, match="'Z' is not a member"):
        Team(
            members=[Member(workflow_id="A", run_id="1", steps=1)],
            messages=[msg("m", "A", "Z", at(0), at(0))],
        )
    with pytest.raises(ValidationError, match=r"past 'A'.s 1 steps"):
        Team(
            members=[Member(workflow_id="A", run_id="1", steps=1)],
            messages=[msg("m", "A", None, at(4), None)],
        )


# --- the group receipt ---------------------------------------------------------------


def _fork_receipt(fork_id: str, parent: str) -> ForkReceipt:
    return ForkReceipt(
        fork_workflow_id=fork_id,
        name=fork_id,
        requested_step=1,
        resolved_step=1,
        parent_workflow_id=parent,
        parent_run_id="run",
        source_run_id="run",
        lineage=[parent],
        boundary=BoundaryMode.exact,
        prefix_sha256="0" * 64,
        restorable=True,
        why="test",
        tool_policies={"*": ToolPolicy.auto},
        requested_by="tester",
        created_at=datetime(2026, 1, 1, tzinfo=UTC),
    )


def _plan(**kw: object) -> TeamReceipt:
    cut = consistent_cut(research_team(), "R", 4, frozen=["V"])
    return plan_team_fork(
        cut,
        team_fork_id="tf-1",
        tool_policies={"*": ToolPolicy.auto, "charge_customer": ToolPolicy.block},
        requested_by="tester",
        created_at=datetime(2026, 1, 1, tzinfo=UTC),
        **kw,  # type: ignore[arg-type]
    )


def test_the_group_receipt_names_the_cut_the_edges_and_a_slot_per_member() -> None:
    over = TeamOverride(member="R", kind=OverrideKind.result, step=4, value={"content": "x"})
    plan = _plan(overrides=[over], model="slow")
    assert plan.requested_member == "R" and plan.requested_step == 4
    roles = {s.workflow_id: s.role for s in plan.slots}
    # W is at step 2 (forked), V is frozen, R is forked at its step
    assert roles == {"R": SlotRole.forked, "W": SlotRole.forked, "V": SlotRole.frozen}
    assert plan.addresses == {"R": "tf-1/R", "W": "tf-1/W"}
    assert [e.message.id for e in plan.crossing] == ["progress"]
    assert all(s.receipt is None for s in plan.slots)
    final = with_member_receipts(
        plan, {"R": _fork_receipt("tf-1/R", "R"), "W": _fork_receipt("tf-1/W", "W")}
    )
    assert final.slot("R").receipt is not None and final.slot("V").receipt is None
    # immutable, and it reads back as written
    with pytest.raises(ValidationError):
        final.name = "other"  # type: ignore[misc]
    assert TeamReceipt.model_validate_json(final.model_dump_json()) == final


def test_the_group_receipt_refuses_what_does_not_fit() -> None:
    with pytest.raises(ValueError, match="does not continue"):
        _plan(overrides=[TeamOverride(member="V", kind=OverrideKind.result, step=1)])
    with pytest.raises(ValueError, match="team fork name"):
        cut = consistent_cut(research_team(), "R", 4)
        plan_team_fork(
            cut,
            team_fork_id="../bad",
            tool_policies={},
            requested_by="t",
            created_at=datetime(2026, 1, 1, tzinfo=UTC),
        )
    plan = _plan()
    with pytest.raises(ValueError, match="do not match the forked members"):
        with_member_receipts(plan, {"R": _fork_receipt("tf-1/R", "R")})
    with pytest.raises(ValueError, match="is for 'tf-1/elsewhere'"):
        with_member_receipts(
            plan,
            {"R": _fork_receipt("tf-1/elsewhere", "R"), "W": _fork_receipt("tf-1/W", "W")},
        )
    with pytest.raises(ValidationError, match="needs a signal name"):
        TeamOverride(member="R", kind=OverrideKind.signal)
    with pytest.raises(ValidationError, match="needs a step"):
        TeamOverride(member="R", kind=OverrideKind.input)


def test_a_closed_member_kept_whole_is_inherited_not_forked() -> None:
    cut = consistent_cut(child_team(), "P", 2)
    plan = plan_team_fork(
        cut,
        team_fork_id="tf-2",
        tool_policies={},
        requested_by="t",
        created_at=datetime(2026, 1, 1, tzinfo=UTC),
    )
    assert plan.slot("C").role is SlotRole.inherited and plan.addresses == {"P": "tf-2/P"}
    cut = consistent_cut(child_team(), "P", 1)
    plan = plan_team_fork(
        cut,
        team_fork_id="tf-3",
        tool_policies={},
        requested_by="t",
        created_at=datetime(2026, 1, 1, tzinfo=UTC),
    )
    assert plan.slot("C").role is SlotRole.absent and plan.slot("C").fork_workflow_id is None


# --- properties ----------------------------------------------------------------------


@st.composite
def causal_teams(draw: st.DrawFn) -> Team:
    """A team simulated in real time: members take steps, send signals and updates and
    receive what was sent to them; the last member may be a child of the first."""
    n = draw(st.integers(2, 4))
    names = [f"m{i}" for i in range(n)]
    child = draw(st.booleans())
    started = [not (child and i == n - 1) for i in range(n)]
    steps = [0] * n
    gap = [0] * n
    pending: list[list[tuple[str, str, MessageKind, Position]]] = [[] for _ in range(n)]
    messages: list[Message] = []
    closed = [False] * n

    def here(i: int) -> Position:
        pos = Position(after_step=steps[i], seq=gap[i])
        gap[i] += 1
        return pos

    counter = itertools.count()
    for _ in range(draw(st.integers(0, 14))):
        i = draw(st.integers(0, n - 1))
        if not started[i] or closed[i]:
            if child and i == n - 1 and not started[i] and draw(st.booleans()):
                started[i] = True
                messages.append(
                    Message(
                        id=f"start{next(counter)}",
                        kind=MessageKind.child_start,
                        name="child",
                        sender=names[0],
                        receiver=names[i],
                        sent_at=here(0),
                        received_at=Position(after_step=-1),
                    )
                )
            continue
        action = draw(st.sampled_from(["step", "signal", "receive", "update", "end"]))
        live = [j for j in range(n) if j != i and started[j] and not closed[j]]
        if action == "step":
            steps[i] += 1
            gap[i] = 0
        elif action == "signal" and live:
            j = draw(st.sampled_from(live))
            pending[j].append((f"s{next(counter)}", names[i], MessageKind.signal, here(i)))
        elif action == "receive" and pending[i]:
            k = draw(st.integers(0, len(pending[i]) - 1))
            mid, sender, kind, sent = pending[i].pop(k)
            messages.append(
                Message(
                    id=mid,
                    kind=kind,
                    name=mid,
                    sender=sender,
                    receiver=names[i],
                    sent_at=sent,
                    received_at=here(i),
                )
            )
        elif action == "update" and live:
            # sent from an activity: the call is the caller's next step
            j = draw(st.sampled_from(live))
            call = Position(after_step=steps[i], seq=gap[i])
            steps[i] += 1
            gap[i] = 0
            mid = f"u{next(counter)}"
            messages.append(
                Message(
                    id=mid,
                    kind=MessageKind.update,
                    name=mid,
                    sender=names[i],
                    receiver=names[j],
                    sent_at=call,
                    received_at=here(j),
                )
            )
            messages.append(
                Message(
                    id=mid + "-answer",
                    kind=MessageKind.update_result,
                    name=mid,
                    sender=names[j],
                    receiver=names[i],
                    sent_at=here(j),
                    received_at=call,
                )
            )
        elif action == "end" and child and i == n - 1:
            closed[i] = True
            pending[0].append(("r", names[i], MessageKind.child_result, here(i)))
    # what was sent and not received stays in flight
    for j in range(n):
        for mid, sender, kind, sent in pending[j]:
            mid = f"{mid}{next(counter)}" if mid == "r" else mid
            messages.append(
                Message(
                    id=mid,
                    kind=kind,
                    name=mid,
                    sender=sender,
                    receiver=names[j],
                    sent_at=sent,
                    received_at=None,
                )
            )
    members = [
        Member(workflow_id=names[i], run_id=f"run{i}", steps=steps[i], closed=closed[i])
        for i in range(n)
    ]
    return Team(members=members, messages=messages)


def candidates(team: Team, workflow_id: str) -> list[Point]:
    """Every distinct cut of one member: absent (a child), each step with each number
    of the message events after it, and the whole run."""
    m = team.member(workflow_id)
    counts: dict[int, int] = {}
    for msg_ in team.messages:
        for end, pos in ((msg_.sender, msg_.sent_at), (msg_.receiver, msg_.received_at)):
            if end == workflow_id and pos is not None and pos.after_step >= 0:
                counts[pos.after_step] = max(counts.get(pos.after_step, 0), pos.seq + 1)
    out = (
        [ABSENT]
        if any(
            x.kind is MessageKind.child_start and x.receiver == workflow_id for x in team.messages
        )
        else []
    )
    for s in range(m.steps + 1):
        out += [Point(step=s, events=e) for e in range(max(1, counts.get(s, 0)))]
    out.append(m.whole)
    return out


def every_consistent_cut(team: Team, member: str, at_step: int) -> list[dict[str, Point]]:
    others = [m.workflow_id for m in team.members if m.workflow_id != member]
    found = []
    for combo in itertools.product(*(candidates(team, o) for o in others)):
        points = dict(zip(others, combo, strict=True))
        points[member] = Point(step=at_step)
        if is_consistent(team, points):
            found.append(points)
    return found


@settings(max_examples=150, deadline=None)
@given(team=causal_teams(), data=st.data())
def test_the_cut_of_a_real_time_team_is_consistent_and_the_greatest(
    team: Team, data: st.DataObject
) -> None:
    assert is_consistent(team, {m.workflow_id: m.whole for m in team.members})
    # the order messages are listed in says nothing
    team = Team(members=team.members, messages=data.draw(st.permutations(team.messages)))
    starters = [m for m in team.members if m.workflow_id == "m0" or m.steps > 0]
    member = data.draw(st.sampled_from(starters))
    at_step = data.draw(st.integers(0, member.steps))
    cut = consistent_cut(team, member.workflow_id, at_step)
    points = cut.points()
    assert points[member.workflow_id] == Point(step=at_step)
    assert is_consistent(team, points)
    for other in every_consistent_cut(team, member.workflow_id, at_step):
        for wid, p in other.items():
            assert p.key() <= points[wid].key(), (wid, p, points[wid])
    # every message is classified, and only consistent in-flight ones cross the cut
    for e in cut.edges:
        m = e.message
        if e.crosses:
            assert m.sender is not None and points[m.sender].holds(m.sent_at)
            assert m.receiver is not None and not points[m.receiver].holds(m.received_at)


@st.composite
def arbitrary_teams(draw: st.DrawFn) -> Team:
    """Messages placed anywhere, real time or not."""
    n = draw(st.integers(2, 3))
    steps = [draw(st.integers(0, 3)) for _ in range(n)]
    members = [Member(workflow_id=f"m{i}", run_id=str(i), steps=steps[i]) for i in range(n)]
    messages = []
    for k in range(draw(st.integers(0, 6))):
        a, b = draw(st.permutations(range(n)))[:2]
        sent = Position(after_step=draw(st.integers(0, steps[a])), seq=draw(st.integers(0, 1)))
        received = draw(
            st.none()
            | st.builds(Position, after_step=st.integers(0, steps[b]), seq=st.integers(0, 1))
        )
        messages.append(msg(f"x{k}", f"m{a}", f"m{b}", sent, received))
    return Team(members=members, messages=messages)


@settings(max_examples=150, deadline=None)
@given(team=arbitrary_teams(), data=st.data())
def test_any_team_gets_the_greatest_cut_or_a_refusal_exactly_when_none_exists(
    team: Team, data: st.DataObject
) -> None:
    member = data.draw(st.sampled_from(team.members))
    at_step = data.draw(st.integers(0, member.steps))
    found = every_consistent_cut(team, member.workflow_id, at_step)
    try:
        cut = consistent_cut(team, member.workflow_id, at_step)
    except TeamCutError:
        assert found == []
        return
    points = cut.points()
    assert is_consistent(team, points)
    assert found
    for other in found:
        assert all(p.key() <= points[w].key() for w, p in other.items())
