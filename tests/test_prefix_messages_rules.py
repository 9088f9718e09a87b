"""Where a fork hands inherited signals and updates over again (pure rules of
``experiments/runfork/prefix_messages.py``)."""

from __future__ import annotations

from forklab.experiments.runfork.prefix_messages import (
    MessageKind,
    MessageQueue,
    PrefixMessage,
    inside,
)
from forklab.experiments.runfork.steps import Step, StepStatus


def _four_steps() -> list[Step]:
    return [
        Step(index=i, activity_type="t", input_sha256="x", status=StepStatus.completed, run_id="r")
        for i in range(1, 5)
    ]


def _msg(position: int, name: str = "s") -> PrefixMessage:
    return PrefixMessage(kind=MessageKind.signal, name=name, position=position)


def test_a_message_is_due_once_the_results_before_it_are_handed_over() -> None:
    queue = MessageQueue([_msg(0, "a"), _msg(2, "b"), _msg(2, "c")])
    assert queue.due(0) is not None and queue.clear_before(1) is False
    queue.delivered()
    # step 1 and 2 may go; step 3 waits for the two messages the parent got before it
    assert queue.clear_before(1) and queue.clear_before(2) and not queue.clear_before(3)
    assert queue.due(1) is None
    assert queue.due(2) == _msg(2, "b")
    queue.delivered()
    queue.delivered()
    assert queue.owed == 0 and queue.clear_before(3) and queue.due(9) is None


def test_pages_split_the_messages_without_losing_or_repeating_one() -> None:
    messages = [_msg(p, str(p)) for p in (0, 1, 1, 3, 4, 5)]
    # a fork at step 5 fetched in two pages: steps 1..3, then 4..5
    first, second = inside(messages, 0, 3), inside(messages, 3, 5)
    assert [m.position for m in first] == [0, 1, 1]
    assert [m.position for m in second] == [3, 4]  # position 5 came after step 5


def _events(*kinds: str) -> list[object]:
    """History events of the given kinds, numbered from 1 (``activity`` schedules one,
    ``done`` completes the last one scheduled)."""
    from temporalio.api.history.v1 import HistoryEvent

    out: list[HistoryEvent] = []
    scheduled = timer = 0
    for i, kind in enumerate(kinds, start=1):
        ev = HistoryEvent(event_id=i)
        if kind == "activity":
            ev.activity_task_scheduled_event_attributes.activity_type.name = f"tool{i}"
            scheduled = i
        elif kind == "done":
            ev.activity_task_completed_event_attributes.scheduled_event_id = scheduled
        elif kind == "started":
            ev.workflow_task_started_event_attributes.SetInParent()
        elif kind == "completed":
            ev.workflow_task_completed_event_attributes.SetInParent()
        elif kind == "timer":
            ev.timer_started_event_attributes.start_to_fire_timeout.FromMilliseconds(300)
            timer = i
        elif kind == "fired":
            ev.timer_fired_event_attributes.started_event_id = timer
        elif kind == "signal":
            ev.workflow_execution_signaled_event_attributes.signal_name = f"sig{i}"
        elif kind == "update":
            accepted = ev.workflow_execution_update_accepted_event_attributes
            accepted.accepted_request.input.name = f"upd{i}"
            accepted.accepted_request.meta.update_id = f"u{i}"
        out.append(ev)
    return out


def test_a_message_s_position_counts_the_results_of_earlier_activations_only() -> None:
    """The SDK applies an activation's signals and updates before its activity results:
    a signal that arrived with step 1's result reached the workflow before it."""
    from forklab.activities.runfork.history_events import RunInputs, parse_events

    events = _events(
        "signal",  # 1: with the start, before anything
        "started",
        "completed",
        "activity",  # 2-4: step 1 scheduled
        "done",
        "signal",  # 5-6: step 1's result and a signal, one activation
        "started",
        "completed",
        "activity",  # 7-9: step 2 scheduled
        "signal",  # 10: after step 1's activation, before step 2's result
        "started",
        "completed",
        "update",  # 11-13: an update accepted in that activation
        "done",
        "started",
        "completed",  # 14-16: step 2
        "update",  # 17: accepted in the activation that handed step 2 over
    )
    inputs = RunInputs()
    steps, others = parse_events(events, 0, "run", inputs)  # type: ignore[arg-type]
    found = inputs.messages
    assert [s.index for s in steps] == [1, 2]
    assert [(m.name, m.position) for m in found] == [
        ("sig1", 0),
        ("sig6", 0),
        ("sig10", 1),
        ("upd13", 1),
        ("upd17", 1),
    ]
    assert [m.update_id for m in found if m.kind is MessageKind.update] == ["u13", "u17"]
    assert [(e.kind, e.after_step) for e in others] == [
        ("signal", 0),
        ("signal", 0),
        ("signal", 1),
        ("update", 1),
        ("update", 1),
    ]


