"""The pure rules of an experiment over a cohort, without a server: the order of fork
jobs, an outcome landing in the matrix once, the budget stopping new forks, forks without
an outcome never counted as failures, the shipped scorers,
and the fork policies the signed list gives."""

from __future__ import annotations

import json

import pytest

from forklab.contracts.cohort import ForkOutcome, ForkStatus, cohort_fork_id
from forklab.experiments.cohort.matrix import WorldCosts
from forklab.experiments.cohort.plan import CohortPlan, fork_policies
from forklab.experiments.cohort.report import render_markdown, summarise
from forklab.experiments.cohort.scorers import final_score, score_value
from forklab.experiments.cohort.spec import parse_cohort_spec
from forklab.experiments.runfork.policy import DEFAULT_KEY, ToolPolicy
from forklab.workflows.experiment import cohort_state


def _spec(**budget: object) -> object:
    raw = {
        "id": "unit",
        "hypothesis": {"text": "t"},
        "seed": 3,
        "cohort": {
            "workflow_ids": [f"r{i}" for i in range(8)],
            "limit": 8,
            "fork_at": "failed",
            "forks_per_world": 3,
            "outcome": "forklab.experiments.cohort.scorers:completed",
        },
        "tools": {"search": "live"},
        "worlds": [
            {"name": "baseline", "role": "baseline"},
            {"name": "noop", "role": "placebo", "prompt_patch": {"text": "Be yourself."}},
            {
                "name": "broken",
                "role": "positive_control",
                "faults": [{"kind": "malformed_tool_response", "rate": 1.0}],
                "tool_policies": {"search": "block"},
            },
        ],
        "budget": {"max_forks": 100, **budget},
    }
    return parse_cohort_spec(json.dumps(raw), "s.yaml")


def _outcome(world: str, run: int, fork: int, success: bool, tokens: int = 5) -> ForkOutcome:
    return ForkOutcome(
        run_index=run,
        world=world,
        fork=fork,
        fork_id=f"{world}-{run}-{fork}",
        status=ForkStatus.completed if success else ForkStatus.failed,
        success=success,
        tokens=tokens,
        seconds=1.0,
    )


def test_jobs_go_run_by_run_so_a_stopped_experiment_leaves_whole_pairs() -> None:
    places = [cohort_state.job_place(j, worlds=3, forks=3) for j in range(18)]
    assert [(p.run, p.fork, p.world) for p in places[:4]] == [
        (0, 0, 0),
        (0, 0, 1),
        (0, 0, 2),
        (0, 1, 0),
    ]
    assert {p.run for p in places[:9]} == {0} and {p.run for p in places[9:]} == {1}
    assert len({(p.run, p.fork, p.world) for p in places}) == 18


def test_an_outcome_lands_once_and_errors_are_missing_not_failures() -> None:
    spec = _spec()
    progress = cohort_state.opening(spec, runs=2)
    cohort_state.record(progress, _outcome("noop", 1, 2, True))
    cohort_state.record(progress, _outcome("noop", 1, 2, False))  # a repeat changes nothing
    assert progress.outcomes["noop"][1] == "..1" and progress.done == 1
    assert progress.costs["noop"].tokens == 5
    error = ForkOutcome(run_index=0, world="baseline", fork=0, fork_id="x", status=ForkStatus.error)
    cohort_state.record(progress, error)
    assert progress.outcomes["baseline"][0] == "-.." and progress.missing == 1
    assert cohort_state.final_matrix(progress)["noop"][1] == "--1"


def test_the_budget_stops_new_forks_once_the_tokens_are_spent() -> None:
    spec = _spec(max_model_tokens=10)
    progress = cohort_state.opening(spec, runs=1)
    assert cohort_state.budget_refusal(spec, progress) is None
    cohort_state.record(progress, _outcome("baseline", 0, 0, True, tokens=10))
    assert "max_model_tokens" in (cohort_state.budget_refusal(spec, progress) or "")
    progress.next_job = 8  # jobs 0..7 started; job 8 (run 0, fork 2, world broken) is not
    cohort_state.skip_rest(progress, spec, total=9)
    assert progress.outcomes["broken"][0] == "..-" and progress.skipped == 1
    assert progress.next_job == 9 and not cohort_state.left(progress, 9)


def test_runs_with_a_missing_fork_leave_the_comparison_and_the_report_says_so() -> None:
    spec = _spec()
    base = ["111", "000", "110", "111"]
    outcomes = {
        "baseline": base,
        "noop": ["111", "000", "110", "1-1"],
        "broken": ["000", "000", "000", "000"],
    }
    summary = summarise(spec, outcomes, {"broken": WorldCosts(tokens=40, seconds=8)})
    assert summary.compared_runs == [0, 1, 2] and summary.missing_forks == 1
    broken = next(w for w in summary.worlds if w.world == "broken")
    assert broken.harmed == [0, 2] and broken.rescued == []
    assert broken.cost_per_rescue_tokens is None
    diffs = {"broken": {i: f"forklab diff b{i} w{i}" for i in (0, 2)}, "noop": {}}
    text = render_markdown(spec, summary, ["r0", "r1", "r2", "r3"], diffs)
    assert "1 forks have no outcome; the 1 runs" in text
    assert "- harmed r2: `forklab diff b2 w2`" in text
    with pytest.raises(ValueError, match="nothing can be compared"):
        summarise(spec, {k: ["-11"] * 4 for k in outcomes}, {})


def test_the_shipped_scorers_and_their_answers_are_checked() -> None:
    assert final_score(None, {"score": 0.8}, []) == 0.8
    assert final_score(None, {"score": float("nan")}, []) == 0.0
    assert final_score(None, "not a state", []) == 0.0
    assert score_value(True, 0.5) == (1.0, True)
    assert score_value(0.4, 0.5) == (0.4, False)
    for bad in (1.5, -0.1, float("inf"), "yes", None):
        with pytest.raises(ValueError, match="not a bool or a score"):
            score_value(bad, 0.5)


def test_fork_policies_block_what_the_signed_list_does_not_name_and_keep_models_live() -> None:
    spec = _spec()
    plan = CohortPlan(runs=[], excluded=[], tools={"search": ToolPolicy.live})
    broken = next(w for w in spec.worlds if w.name == "broken")
    policies = fork_policies(plan, broken)
    assert policies[DEFAULT_KEY] is ToolPolicy.block
    assert policies["search"] is ToolPolicy.block  # the world's own change
    assert policies["chat_model"] is ToolPolicy.live
    assert fork_policies(plan, spec.baseline)["search"] is ToolPolicy.live


def test_fork_ids_are_derived_from_the_experiment_run() -> None:
    a = cohort_fork_id("forklab-x/run-1", 3, "noop", 2)
    assert a == cohort_fork_id("forklab-x/run-1", 3, "noop", 2)
    assert a != cohort_fork_id("forklab-x/run-2", 3, "noop", 2)
    assert a.endswith("-r3-noop-k2")


def test_a_run_starts_no_fork_its_running_forks_could_carry_past_the_history_limit() -> None:
    room = cohort_state.EVENTS_PER_FORK * 13 + cohort_state.RUN_END_EVENTS
    assert not cohort_state.history_full(4000 - room - 1, running=12, limit=4000)
    assert cohort_state.history_full(4000 - room, running=12, limit=4000)
    # the more forks run at once, the earlier a run stops starting them
    assert cohort_state.history_full(3000, running=200, limit=4000)
    assert not cohort_state.history_full(3000, running=8, limit=4000)
