"""Matching a fork's calls to the parent's by what they are (``call_match``), pure."""

from __future__ import annotations

import pytest

from forklab.experiments.runfork.call_match import (
    CallKey,
    Divergence,
    PrefixMatcher,
    in_flight,
    keyed,
    stalled_message,
)
from forklab.experiments.runfork.steps import Step, StepStatus


def _step(index: int, call: int, kind: str, digest: str, after: int = 0) -> Step:
    return Step(
        index=index,
        activity_type=kind,
        input_sha256=digest,
        status=StepStatus.completed,
        run_id="r",
        call=call,
        scheduled_after=after,
        result_b64="eA==",
    )


# plan (1), three searches scheduled 2, 3, 4 completing 4, 3, 2, then write (5)
RUN = [
    _step(1, 1, "plan", "p"),
    _step(2, 4, "search", "c", after=1),
    _step(3, 3, "search", "b", after=1),
    _step(4, 2, "search", "a", after=1),
    _step(5, 5, "write", "w", after=4),
]


def test_identical_calls_are_numbered_in_scheduling_order() -> None:
    twins = [_step(1, 2, "search", "same"), _step(2, 1, "search", "same")]
    by_key = keyed(twins, with_input=True)
    assert by_key[CallKey("search", "same", 1)].index == 2
    assert by_key[CallKey("search", "same", 2)].index == 1
    # without positions (older records) the step order is the scheduling order
    old = [s.model_copy(update={"call": None}) for s in twins]
    assert keyed(old, with_input=False)[CallKey("search", "", 1)].index == 1


def test_in_flight_are_the_calls_scheduled_before_the_boundary_completed() -> None:
    assert [s.index for s in in_flight(RUN, 2)] == [3, 4]
    assert all(s.result_b64 is None for s in in_flight(RUN, 2))
    assert [s.index for s in in_flight(RUN, 4)] == [5]  # scheduled right after step 4


def test_a_fork_inside_a_parallel_group_takes_inherited_runs_in_flight_live() -> None:
    m = PrefixMatcher(RUN[:2], in_flight(RUN, 2), exact=True)
    assert m.take(m.key("plan", "p")) is RUN[0]
    a = m.key("search", "a")
    assert m.take(a) is None
    m.check_live(a)  # in flight at the boundary: runs live
    b = m.key("search", "b")
    assert m.take(b) is None
    m.check_live(b)
    c = m.take(m.key("search", "c"))
    assert c is RUN[1] and m.owed == 0
    # delivered in the parent's completion order
    assert m.turn_of(RUN[0]) and not m.turn_of(RUN[1])
    m.delivered()
    assert m.turn_of(RUN[1])


def test_a_call_the_parent_did_not_have_in_flight_is_a_divergence() -> None:
    m = PrefixMatcher(RUN[:3], in_flight(RUN, 3), exact=True)
    m.take(m.key("plan", "p"))
    with pytest.raises(Divergence, match=r"at step 2 \(search\) the fork's input differs"):
        m.check_live(m.key("search", "zzz"))
    with pytest.raises(Divergence, match="at step 2 the parent called search and the fork"):
        m.check_live(m.key("write", "w"))
    # approximately: inputs may drift, the k-th call of a type is the parent's k-th
    loose = PrefixMatcher(RUN[:3], in_flight(RUN, 3), exact=False)
    assert loose.take(loose.key("plan", "drifted")) is RUN[0]
    assert loose.take(loose.key("search", "x")) is None  # the 1st search ran in flight
    loose.check_live(CallKey("search", "", 1))


def test_fork_points_by_meaning_resolve_over_a_run_s_steps() -> None:
    from forklab.experiments.runfork.fork_at import ForkAtError, not_forkable, resolve_at
    from forklab.experiments.runfork.receipt import PrefixEvent

    run = [
        _step(1, 1, "chat_model", "m1"),
        _step(2, 2, "search", "s1"),
        _step(3, 3, "chat_model", "m2"),
        _step(4, 4, "search", "s2"),
        _step(5, 5, "charge", "c").model_copy(update={"status": StepStatus.failed}),
    ]
    assert resolve_at("tool:search", run)[1] == 3  # the last search is re-decided
    assert resolve_at("tool:search#1", run)[1] == 1
    assert resolve_at("failed", run)[1] == 4
    assert resolve_at("last_model_call_before_failure", run)[1] == 2
    assert resolve_at("step:2", run)[1] == 2
    with pytest.raises(ForkAtError, match="only 2 times, not #3"):
        resolve_at("tool:search#3", run)
    with pytest.raises(ForkAtError, match="is no fork point"):
        resolve_at("tool:", run)
    # a local activity cannot be served: no exact fork past it (a signal is redelivered)
    marks = not_forkable(run[:4], [PrefixEvent(kind="local activity", after_step=2)], 0)
    assert [marks[i] is None for i in (1, 2, 3, 4)] == [True, True, False, False]
    marks = not_forkable(run[:4], [PrefixEvent(kind="signal", after_step=2)], 0)
    assert all(marks[i] is None for i in (1, 2, 3, 4))


def test_the_next_result_owed_is_named_until_the_fork_asks_for_it() -> None:
    """What the stall watch reads: the next inherited result in the parent's order the
    fork has not asked for, and a counter that moves with every ask and hand-over."""
    m = PrefixMatcher(RUN[:4], [], exact=True)
    assert m.next_unasked() == RUN[0] and m.progress == 0
    assert m.take(m.key("plan", "p")) == RUN[0]
    assert m.next_unasked() is None and m.progress == 1  # asked, not yet handed over
    m.delivered()
    # the searches: "a" (step 4) asked, "c" (step 2, next in turn) not
    assert m.take(m.key("search", "a")) == RUN[3]
    assert m.next_unasked() == RUN[1] and m.progress == 3
    assert stalled_message(RUN[1]).startswith("at step 2 (search) the parent had made this call")
