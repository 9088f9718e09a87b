"""The rules over a cohort experiment's progress, apart from the workflow that sequences
them (tested without a server): which fork job comes next (and which are saved because
their run's majority is decided, ``cohort.stop_when_decided``, and which are unspent
because a sequential design stopped their world), how an outcome lands in the matrix,
whether the budget lets another fork start, and the matrix the analysis reads.

With a sequential design (``analysis.sequential``) the jobs take the runs in the design's
seeded order (``forklab.experiments.cohort.waves.run_order``), so each wave's jobs are one
contiguous range and the workflow runs them wave by wave."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from forklab.contracts.cohort import ForkOutcome, ForkStatus, WorldCounts
from forklab.contracts.experiment import LookResult
from forklab.experiments.cohort.matrix import (
    FAILURE,
    MISSING,
    SAVED,
    SUCCESS,
    UNSPENT,
    WorldCosts,
)
from forklab.experiments.cohort.spec import CohortExperimentSpec
from forklab.experiments.cohort.votes import first_deciding_fork, vote_of
from forklab.experiments.cohort.waves import look_counts, run_order, run_wave_ends
from forklab.experiments.experiment.spec import Role
from forklab.experiments.experiment.waves import STOPS
from forklab.workflows.experiment.cohort_messages import PENDING, RUNNING, CohortProgress


@dataclass(frozen=True)
class JobPlace:
    run: int
    fork: int
    world: int


#: History events a fork still adds once started, at most: its activity's scheduled,
#: started and completed events and the workflow task that takes the result in (3 events,
#: shared when several forks finish together).
EVENTS_PER_FORK = 6
#: Events a run adds after its last fork: the workflow tasks in flight and ending it, the
#: continue-as-new event, a patch marker.
RUN_END_EVENTS = 10


def history_full(length: int, running: int, limit: int) -> bool:
    """Whether a run of the experiment must start no further fork: the forks running and
    one more would, by finishing, take its history (``length`` events now) past
    ``limit``. So a run continues as new below ``limit`` however many forks run at once."""
    return length + EVENTS_PER_FORK * (running + 1) + RUN_END_EVENTS >= limit


#: Events a sequential design's look adds (its activity and the workflow task taking the
#: result in), and those that may follow it in the same run when it stops the last world:
#: cleanup, analysis and ledger activities with their workflow tasks, and the completion.
LOOK_EVENTS = 6
FINISH_EVENTS = 24


def room_for_look(length: int, limit: int) -> bool:
    """Whether a run of the experiment (``length`` events now) may decide a look: the look
    and, should it stop every world, the experiment's end stay below ``limit``."""
    return length + LOOK_EVENTS + FINISH_EVENTS + RUN_END_EVENTS < limit


def job_count(runs: int, worlds: int, forks: int) -> int:
    return runs * worlds * forks


def job_place(job: int, worlds: int, forks: int) -> JobPlace:
    """Jobs go run by run, then fork index, then world: a run's worlds finish together,
    so an experiment stopped part-way (budget, cancel) leaves whole pairs."""
    per_run = worlds * forks
    run, rest = divmod(job, per_run)
    fork, world = divmod(rest, worlds)
    return JobPlace(run=run, fork=fork, world=world)


def place(spec: CohortExperimentSpec, progress: CohortProgress, job: int) -> JobPlace:
    """Job ``job``'s run, fork and world: ``job_place``, its run taken in the design's
    seeded order when the spec has a sequential design."""
    at = job_place(job, len(spec.worlds), spec.cohort.forks_per_world)
    if spec.analysis.sequential is None:
        return at
    order = run_order(spec.seed, _runs(spec, progress))
    return JobPlace(run=order[at.run], fork=at.fork, world=at.world)


def _runs(spec: CohortExperimentSpec, progress: CohortProgress) -> int:
    return len(progress.outcomes[spec.baseline.name])


def wave_ends(spec: CohortExperimentSpec, progress: CohortProgress) -> list[int]:
    """The design's cumulative runs at the end of each wave."""
    assert spec.analysis.sequential is not None
    return run_wave_ends(_runs(spec, progress), spec.analysis.sequential.looks)


def wave_jobs(spec: CohortExperimentSpec, progress: CohortProgress, look: int) -> int:
    """The job after the last of wave ``look`` (0-based): its jobs end there."""
    end = wave_ends(spec, progress)[look]
    return job_count(end, len(spec.worlds), spec.cohort.forks_per_world)


def stopped_worlds(progress: CohortProgress) -> set[str]:
    """The worlds a sequential design's looks stopped: they start no more forks."""
    return {w.world for look in progress.looks for w in look.worlds if w.decision in STOPS}


def live(spec: CohortExperimentSpec, progress: CohortProgress) -> bool:
    """Whether any world but the baseline still runs (the baseline runs while one does)."""
    stopped = stopped_worlds(progress)
    return any(w.role is not Role.baseline and w.name not in stopped for w in spec.worlds)


