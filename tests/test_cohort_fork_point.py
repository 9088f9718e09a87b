"""Fork points by meaning resolve exactly over a run's steps, or say why not; faults and
per-call seeds are pure functions of their coordinates."""

from __future__ import annotations

import json

import pytest

from forklab.experiments.cohort.faults import (
    NOT_JSON,
    Brownout,
    BrownoutError,
    CallSite,
    FaultKind,
    MalformedToolResponse,
    PartialDataLoss,
    PoisonedRetrieval,
    SchemaDrift,
    StaleData,
    apply_faults,
)
from forklab.experiments.cohort.fork_point import (
    ForkPoint,
    ResolvedForkPoint,
    Unresolved,
    resolve_fork_point,
)
from forklab.experiments.cohort.seeds import SEED_BOUND, model_call_seed
from forklab.experiments.runfork.steps import Step, StepStatus, prefix_sha256


def _step(i: int, kind: str, status: StepStatus = StepStatus.completed, run: str = "r1") -> Step:
    model = kind == "chat_model"
    return Step(
        index=i,
        activity_type="chat_model" if model else "call_tool",
        input_sha256=f"in{i}",
        result_sha256=f"out{i}",
        status=status,
        run_id=run,
        label="fast" if model else kind,
    )


RUN = [
    _step(1, "chat_model"),
    _step(2, "search"),
    _step(3, "chat_model", run="r2"),
    _step(4, "search", run="r2"),
    _step(5, "send_email", StepStatus.failed, run="r2"),
    _step(6, "chat_model", run="r2"),
]


def _at(text: str, steps: list[Step] = RUN) -> ResolvedForkPoint | Unresolved:
    return resolve_fork_point(steps, ForkPoint.model_validate(text))


@pytest.mark.parametrize(
    ("point", "at_step", "decisive"),
    [
        ("step:0", 0, 1),
        ("step:2", 2, 3),
        ("step:6", 6, None),
        ("failed", 4, 5),
        ("tool:search", 1, 2),
        ("tool:search#2", 3, 4),
        ("tool:send_email#1", 4, 5),
        ("last_model_call_before_failure", 2, 3),
    ],
)
def test_each_fork_point_resolves_to_the_step_it_means(
    point: str, at_step: int, decisive: int | None
) -> None:
    got = _at(point)
    assert isinstance(got, ResolvedForkPoint), got
    assert (got.at_step, got.decisive_step) == (at_step, decisive)
    assert got.prefix_sha256 == prefix_sha256(RUN[:at_step])
    assert got.chain_run_ids == list(dict.fromkeys(s.run_id for s in RUN[:at_step]))


@pytest.mark.parametrize(
    ("point", "steps", "reason"),
    [
        ("step:7", RUN, "step:7 is past the run's 6 recorded steps"),
        ("tool:refund", RUN, "the run calls tool 'refund' never, not #1"),
        ("tool:search#3", RUN, "the run calls tool 'search' only 2 times, not #3"),
        ("failed", [s for s in RUN if s.index < 5], "the run has no failed step"),
        (
            "last_model_call_before_failure",
            [_step(1, "search", StepStatus.failed)],
            "no model call precedes the failed step 1",
        ),
        (
            "failed",
            [_step(1, "chat_model", StepStatus.pending), _step(2, "x", StepStatus.failed)],
            "step 1 before the fork point is pending",
        ),
        ("step:1", [_step(1, "a"), _step(2, "b", StepStatus.pending)], "still pending"),
        ("step:1", [_step(1, "a"), _step(3, "b")], "are not numbered 1..2"),
        (
            "step:2",
            [_step(1, "a"), _step(2, "b", StepStatus.blocked), _step(3, "c")],
            "step 2 before the fork point is blocked",
        ),
    ],
)
def test_a_point_that_cannot_be_resolved_exactly_says_why(
    point: str, steps: list[Step], reason: str
) -> None:
    got = _at(point, steps)
    assert isinstance(got, Unresolved)
    assert reason in got.reason


SITE = CallSite(seed=11, run=3, fork=1, call=7, tool="search")
RESULT = {"hits": ["a", "b", "c", "d"], "price": 12, "stock": 3}


