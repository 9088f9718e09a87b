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
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass

from forklab.experiments.experiment.analysis.guard import HeldOutRunner
from forklab.experiments.experiment.chunks import chunk_columns, chunks, run_chunk
from forklab.experiments.experiment.columnar import ColumnBatch, merge_columns
from forklab.experiments.experiment.outcomes import ExperimentOutcomes, from_batch
from forklab.experiments.experiment.spec import ExperimentSpec, resolve_workload
from forklab.experiments.experiment.worlds import spec_world_plans
from forklab.runtime.file_format import WorldPlan

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
    return max(1, min(2, os.cpu_count() or 1))


def run_twin(
    spec: ExperimentSpec,
    episodes: Sequence[int] | None = None,
    worlds: Sequence[WorldPlan] | None = None,
    processes: int | None = None,
    memo: bool = True,
    batched: bool = True,
) -> TwinRun:
    """Run ``episodes`` (default: the spec's) of ``worlds`` (default: the spec's).

    ``memo=False`` disables the reuse of randomness-free runs (every episode simulated);
    ``batched=False`` runs the scalar methods even for a workload with batch methods
    (the benchmark's comparison; the result is the same)."""
    workload = resolve_workload(spec)
    eps: Sequence[int] = range(spec.episodes) if episodes is None else episodes
    plans = spec_world_plans(spec) if worlds is None else list(worlds)
    if processes is None:
        big = len(eps) * len(plans) >= PARALLEL_THRESHOLD
        processes = default_processes() if big else 1
    start = time.perf_counter()
    if processes <= 1 or len(eps) < 2 * processes:
        parts = [
            chunk_columns(workload, spec.seed, chunk, plans, memo, batched)
            for chunk in chunks(eps, 1)
        ]
        processes = 1
    else:
        # Two chunks per process keep both cores busy when chunks differ in cost.
        args = [
            (spec.workload.name, dict(workload.params), spec.seed, chunk, plans, memo, batched)
            for chunk in chunks(eps, processes * 2)
        ]
        ctx = multiprocessing.get_context("fork" if os.name == "posix" else "spawn")
        with ProcessPoolExecutor(max_workers=processes, mp_context=ctx) as pool:
            parts = list(pool.map(run_chunk, args))
    batch = merge_columns(parts)
    return TwinRun(batch=batch, seconds=time.perf_counter() - start, processes=processes)


def twin_held_out(processes: int | None = None) -> HeldOutRunner:
    """The guard's held-out episodes run on the twin with ``processes``."""

    def run(
        spec: ExperimentSpec, episodes: Sequence[int], plans: Sequence[WorldPlan]
    ) -> ColumnBatch:
        return run_twin(spec, episodes=episodes, worlds=plans, processes=processes).batch

    return run


def rehearse_outcomes(
    spec: ExperimentSpec, code_digest: str, processes: int | None = None, memo: bool = True
) -> ExperimentOutcomes:
    """Every world of the spec on the twin (``memo=False``: every episode in full). The
    files' code digest is the caller's (``forklab/cli/experiment/rehearsal.py`` reads
    them)."""
    run = run_twin(spec, processes=processes, memo=memo)
    return from_batch(run.batch, code_digest, TWIN_SNAPSHOT, run.seconds)
