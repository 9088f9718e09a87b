"""The local twin: a whole experiment run in-process, on one core or several.

The twin is one of the places workload code runs (the others are sandboxes): it runs
every chunk of episodes through ``worlds.chunk_columns`` in this process or in a pool of
forked processes, and times itself. ``forklab plan`` rehearses on it for free; the
analysis validates a guard on it when no sandbox runs the held-out episodes.
"""

from __future__ import annotations

import multiprocessing
import os
import time
from collections.abc import Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING

from forklab.experiments.experiment.analysis.held_out_plan import held_out_plan
from forklab.experiments.experiment.chunks import (
    ChunkArgs,
    chunk_columns,
    chunks,
    fingerprint_every,
    run_chunk,
)
from forklab.experiments.experiment.columnar import ColumnBatch, merge_columns
from forklab.experiments.experiment.outcomes import ExperimentOutcomes, from_batch
from forklab.experiments.experiment.spec import ExperimentSpec, resolve_workload
from forklab.experiments.experiment.worlds import spec_world_plans
from forklab.runtime.file_format import WorldPlan

if TYPE_CHECKING:  # (the analysis imports late: a plan starts its processes before that)
    from forklab.experiments.experiment.analysis.guard import HeldOutRunner

#: Below this many world-episodes, starting processes costs more than it saves.
PARALLEL_THRESHOLD = 40_000

#: The snapshot name recorded for worlds that ran in the local twin.
TWIN_SNAPSHOT = "local-twin"


@dataclass(frozen=True)
class TwinRun:
    batch: ColumnBatch
    seconds: float
    processes: int


def default_processes() -> int:
    """The cores this process may run on that nobody else is using now, at least one.

    A core another process keeps busy gives the twin little: where the scheduler shares
    the machine by session (Linux's autogroups, systemd's slices), a second process of
    ours only splits our share with the first, and costs its start and its results'
    transfer. So the twin counts the processes running now besides itself (the kernel's
    count in ``/proc/loadavg``) and takes the cores left over."""
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:  # (no affinity outside Linux)
        usable = os.cpu_count() or 1
    return max(1, usable - _others_running())


#: How often, and how far apart, the running processes are counted: a kernel thread that
#: wakes now and then is running in one count and not the next, so one count alone would
#: take it for a busy core (an idle 2-core machine ran the twin on one), while a process
#: that keeps a core busy is running in every count.
RUNNING_COUNTS, RUNNING_GAP = 8, 0.005


def _others_running() -> int:
    """Threads running or ready to run on the machine in every one of ``RUNNING_COUNTS``
    counts, besides this process's own (0 where the kernel does not say): the CLI's own
    threads (it imports the analysis while the twin runs) are not another's busy core."""
    least: int | None = None
    for i in range(RUNNING_COUNTS):
        if i:
            time.sleep(RUNNING_GAP)
        try:
            with open("/proc/loadavg", encoding="ascii") as fh:
                running = int(fh.read().split()[3].partition("/")[0])
        except (OSError, ValueError, IndexError):
            return 0
        others = running - _own_running()
        least = others if least is None else min(least, others)
    return max(0, least or 0)


def _own_running() -> int:
    """This process's threads running or ready to run (itself at least)."""
    own = 0
    try:
        for task in os.scandir("/proc/self/task"):
            with open(os.path.join(task.path, "stat"), encoding="ascii") as fh:
                own += fh.read().rpartition(")")[2].split()[0] == "R"
    except (OSError, IndexError):
        return 1
    return max(own, 1)


def _processes(episodes: int, worlds: Sequence[WorldPlan], asked: int | None) -> int:
    if asked is not None:
        wanted = asked
    else:
        work = episodes * sum(w.forks for w in worlds)
        wanted = default_processes() if work >= PARALLEL_THRESHOLD else 1
    return 1 if wanted <= 1 or episodes < 2 * wanted else wanted


def _pool(processes: int) -> ProcessPoolExecutor:
    ctx = multiprocessing.get_context("fork" if os.name == "posix" else "spawn")
    return ProcessPoolExecutor(max_workers=processes, mp_context=ctx)


def _chunk_args(
    spec: ExperimentSpec,
    episodes: Sequence[int],
    plans: list[WorldPlan],
    count: int,
    memo: bool,
    batched: bool,
) -> list[ChunkArgs]:
    params = dict(resolve_workload(spec).params)
    every = fingerprint_every(len(episodes))
    return [
        (spec.workload.name, params, spec.seed, chunk, plans, memo, batched, every)
        for chunk in chunks(episodes, count)
    ]