def test_a_child_inside_the_prefix_is_exact_only_when_it_closed_inside_it() -> None:
    from forklab.experiments.runfork.approximations import ApproximationKind
    from forklab.experiments.runfork.receipt import (
        INPUT_DRIFT,
        BoundaryError,
        BoundaryMode,
        PrefixEvent,
        resolve_boundary,
    )

    steps = _four_steps()
    child = PrefixEvent(
        kind="child workflow", after_step=1, name="C", child_id="p-c", closed_after=2
    )
    assert resolve_boundary(steps, [child], 3, BoundaryMode.exact).restorable
    try:
        resolve_boundary(steps, [child], 2, BoundaryMode.exact)
    except BoundaryError as exc:
        assert "child workflow C (p-c), started after step 1, is still running at step 2" in str(
            exc
        )
    else:
        raise AssertionError("a child running at the boundary forked exactly")
    ended = child.model_copy(update={"closed_after": None, "ended": "terminated"})
    approx = resolve_boundary(steps, [ended], 4, BoundaryMode.approximate)
    assert [(a.kind, a.step, a.detail) for a in approx.approximations] == [
        (
            ApproximationKind.child_rerun,
            1,
            "child workflow C (p-c), started after step 1, ended terminated, which a fork "
            "cannot be handed",
        )
    ]
    # every approximate prefix: other drift shows only when the fork asks
    assert INPUT_DRIFT in approx.why and not approx.restorable
    timer = PrefixEvent(kind="timer", after_step=1, name="0.3s")
    assert resolve_boundary(steps, [timer], 4, BoundaryMode.exact).restorable


def test_a_signal_sent_inside_the_prefix_is_inherited_only_once_acknowledged_there() -> None:
    """A send acknowledged inside the prefix is not sent again; one acknowledged at or after
    the boundary would be, so it is refused, approximate too: it would reach a workflow
    outside the fork."""
    from forklab.experiments.runfork.receipt import (
        SENT_SIGNAL_KIND,
        BoundaryError,
        BoundaryMode,
        PrefixEvent,
        resolve_boundary,
    )

    steps = _four_steps()
    sent = PrefixEvent(kind=SENT_SIGNAL_KIND, after_step=1, name="go", child_id="w", closed_after=2)
    assert resolve_boundary(steps, [sent], 3, BoundaryMode.exact).restorable
    assert resolve_boundary(steps, [sent], 1, BoundaryMode.exact).restorable  # sent after it
    for mode in (BoundaryMode.exact, BoundaryMode.approximate):
        try:
            resolve_boundary(steps, [sent], 2, mode)
        except BoundaryError as exc:
            assert str(exc).endswith(
                "at step 2: signal 'go' to w, sent after step 1, was not acknowledged by step 2; "
                "a fork would send it again"
            ), exc
        else:
            raise AssertionError(f"a send acknowledged past the boundary forked ({mode})")


def test_in_one_activation_a_signal_comes_before_a_timer_fire() -> None:
    """The SDK applies an activation's signals before its timer fires and results, even a
    signal the history records after the fire."""
    from forklab.activities.runfork.history_events import RunInputs, parse_events

    events = _events(
        "started",
        "completed",
        "activity",  # 1-3: step 1 scheduled
        "done",
        "timer",  # 4-5: step 1's result; the workflow sleeps
        "started",
        "completed",  # 6-7 (the timer's start is in this task's commands)
        "fired",
        "signal",  # 8-9: one activation: the fire, then a signal
        "started",
        "completed",  # 10-11
    )
    inputs = RunInputs()
    parse_events(events, 0, "run", inputs)  # type: ignore[arg-type]
    assert [(m.kind, m.position) for m in inputs.messages] == [
        (MessageKind.signal, 1),
        (MessageKind.timer, 1),
    ]