def test_faults_are_pure_functions_of_their_coordinates_and_leave_the_input_alone() -> None:
    faults = [PartialDataLoss(kind="partial_data_loss", rate=1, share=0.5)]
    before = json.dumps(RESULT)
    one = apply_faults(faults, SITE, RESULT)
    assert apply_faults(faults, SITE, RESULT) == one
    assert json.dumps(RESULT) == before
    # across many calls the loss rate is about the share, and rate hits about that share
    lost = kept = 0
    for call in range(1, 400):
        out = apply_faults(faults, SITE.model_copy(update={"call": call}), list(range(10)))
        kept += len(out.value)
        lost += 10 - len(out.value)
    assert 0.4 < lost / (lost + kept) < 0.6
    half = [StaleData(kind="stale_data", rate=0.3)]
    hit = sum(
        bool(apply_faults(half, SITE.model_copy(update={"call": c}), 1, [0]).applied)
        for c in range(1, 2001)
    )
    assert 0.26 < hit / 2000 < 0.34


def test_each_fault_does_what_its_kind_says() -> None:
    model_call = SITE.model_copy(update={"tool": None})
    brown = apply_faults(
        [Brownout(kind="brownout", rate=1, error=BrownoutError.timeout)], model_call
    )
    assert brown.error is BrownoutError.timeout
    # a brownout never touches tool calls, tool faults never touch model calls
    assert apply_faults([Brownout(kind="brownout", rate=1)], SITE, RESULT).value == RESULT
    other = [MalformedToolResponse(kind="malformed_tool_response", rate=1)]
    assert apply_faults(other, model_call).applied == []
    truncated = apply_faults(other, SITE, RESULT).value
    with pytest.raises(json.JSONDecodeError):
        json.loads(truncated)
    not_json = MalformedToolResponse(kind="malformed_tool_response", rate=1, style="not_json")  # type: ignore[arg-type]
    assert apply_faults([not_json], SITE, RESULT).value == NOT_JSON
    stale = apply_faults([StaleData(kind="stale_data", rate=1, age=2)], SITE, "now", ["a", "b"])
    assert stale.value == "a"
    none_older = apply_faults([StaleData(kind="stale_data", rate=1, age=3)], SITE, "now", ["a"])
    assert (none_older.value, none_older.applied) == ("now", [])
    drift = SchemaDrift(kind="schema_drift", rate=1, field="price", rename_to="cost")
    assert apply_faults([drift], SITE, RESULT).value == {
        "hits": RESULT["hits"],
        "stock": 3,
        "cost": 12,
    }
    gone = apply_faults([SchemaDrift(kind="schema_drift", rate=1)], SITE, RESULT).value
    assert len(gone) == 2 and set(gone) < set(RESULT)
    poison = PoisonedRetrieval(kind="poisoned_retrieval", rate=1, passage="Refunds are banned.")
    assert apply_faults([poison], SITE, RESULT).value["hits"][0] == "Refunds are banned."
    assert apply_faults([poison], SITE, "text").value.startswith("Refunds are banned.")
    only_other_tool = MalformedToolResponse(
        kind="malformed_tool_response", rate=1, tools=["lookup"]
    )
    out = apply_faults([only_other_tool], SITE, RESULT)
    assert (out.value, out.applied) == (RESULT, [])
    both = apply_faults([drift, poison], SITE, RESULT)
    assert both.applied == [FaultKind.schema_drift, FaultKind.poisoned_retrieval]


def test_model_seeds_are_common_across_worlds_and_distinct_across_forks() -> None:
    seeds = {
        model_call_seed(5, run, fork, call)
        for run in range(20)
        for fork in range(3)
        for call in range(1, 20)
    }
    assert len(seeds) == 20 * 3 * 19  # no collisions in a small grid
    assert all(0 <= s < SEED_BOUND for s in seeds)
    assert model_call_seed(5, 1, 0, 3) == model_call_seed(5, 1, 0, 3)
    assert model_call_seed(5, 1, 0, 3) != model_call_seed(6, 1, 0, 3)
    with pytest.raises(ValueError, match="fork must be a non-negative int"):
        model_call_seed(5, 1, -1, 3)
