"""The local twin: runs a whole experiment in-process, on one core or several.

The work is split into contiguous chunks of episodes; each chunk runs the stdlib
runner's ``run_batch`` and the chunks are concatenated in episode order, so the
result is identical whatever the number of processes. A chunk's lists become columns
(``experiments.columnar``) in the process that ran it, so memory holds one chunk of
Python objects per process, never one per episode of the experiment. A workload with
batch methods runs a chunk at once instead (``experiments.vector``): the same columns,
made directly.
"""

from __future__ import annotations

import multiprocessing
import os
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from typing import Any

from experiments.columnar import ColumnBatch, merge_columns, to_columns
from experiments.runtime.file_format import WorldPlan
from experiments.runtime.runner import run_batch, workload_class
from experiments.runtime.workload import Workload
from experiments.spec import ExperimentSpec, World, resolve_workload
from experiments.vector import batchable, run_columns

#: Below this many world-episodes, starting processes costs more than it saves.
PARALLEL_THRESHOLD = 40_000

#: Episodes run (and held as Python lists) at a time, before they become columns.
CHUNK_EPISODES = 50_000


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
    batch: ColumnBatch
    seconds: float
    processes: int


def _chunk_columns(
    workload: Workload,
    seed: int,
    episodes: Sequence[int],
    worlds: list[WorldPlan],
    memo: bool,
    batched: bool,
) -> ColumnBatch:
    """One chunk's columns: batched when the workload can be, else the runner's lists."""
    if batched and batchable(workload):
        return run_columns(workload, seed, episodes, worlds, memo)
    return to_columns(run_batch(workload, seed, episodes, worlds, memo))


def _run_chunk(
    args: tuple[str, dict[str, Any], int, Sequence[int], list[WorldPlan], bool, bool],
) -> ColumnBatch:
    ref, params, seed, episodes, worlds, memo, batched = args
    return _chunk_columns(workload_class(ref)(params), seed, episodes, worlds, memo, batched)


def _chunks(episodes: Sequence[int], count: int) -> list[Sequence[int]]:
    """At least ``count`` contiguous chunks, none over ``CHUNK_EPISODES`` (a range's
    slices are ranges: nothing per episode is built to hand them out)."""
    n = max(count, -(-len(episodes) // CHUNK_EPISODES), 1)
    size = max(1, -(-len(episodes) // n))
    return [episodes[i : i + size] for i in range(0, len(episodes), size)] or [episodes]


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
            _chunk_columns(workload, spec.seed, chunk, plans, memo, batched)
            for chunk in _chunks(eps, 1)
        ]
        processes = 1
    else:
        # Two chunks per process keep both cores busy when chunks differ in cost.
        args = [
            (spec.workload.name, dict(workload.params), spec.seed, chunk, plans, memo, batched)
            for chunk in _chunks(eps, processes * 2)
        ]
        ctx = multiprocessing.get_context("fork" if os.name == "posix" else "spawn")
        with ProcessPoolExecutor(max_workers=processes, mp_context=ctx) as pool:
            parts = list(pool.map(_run_chunk, args))
    batch = merge_columns(parts)
    return TwinRun(batch=batch, seconds=time.perf_counter() - start, processes=processes)