def look_input_counts(
    spec: CohortExperimentSpec, progress: CohortProgress, look: int
) -> dict[str, WorldCounts]:
    """The counts of every world still running at look ``look``, from the first look on
    (the activity recomputes each path from them)."""
    ends = wave_ends(spec, progress)[: look + 1]
    base = progress.outcomes[spec.baseline.name]
    order = run_order(spec.seed, len(base))
    stopped = stopped_worlds(progress)
    counts = {}
    for w in spec.worlds:
        if w.role is Role.baseline or w.name in stopped:
            continue
        rescue, harm = look_counts(
            base, progress.outcomes[w.name], order, ends, spec.cohort.forks_per_world
        )
        counts[w.name] = WorldCounts(rescue=rescue, harm=harm)
    return counts


def record_look(progress: CohortProgress, result: LookResult) -> None:
    """A look's decisions, once (a look already recorded is not recorded again)."""
    if len(progress.looks) < result.look:
        progress.looks.append(result)


def opening(spec: CohortExperimentSpec, runs: int) -> CohortProgress:
    k = spec.cohort.forks_per_world
    return CohortProgress(
        outcomes={w.name: [PENDING * k for _ in range(runs)] for w in spec.worlds},
        costs={w.name: WorldCosts() for w in spec.worlds},
    )


class _Next(Enum):
    start = "start"
    #: an earlier fork of the run in this world is still running (or waiting)
    wait = "wait"
    #: the run's majority in this world is decided: the fork is not run
    save = "save"
    #: a sequential design stopped this world: the fork is not run
    unspent = "unspent"


def _next(progress: CohortProgress, spec: CohortExperimentSpec, job: int) -> _Next:
    k = spec.cohort.forks_per_world
    at = place(spec, progress, job)
    world = spec.worlds[at.world]
    if progress.looks and world.name in stopped_worlds(progress):
        return _Next.unspent
    if (
        not spec.cohort.stop_when_decided
        or world.role is Role.baseline
        or at.fork < first_deciding_fork(k)
    ):
        return _Next.start
    before = progress.outcomes[world.name][at.run][: at.fork]
    if RUNNING in before or PENDING in before:
        return _Next.wait
    return _Next.start if vote_of(before, k) is None else _Next.save


def _mark(progress: CohortProgress, spec: CohortExperimentSpec, job: int, mark: str) -> None:
    at = place(spec, progress, job)
    _put(progress, spec.worlds[at.world].name, at.run, at.fork, mark)


def take(progress: CohortProgress, spec: CohortExperimentSpec, total: int) -> int | None:
    """The next job to start now (marked running), or None: none left, or every job left
    waits on an earlier fork of its run that is still running. Jobs whose run's majority
    is decided are saved on the way; jobs that must wait are set aside in
    ``progress.waiting`` (at most the running forks' later forks) and taken first once
    they can be decided."""
    for job in list(progress.waiting):
        step = _next(progress, spec, job)
        if step is _Next.wait:
            continue
        progress.waiting.remove(job)
        if step is _Next.save:
            _mark(progress, spec, job, SAVED)
            progress.saved += 1
            return take(progress, spec, total)
        _mark(progress, spec, job, RUNNING)
        return job
    while progress.next_job < total:
        job = progress.next_job
        progress.next_job += 1
        step = _next(progress, spec, job)
        if step is _Next.start:
            _mark(progress, spec, job, RUNNING)
            return job
        if step is _Next.unspent:
            _mark(progress, spec, job, UNSPENT)
            progress.unspent += 1
        elif step is _Next.save:
            _mark(progress, spec, job, SAVED)
            progress.saved += 1
        else:
            progress.waiting.append(job)
    return None


def left(progress: CohortProgress, total: int) -> bool:
    """Whether jobs remain to start (or to save)."""
    return progress.next_job < total or bool(progress.waiting)


def _put(progress: CohortProgress, world: str, run: int, fork: int, mark: str) -> None:
    row = progress.outcomes[world][run]
    progress.outcomes[world][run] = row[:fork] + mark + row[fork + 1 :]


def record(progress: CohortProgress, outcome: ForkOutcome) -> None:
    """One fork's outcome into the matrix and the world's costs, once."""
    row = progress.outcomes[outcome.world][outcome.run_index]
    if row[outcome.fork] not in (PENDING, RUNNING):
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


def skip_rest(progress: CohortProgress, spec: CohortExperimentSpec, total: int) -> None:
    """The jobs the budget did not let start (waiting or not reached): no outcome."""
    for job in [*progress.waiting, *range(progress.next_job, total)]:
        _mark(progress, spec, job, MISSING)
        progress.skipped += 1
        progress.missing += 1
    progress.waiting.clear()
    progress.next_job = total


def leave_unspent(progress: CohortProgress, spec: CohortExperimentSpec, total: int) -> None:
    """The jobs a sequential design never reached (every world but the baseline stopped,
    or the last look passed): unspent."""
    for job in range(progress.next_job, total):
        _mark(progress, spec, job, UNSPENT)
        progress.unspent += 1
    progress.next_job = total


def final_matrix(progress: CohortProgress) -> dict[str, list[str]]:
    """The matrix for the analysis: a fork not run (nor saved) has no outcome."""
    return {
        world: [row.replace(PENDING, MISSING).replace(RUNNING, MISSING) for row in rows]
        for world, rows in progress.outcomes.items()
    }
