"""The local twin: runs a whole experiment in-process, on one core or several.

The work is split into contiguous chunks of episodes; each chunk runs the stdlib
runner's ``run_batch`` and the chunks are concatenated in episode order, so the
result is identical whatever the number of processes.
"""

from __future__ import annotations

import multiprocessing
import os
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from typing import Any

from experiments.runtime.file_format import Batch, WorldPlan, merge_batches
from experiments.runtime.runner import run_batch, workload_class
from experiments.spec import ExperimentSpec, World, resolve_workload

#: Below this many world-episodes, starting processes costs more than it saves.
PARALLEL_THRESHOLD = 40_000


def world_plan(
    world: World, forks: int = 1, guard: dict[str, Any] | None = None, name: str | None = None
) -> WorldPlan:
    iv = world.intervention
    return WorldPlan(
        name=name or world.name,
        intervention=iv.name if iv else None,
        params=dict(iv.params) if iv else {},
        guard=guard,
        forks=forks,
    )


def spec_world_plans(spec: ExperimentSpec) -> list[WorldPlan]:
    forks = spec.analysis.forks_per_checkpoint
    return [world_plan(w, forks) for w in spec.worlds]


@dataclass(frozen=True)
class TwinRun:
    batch: Batch
    seconds: float
    processes: int


def _run_chunk(args: tuple[str, dict[str, Any], int, list[int], list[WorldPlan], bool]) -> Batch:
    ref, params, seed, episodes, worlds, memo = args
    return run_batch(workload_class(ref)(params), seed, episodes, worlds, memo)


def default_processes() -> int:
    return max(1, min(2, os.cpu_count() or 1))


def run_twin(
    spec: ExperimentSpec,
    episodes: Sequence[int] | None = None,
    worlds: Sequence[WorldPlan] | None = None,
    processes: int | None = None,
    memo: bool = True,
) -> TwinRun:
    """Run ``episodes`` (default: the spec's) of ``worlds`` (default: the spec's).

    ``memo=False`` disables the runner's reuse of randomness-free runs (benchmarks)."""
    workload = resolve_workload(spec)
    eps = list(range(spec.episodes)) if episodes is None else list(episodes)
    plans = spec_world_plans(spec) if worlds is None else list(worlds)
    if processes is None:
        big = len(eps) * len(plans) >= PARALLEL_THRESHOLD
        processes = default_processes() if big else 1
    start = time.perf_counter()
    if processes <= 1 or len(eps) < 2 * processes:
        batch = run_batch(workload, spec.seed, eps, plans, memo)
        processes = 1
    else:
        # Two chunks per process keep both cores busy when chunks differ in cost.
        n_chunks = processes * 2
        size = -(-len(eps) // n_chunks)
        chunks = [eps[i : i + size] for i in range(0, len(eps), size)]
        args = [
            (spec.workload.name, dict(workload.params), spec.seed, chunk, plans, memo)
            for chunk in chunks
        ]
        ctx = multiprocessing.get_context("fork" if os.name == "posix" else "spawn")
        with ProcessPoolExecutor(max_workers=processes, mp_context=ctx) as pool:
            batch = merge_batches(list(pool.map(_run_chunk, args)))
    return TwinRun(batch=batch, seconds=time.perf_counter() - start, processes=processes)