def run_twin(
    spec: ExperimentSpec,
    episodes: Sequence[int] | None = None,
    worlds: Sequence[WorldPlan] | None = None,
    processes: int | None = None,
    memo: bool = True,
    batched: bool = True,
    pool: ProcessPoolExecutor | None = None,
) -> TwinRun:
    """Run ``episodes`` (default: the spec's) of ``worlds`` (default: the spec's).

    ``memo=False`` disables the reuse of randomness-free runs (every episode simulated);
    ``batched=False`` runs the scalar methods even for a workload with batch methods
    (the benchmark's comparison; the result is the same). ``pool``: processes to run the
    chunks in (its size is ``processes``), instead of starting new ones."""
    workload = resolve_workload(spec)
    eps: Sequence[int] = range(spec.episodes) if episodes is None else episodes
    plans = spec_world_plans(spec) if worlds is None else list(worlds)
    processes = _processes(len(eps), plans, processes)
    start = time.perf_counter()
    if processes == 1:
        every = fingerprint_every(len(eps))
        parts = [
            chunk_columns(workload, spec.seed, chunk, plans, memo, batched, every)
            for chunk in chunks(eps, 1)
        ]
    else:
        # Two chunks per process keep every core busy when chunks differ in cost.
        args = _chunk_args(spec, eps, plans, processes * 2, memo, batched)
        if pool is not None:
            parts = list(pool.map(run_chunk, args))
        else:
            with _pool(processes) as own:
                parts = list(own.map(run_chunk, args))
    batch = merge_columns(parts)
    return TwinRun(batch=batch, seconds=time.perf_counter() - start, processes=processes)


def twin_held_out(
    processes: int | None = None, memo: bool = True, pool: ProcessPoolExecutor | None = None
) -> HeldOutRunner:
    """The guard's held-out episodes run on the twin with ``processes`` (in ``pool`` when
    given), with the memo or without it, as the rehearsal ran."""

    def run(
        spec: ExperimentSpec, episodes: Sequence[int], plans: Sequence[WorldPlan]
    ) -> ColumnBatch:
        return run_twin(
            spec, episodes=episodes, worlds=plans, processes=processes, memo=memo, pool=pool
        ).batch

    return run


class TwinRehearsal:
    """A whole experiment on the twin, started on entry: its chunks and, when the spec has
    a guard to validate, the guard's held-out chunks (known from the spec alone,
    ``held_out_plan``) go to one pool of processes at once. The caller imports and
    builds what it needs meanwhile (the analysis), then reads ``outcomes`` and hands
    ``held_out`` to the analysis, which gets the batch already run (or, for any other
    request, a run in the same pool). In one process (small experiments, ``processes=1``)
    everything runs when it is asked for. On exit the pool is shut down, and chunks
    nobody read are cancelled."""

    def __init__(
        self, spec: ExperimentSpec, processes: int | None = None, memo: bool = True
    ) -> None:
        self.spec = spec
        self.memo = memo
        plans = spec_world_plans(spec)
        self.processes = _processes(spec.episodes, plans, processes)
        self._plans = plans
        self._ahead = held_out_plan(spec)
        self._pool: ProcessPoolExecutor | None = None
        self._parts: list[Future[ColumnBatch]] = []
        self._held: list[Future[ColumnBatch]] = []
        self._start = 0.0
        self._run: TwinRun | None = None

    def __enter__(self) -> TwinRehearsal:
        self._start = time.perf_counter()
        if self.processes > 1:
            self._pool = _pool(self.processes)
            count = self.processes * 2
            episodes = range(self.spec.episodes)
            for args in _chunk_args(self.spec, episodes, self._plans, count, self.memo, True):
                self._parts.append(self._pool.submit(run_chunk, args))
            if self._ahead is not None:
                held, plans = self._ahead
                for args in _chunk_args(self.spec, held, plans, self.processes, self.memo, True):
                    self._held.append(self._pool.submit(run_chunk, args))
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None

    def run(self) -> TwinRun:
        """The experiment's columns (waits for its chunks)."""
        if self._run is None:
            if self._parts:
                batch = merge_columns([part.result() for part in self._parts])
                seconds = time.perf_counter() - self._start
                self._run = TwinRun(batch=batch, seconds=seconds, processes=self.processes)
            else:
                self._run = run_twin(self.spec, processes=1, memo=self.memo)
        return self._run

    @property
    def forks_saved(self) -> dict[str, int]:
        """Per world with several forks per checkpoint, the forks its decided votes did not
        run."""
        return dict(self.run().batch.get("forks_saved", {}))

    def outcomes(self, code_digest: str) -> ExperimentOutcomes:
        run = self.run()
        return from_batch(run.batch, code_digest, TWIN_SNAPSHOT, run.seconds)

    @property
    def held_out(self) -> HeldOutRunner:
        inner = twin_held_out(self.processes, self.memo, self._pool)

        def run(
            spec: ExperimentSpec, episodes: Sequence[int], plans: Sequence[WorldPlan]
        ) -> ColumnBatch:
            ahead = self._ahead
            if (
                self._held
                and ahead is not None
                and spec == self.spec
                and list(episodes) == list(ahead[0])
                and list(plans) == ahead[1]
            ):
                return merge_columns([part.result() for part in self._held])
            return inner(spec, episodes, plans)

        return run


def rehearse_outcomes(
    spec: ExperimentSpec, code_digest: str, processes: int | None = None, memo: bool = True
) -> ExperimentOutcomes:
    """Every world of the spec on the twin (``memo=False``: every episode in full). The
    files' code digest is the caller's (``forklab/cli/experiment/rehearsal.py`` reads
    them)."""
    run = run_twin(spec, processes=processes, memo=memo)
    return from_batch(run.batch, code_digest, TWIN_SNAPSHOT, run.seconds)
