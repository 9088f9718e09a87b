"""Early-stopping majority votes over a run's k forks (``cohort.stop_when_decided``),
without a server: which jobs start, wait or are saved; that the forks run are exactly
those a vote in fork order stops at, whatever order concurrent forks finish in; that the
baseline runs every fork; that the rate test over voted rows keeps its error rate in A/A
experiments; the saved count in the report; and the plan stored as an artifact."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from failed_cohort import failed_plan

from forklab.activities.runfork.cohort_plans import CohortPlans
from forklab.activities.stores.artifacts import ArtifactError, LocalArtifactStore
from forklab.contracts.cohort import ForkOutcome, ForkStatus
from forklab.experiments.cohort.matrix import SAVED
from forklab.experiments.cohort.plan import CohortPlan
from forklab.experiments.cohort.report import render_markdown, summarise
from forklab.experiments.cohort.spec import CohortExperimentSpec, parse_cohort_spec
from forklab.experiments.cohort.votes import as_voted, vote_of
from forklab.workflows.experiment import cohort_state
from forklab.workflows.experiment.cohort_messages import RUNNING


def _spec(k: int = 3, stop: bool = True, runs: int = 8) -> CohortExperimentSpec:
    raw = {
        "id": "votes",
        "hypothesis": {"text": "t"},
        "seed": 3,
        "cohort": {
            "workflow_ids": [f"r{i}" for i in range(runs)],
            "limit": runs,
            "fork_at": "failed",
            "forks_per_world": k,
            "stop_when_decided": stop,
            "outcome": "forklab.experiments.cohort.scorers:completed",
        },
        "worlds": [
            {"name": "baseline", "role": "baseline"},
            {"name": "noop", "role": "placebo", "prompt_patch": {"text": "Be yourself."}},
        ],
        "budget": {"max_forks": 100_000},
    }
    return parse_cohort_spec(json.dumps(raw), "s.yaml")


def _done(world: str, run: int, fork: int, success: bool) -> ForkOutcome:
    return ForkOutcome(
        run_index=run,
        world=world,
        fork=fork,
        fork_id=f"{world}-{run}-{fork}",
        status=ForkStatus.completed if success else ForkStatus.failed,
        success=success,
    )


def test_as_voted_stops_where_the_majority_is_decided() -> None:
    assert as_voted("11~", 3) == "111" and as_voted("00~", 3) == "000"
    assert as_voted("101", 3) == "101" and as_voted("010", 3) == "010"
    assert as_voted("110", 3) == "111"  # the third fork was not needed
    assert as_voted("111~~", 5) == "11111" and as_voted("10100", 5) == "10100"
    assert as_voted("1-1", 3) == "1-1"  # a missing fork: the run leaves the comparison
    assert vote_of("1", 3) is None and vote_of("11", 3) is True and vote_of("00", 3) is False


def test_a_decided_fork_is_saved_an_open_one_waits_and_the_baseline_runs_every_fork() -> None:
    spec = _spec()
    progress = cohort_state.opening(spec, runs=1)
    total = cohort_state.job_count(1, 2, 3)  # jobs: (fork 0: baseline, noop), (fork 1 ...)
    started = [cohort_state.take(progress, spec, total) for _ in range(4)]
    assert started == [0, 1, 2, 3]
    assert progress.outcomes == {"baseline": [f"{RUNNING * 2}."], "noop": [f"{RUNNING * 2}."]}
    # fork 2 of the baseline starts at once; fork 2 of noop waits for forks 0 and 1
    assert cohort_state.take(progress, spec, total) == 4
    assert cohort_state.take(progress, spec, total) is None
    assert progress.waiting == [5] and cohort_state.left(progress, total)
    cohort_state.record(progress, _done("noop", 0, 0, True))
    assert cohort_state.take(progress, spec, total) is None  # fork 1 still running
    cohort_state.record(progress, _done("noop", 0, 1, True))
    assert cohort_state.take(progress, spec, total) is None  # decided: saved, none left
    assert progress.outcomes["noop"] == [f"11{SAVED}"] and progress.saved == 1
    assert not cohort_state.left(progress, total)


def _simulate(spec: CohortExperimentSpec, runs: int, p: list[float], seed: int) -> dict:
    """Run the experiment's scheduling with ``limit`` forks at once, finishing them in a
    random order with outcomes drawn per run; the progress at the end."""
    rng = random.Random(seed)
    k, worlds = spec.cohort.forks_per_world, len(spec.worlds)
    total = cohort_state.job_count(runs, worlds, k)
    progress = cohort_state.opening(spec, runs)
    running: list[int] = []
    while cohort_state.left(progress, total) or running:
        while len(running) < 6:
            job = cohort_state.take(progress, spec, total)
            if job is None:
                break
            running.append(job)
        if not running:
            assert not cohort_state.left(progress, total), "jobs left wait on nothing"
            break
        job = running.pop(rng.randrange(len(running)))
        place = cohort_state.job_place(job, worlds, k)
        world = spec.worlds[place.world].name
        cohort_state.record(
            progress, _done(world, place.run, place.fork, rng.random() < p[place.run])
        )
    return {"progress": progress, "total": total}


@pytest.mark.parametrize("k", [3, 5])
def test_the_forks_run_are_those_a_vote_in_fork_order_stops_at(k: int) -> None:
    spec = _spec(k=k, runs=30)
    p = [i / 29 for i in range(30)]
    progress = _simulate(spec, 30, p, seed=k)["progress"]
    assert all(SAVED not in row and len(row) == k for row in progress.outcomes["baseline"])
    saved = 0
    for row in progress.outcomes["noop"]:
        ran = row.rstrip(SAVED)
        assert SAVED not in ran and set(ran) <= {"0", "1"}
        # no fork ran after the vote was decided, and the vote is decided at the end
        assert all(vote_of(ran[:i], k) is None for i in range(len(ran)))
        assert vote_of(ran, k) is not None
        saved += len(row) - len(ran)
    assert saved == progress.saved > 0
    assert progress.done + progress.saved == cohort_state.job_count(30, 2, k)


def test_aa_experiments_with_votes_keep_the_rate_tests_error_rate() -> None:
    """A/A (the world is the baseline): the share of verdicts beyond the noise floor stays
    at or under alpha (5%) plus the Monte-Carlo error of 300 experiments (about 2.5%)."""
    rng = random.Random(11)
    beyond = 0
    sims = 300
    spec = _spec(runs=40)
    for sim in range(sims):
        p = [rng.choice([0.1, 0.5, 0.9]) for _ in range(40)]
        progress = _simulate(spec, 40, p, seed=sim)["progress"]
        summary = summarise(spec, cohort_state.final_matrix(progress), {})
        if summary.worlds[0].judgement.verdict.value != "inside_noise_floor":
            beyond += 1
    assert beyond / sims <= 0.05 + 0.025


def test_the_report_counts_the_saved_forks_and_measures_the_floor_on_every_baseline_fork() -> None:
    spec = _spec(runs=4)
    outcomes = {
        "baseline": ["110", "001", "111", "000"],
        "noop": [f"11{SAVED}", "010", f"11{SAVED}", f"00{SAVED}"],
    }
    summary = summarise(spec, outcomes, {})
    assert summary.saved_forks == 3
    # the floor is the raw baseline's (runs 0 and 1 disagree: 2/3 of their pairs)
    assert summary.floor.flip_rate == pytest.approx((2 / 3 + 2 / 3) / 4)
    text = render_markdown(spec, summary, ["r0", "r1", "r2", "r3"], {"noop": {}})
    assert "3 forks were not run: their run's majority" in text


def _plan(runs: int) -> CohortPlan:
    return failed_plan(runs, "agent-")


def test_the_plan_travels_as_a_digest_and_is_read_back_checked(tmp_path: Path) -> None:
    store = LocalArtifactStore(tmp_path / "artifacts")
    plans = CohortPlans(store)
    plan = _plan(10_000)
    ref = plans.put(plan)
    # what the workflow holds is small whatever the cohort's size
    assert len(ref.model_dump_json()) < 300 and ref.runs == 10_000
    assert len(json.dumps(plan.model_dump(mode="json"))) > 2_000_000  # over a payload's limit
    assert CohortPlans(store).get(ref.artifact) == plan
    # a stored plan whose runs differ from its signed digest is refused
    tampered = plan.model_copy(update={"runs": plan.runs[1:]})
    forged = store.put_json(tampered.model_dump(mode="json"))
    with pytest.raises(ValueError, match="differs from its signed digest"):
        CohortPlans(store).get(forged)
    with pytest.raises(ArtifactError, match="missing"):
        CohortPlans(store).get("0" * 64)
