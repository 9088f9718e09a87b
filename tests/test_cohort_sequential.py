"""A sequential design over a cohort (``analysis.sequential``), without a server: the design
is signed with the plan (a changed design is a new fingerprint); the waves take the runs in
a seeded order and compare each world with the baseline on majorities (early-stopping
votes compose: a decided majority is the full vote's); the job order follows the waves and
a stopped world's jobs are unspent, never started; the look's decisions (efficacy,
futility, a placebo that runs on); the report's paths and verdicts valid for the design;
and the expected saving the approver sees."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from failed_cohort import failed_plan
from helpers import run_cli

from forklab.activities.runfork.cohort_looks import decide_look, planned_design
from forklab.contracts.cohort import CohortLookInput, PlannedDesign, WorldCounts
from forklab.contracts.experiment import LookResult, WorldLook
from forklab.experiments.cohort.matrix import UNSPENT, WorldCosts
from forklab.experiments.cohort.plan import (
    CohortPlan,
    plan_fingerprint,
)
from forklab.experiments.cohort.report import render_markdown, summarise
from forklab.experiments.cohort.spec import CohortExperimentSpec, parse_cohort_spec
from forklab.experiments.cohort.waves import look_counts, majority, run_order
from forklab.experiments.experiment.waves import Decision
from forklab.workflows.experiment import cohort_state
from forklab.workflows.experiment.cohort_messages import RUNNING


def _spec(
    runs: int = 8, sequential: dict[str, Any] | None = None, **cohort: Any
) -> CohortExperimentSpec:
    raw = {
        "id": "seq",
        "hypothesis": {"text": "t", "expected": {"outage": "increase"}},
        "seed": 5,
        "cohort": {
            "workflow_ids": [f"r{i}" for i in range(runs)],
            "limit": runs,
            "fork_at": "failed",
            "forks_per_world": 3,
            "outcome": "forklab.experiments.cohort.scorers:completed",
            **cohort,
        },
        "worlds": [
            {"name": "baseline", "role": "baseline"},
            {"name": "noop", "role": "placebo", "prompt_patch": {"text": "Be yourself."}},
            {"name": "outage", "role": "treatment", "faults": [{"kind": "brownout", "rate": 1}]},
            {"name": "patch", "role": "treatment", "prompt_patch": {"text": "Check twice."}},
        ],
        "budget": {"max_forks": 100_000},
        "analysis": {}
        if sequential is None
        else {"sequential": {"looks": 2, "spending": "pocock", **sequential}},
    }
    return parse_cohort_spec(json.dumps(raw), "s.yaml")


def _plan(runs: int) -> CohortPlan:
    return failed_plan(runs, "r")


def test_the_design_is_signed_with_the_plan() -> None:
    plan = _plan(8)
    fixed = plan_fingerprint(_spec(), plan)
    two = plan_fingerprint(_spec(sequential={}), plan)
    # a design is a new plan to approve; any change of it is another
    assert len({fixed, two}) == 2
    changed = {
        plan_fingerprint(_spec(sequential={"looks": 4}), plan),
        plan_fingerprint(_spec(sequential={"spending": "obrien_fleming"}), plan),
        plan_fingerprint(_spec(sequential={"futility": 0.0}), plan),
    }
    assert len(changed) == 3 and not changed & {fixed, two}
    assert plan_fingerprint(_spec(sequential={}), plan) == two


def test_waves_take_the_runs_in_a_seeded_order_and_compare_majorities() -> None:
    order = run_order(5, 40)
    assert sorted(order) == list(range(40)) and order != tuple(range(40))
    assert run_order(5, 40) == order and run_order(6, 40) != order
    assert majority("110", 3) is True and majority("11~", 3) is True  # a vote decided early
    assert majority("1-1", 3) is None and majority("/", 1) is None
    base = ["111", "111", "000", "111", "1-1"]
    world = ["000", "111", "111", "00~", "000"]
    # run 4 has a missing fork: it leaves the pair
    assert look_counts(base, world, (0, 1, 2, 3, 4), [2, 5], 3) == ([0, 1], [1, 2])
    assert look_counts(base, world, (2, 1, 0, 3, 4), [2, 5], 3) == ([1, 1], [0, 2])


def test_jobs_follow_the_waves_and_a_stopped_world_starts_no_fork() -> None:
    spec = _spec(sequential={})
    progress = cohort_state.opening(spec, runs=8)
    order = run_order(spec.seed, 8)
    wave = cohort_state.wave_jobs(spec, progress, 0)
    assert wave == 4 * 4 * 3  # the first 4 runs of the order, 4 worlds, 3 forks
    jobs = []
    while (job := cohort_state.take(progress, spec, wave)) is not None:
        jobs.append(job)
    assert len(jobs) == wave and not cohort_state.left(progress, wave)
    assert {cohort_state.place(spec, progress, j).run for j in jobs} == set(order[:4])
    assert all(progress.outcomes[w][r] == RUNNING * 3 for w in progress.outcomes for r in order[:4])
    # the look stops the outage world: its forks of the next wave are unspent, not started
    cohort_state.record_look(
        progress,
        LookResult(
            look=1,
            worlds=[
                WorldLook(
                    world="outage",
                    look=1,
                    episodes=4,
                    rescue=0,
                    harm=4,
                    statistic=-2.0,
                    boundary=1.9,
                    decision=Decision.efficacy,
                )
            ],
        ),
    )
    assert cohort_state.stopped_worlds(progress) == {"outage"} and cohort_state.live(spec, progress)
    total = cohort_state.job_count(8, 4, 3)
    second = []
    while (job := cohort_state.take(progress, spec, total)) is not None:
        second.append(job)
    places = [cohort_state.place(spec, progress, j) for j in second]
    assert len(second) == 4 * 3 * 3 and all(spec.worlds[p.world].name != "outage" for p in places)
    assert progress.unspent == 4 * 3
    assert all(progress.outcomes["outage"][r] == UNSPENT * 3 for r in order[4:])
    # a look recorded twice (a retried or replayed look) is recorded once
    cohort_state.record_look(progress, LookResult(look=1, worlds=[]))
    assert len(progress.looks) == 1


def test_the_rest_is_unspent_once_every_world_but_the_baseline_stopped() -> None:
    spec = _spec(sequential={})
    progress = cohort_state.opening(spec, runs=8)
    wave = cohort_state.wave_jobs(spec, progress, 0)
    while cohort_state.take(progress, spec, wave) is not None:
        pass
    stops = [
        WorldLook(
            world=w,
            look=1,
            episodes=4,
            rescue=0,
            harm=0,
            statistic=0.0,
            boundary=2.0,
            decision=Decision.efficacy,
        )
        for w in ("noop", "outage", "patch")
    ]
    cohort_state.record_look(progress, LookResult(look=1, worlds=stops))
    assert not cohort_state.live(spec, progress)
    total = cohort_state.job_count(8, 4, 3)
    cohort_state.leave_unspent(progress, spec, total)
    assert progress.unspent == 4 * 4 * 3 and progress.next_job == total


def _look(
    spec: CohortExperimentSpec, look: int, counts: dict[str, tuple[list[int], list[int]]]
) -> LookResult:
    return decide_look(
        CohortLookInput(
            spec=spec,
            runs=16,
            look=look,
            counts={w: WorldCounts(rescue=r, harm=h) for w, (r, h) in counts.items()},
        )
    )


def test_a_look_stops_a_big_effect_for_efficacy_an_inert_treatment_for_futility() -> None:
    spec = _spec(16, sequential={})
    result = _look(spec, 0, {"noop": ([0], [0]), "outage": ([0], [6]), "patch": ([0], [0])})
    decided = {w.world: w.decision for w in result.worlds}
    # the placebo's check is "inside the noise floor": it runs on (a boundary would stop it)
    assert decided == {
        "noop": Decision.continue_,
        "outage": Decision.efficacy,
        "patch": Decision.futility,
    }
    (outage,) = [w for w in result.worlds if w.world == "outage"]
    assert outage.statistic == pytest.approx(-(6**0.5), abs=1e-6) and outage.boundary > 2.0
    # a placebo that crosses a boundary has failed its check: it stops there
    crossed = _look(spec, 1, {"noop": ([0, 0], [2, 9])})
    assert [w.decision for w in crossed.worlds] == [Decision.efficacy]
    with pytest.raises(Exception, match="counts for another look"):
        _look(spec, 1, {"noop": ([0], [0])})


def test_the_report_shows_each_path_and_the_designs_verdicts() -> None:
    spec = _spec(16, sequential={})
    order = run_order(spec.seed, 16)
    first = set(order[:8])
    outcomes = {
        "baseline": ["111"] * 16,
        "noop": ["111"] * 16,
        "outage": ["000" if r in first else UNSPENT * 3 for r in range(16)],
        "patch": ["111" if r in first else UNSPENT * 3 for r in range(16)],
    }
    costs = {"outage": WorldCosts(forks=24, tokens=2400, seconds=48.0)}
    summary = summarise(spec, outcomes, costs)
    paths = {d.path.world: d for d in summary.design}
    assert paths["outage"].path.stopped is Decision.efficacy
    assert paths["outage"].verdict.value == "harms" and paths["outage"].as_expected
    assert (paths["outage"].unspent_forks, paths["outage"].unspent_tokens) == (24, 2400.0)
    assert paths["patch"].path.stopped is Decision.futility
    assert paths["patch"].verdict.value == "inside_noise_floor"
    assert paths["noop"].path.stopped is Decision.completed and len(paths["noop"].path.looks) == 2
    assert summary.unspent_forks == 48 and summary.compared_runs == sorted(first)
    # the noise floor reads every run the baseline ran, not only those every world ran
    assert summary.floor.runs == 16
    # the verdicts are the design's, never the fixed test's on the runs it chose
    judged = {w.world: w.judgement for w in summary.worlds}
    assert (
        judged["outage"].text == paths["outage"].text
        and "sequential design" in judged["outage"].text
    )
    diffs = {w.world: {i: "forklab diff" for i in w.rescued + w.harmed} for w in summary.worlds}
    text = render_markdown(spec, summary, [f"r{i}" for i in range(16)], diffs)
    assert "## Sequential design" in text and "48 forks were not run" in text
    assert "| outage | 1 | 8 | 0 | 8 | -2.828 |" in text and "| efficacy |" in text
    assert "| noop | 2 | 16 | 0 | 0 |" in text
    assert "On the 8 runs every world ran" in text
    # no design: no section, and no unspent
    plain = summarise(_spec(16), {w: ["111"] * 16 for w in outcomes}, {})
    assert plain.design == [] and "Sequential design" not in render_markdown(
        _spec(16), plain, [f"r{i}" for i in range(16)], {}
    )


def test_the_approver_sees_the_design_and_its_expected_saving() -> None:
    spec = _spec(40, sequential={"looks": 4})
    design = planned_design(spec, 40)
    assert isinstance(design, PlannedDesign) and design.wave_ends == [10, 20, 30, 40]
    assert 0.0 < design.saved_if_inert < 1.0 and 0.0 < design.saved_if_effect < 1.0
    assert design.saved_if_inert_low <= design.saved_if_inert <= design.saved_if_inert_high
    assert planned_design(spec, 40) == design  # seeded: the same figure every time
    assert planned_design(_spec(40), 40) is None
    # fewer resolved runs than looks: the plan cannot follow the design, capacity refuses
    refusal = planned_design(spec, 3)
    assert isinstance(refusal, str) and "4 looks need at least as many runs" in refusal


def test_forklab_plan_of_a_cohort_spec_prints_the_design_and_its_expected_saving(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    spec = tmp_path / "cohort.json"
    raw = _spec(40, sequential={"looks": 4}).model_dump(mode="json")
    spec.write_text(json.dumps(raw))
    code, out, err = run_cli(capsys, "plan", str(spec))
    assert code == 0, err
    assert "its rehearsal reads the cohort on the Temporal server" in out
    assert "at most 40 runs x 4 worlds x 3 forks = 480 forks" in out
    assert "looks after runs 10, 20, 30, 40 (seeded order)" in out
    assert "expected compute saved: " in out and "if every world is inert" in out
    code, out, _ = run_cli(capsys, "plan", str(spec), "--json")
    shown = json.loads(out)
    assert code == 0 and shown["design"]["wave_ends"] == [10, 20, 30, 40]
    expected = planned_design(_spec(40, sequential={"looks": 4}), 40)
    assert isinstance(expected, PlannedDesign)
    assert shown["design"] == expected.model_dump(mode="json")
    # a cohort spec that cannot be read is still one sentence and exit 2
    raw["analysis"]["sequential"]["looks"] = 41
    spec.write_text(json.dumps(raw))
    code, _, err = run_cli(capsys, "plan", str(spec))
    assert code == 2 and "analysis.sequential.looks: 41 looks need at least as many runs" in err
