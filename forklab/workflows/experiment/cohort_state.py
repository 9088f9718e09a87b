"""The rules over a cohort experiment's progress, apart from the workflow that sequences
them (tested without a server): which fork job comes next, how an outcome lands in the
matrix, whether the budget lets another fork start, and the matrix the analysis reads."""

from __future__ import annotations

from dataclasses import dataclass

from forklab.contracts.cohort import ForkOutcome, ForkStatus
from forklab.experiments.cohort.matrix import FAILURE, MISSING, SUCCESS, WorldCosts
from forklab.experiments.cohort.spec import CohortExperimentSpec
from forklab.workflows.experiment.cohort_messages import PENDING, CohortProgress


@dataclass(frozen=True)
class JobPlace:
    run: int
    fork: int
    world: int


def job_count(runs: int, worlds: int, forks: int) -> int:
    return runs * worlds * forks


def job_place(job: int, worlds: int, forks: int) -> JobPlace:
    """Jobs go run by run, then fork index, then world: a run's worlds finish together,
    so an experiment stopped part-way (budget, cancel) leaves whole pairs."""
    per_run = worlds * forks
    run, rest = divmod(job, per_run)
    fork, world = divmod(rest, worlds)
    return JobPlace(run=run, fork=fork, world=world)


def opening(spec: CohortExperimentSpec, runs: int) -> CohortProgress:
    k = spec.cohort.forks_per_world
    return CohortProgress(
        outcomes={w.name: [PENDING * k for _ in range(runs)] for w in spec.worlds},
        costs={w.name: WorldCosts() for w in spec.worlds},
    )


def _put(progress: CohortProgress, world: str, run: int, fork: int, mark: str) -> None:
    row = progress.outcomes[world][run]
    progress.outcomes[world][run] = row[:fork] + mark + row[fork + 1 :]


def record(progress: CohortProgress, outcome: ForkOutcome) -> None:
    """One fork's outcome into the matrix and the world's costs, once."""
    row = progress.outcomes[outcome.world][outcome.run_index]
    if row[outcome.fork] != PENDING:
        return
    if outcome.status is ForkStatus.error:
        mark = MISSING
        progress.missing += 1
    else:
        mark = SUCCESS if outcome.success else FAILURE
    _put(progress, outcome.world, outcome.run_index, outcome.fork, mark)
    progress.done += 1
    progress.tokens += outcome.tokens
    progress.world_seconds += outcome.seconds
    cost = progress.costs[outcome.world]
    cost.forks += 1
    cost.tokens += outcome.tokens
    cost.seconds += outcome.seconds


def budget_refusal(spec: CohortExperimentSpec, progress: CohortProgress) -> str | None:
    """Why no further fork may start (None: one may). Forks are bounded by the plan
    itself (capacity refused more than ``max_forks``); tokens and world-seconds are
    checked against what the finished forks spent."""
    budget = spec.budget
    if progress.tokens >= budget.max_model_tokens:
        return f"the forks spent {progress.tokens} model tokens, the budget's max_model_tokens"
    if progress.world_seconds >= budget.max_world_seconds:
        return (
            f"the forks spent {progress.world_seconds:.0f} world-seconds, the budget's "
            "max_world_seconds"
        )
    return None


def skip(progress: CohortProgress, spec: CohortExperimentSpec, job: int, runs: int) -> None:
    """A job the budget did not let start: its fork has no outcome."""
    place = job_place(job, len(spec.worlds), spec.cohort.forks_per_world)
    _put(progress, spec.worlds[place.world].name, place.run, place.fork, MISSING)
    progress.skipped += 1
    progress.missing += 1


def final_matrix(progress: CohortProgress) -> dict[str, list[str]]:
    """The matrix for the analysis: a fork not run has no outcome."""
    return {
        world: [row.replace(PENDING, MISSING) for row in rows]
        for world, rows in progress.outcomes.items()
    }
