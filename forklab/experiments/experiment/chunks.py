"""One chunk of episodes run through a spec's worlds.

Pure computation in whatever process the caller chose: the local twin
(``forklab.activities.experiment.twin``) splits an experiment into contiguous chunks and
runs each through ``chunk_columns``, in one process or a pool; the chunks' columns are
concatenated in episode order, so the result is identical whatever the number of
processes. A chunk's lists become columns (``columnar``) in the process that ran it, so
memory holds one chunk of Python objects per process, never one per episode. A workload
with batch methods runs a chunk at once instead (``vector``): the same columns, made
directly.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from forklab.experiments.experiment.columnar import ColumnBatch, to_columns
from forklab.experiments.experiment.vector import batchable, run_columns
from forklab.runtime.file_format import WorldPlan
from forklab.runtime.runner import run_batch, workload_class
from forklab.runtime.workload import Workload

#: Episodes run (and held as Python lists) at a time, before they become columns.
CHUNK_EPISODES = 50_000

#: The twin fingerprints every world's shocks in every episode of a run of up to this many
#: episodes; beyond, in every ``FINGERPRINT_EVERY``-th episode (``run_batch``). Keeping the
#: record a fingerprint needs is about a seventh of a world's time in a workload that does
#: little but draw; an eighth of a large run is thousands of episodes, where a workload
#: whose worlds draw differently shows at once (the report states the share checked).
FINGERPRINTS_IN_FULL = 10_000
FINGERPRINT_EVERY = 8

#: One chunk's work, as it crosses to a pool's process: workload name and params, seed,
#: episodes, worlds, memo, batched, fingerprint every.
ChunkArgs = tuple[str, dict[str, Any], int, Sequence[int], list[WorldPlan], bool, bool, int]


def fingerprint_every(episodes: int) -> int:
    """Every how many episodes a run of ``episodes`` fingerprints its worlds' shocks."""
    return 1 if episodes <= FINGERPRINTS_IN_FULL else FINGERPRINT_EVERY


def chunk_columns(
    workload: Workload,
    seed: int,
    episodes: Sequence[int],
    worlds: list[WorldPlan],
    memo: bool,
    batched: bool,
    every: int = 1,
) -> ColumnBatch:
    """One chunk's columns: batched when the workload can be, else the runner's lists
    (fingerprinting the shocks of every ``every``-th episode)."""
    if batched and batchable(workload):
        return run_columns(workload, seed, episodes, worlds, memo)
    return to_columns(run_batch(workload, seed, episodes, worlds, memo, every))


def run_chunk(args: ChunkArgs) -> ColumnBatch:
    """``chunk_columns`` from arguments that cross a process boundary (the workload by
    name, rebuilt in the process that runs it)."""
    ref, params, seed, episodes, worlds, memo, batched, every = args
    workload = workload_class(ref)(params)
    return chunk_columns(workload, seed, episodes, worlds, memo, batched, every)


def chunks(episodes: Sequence[int], count: int) -> list[Sequence[int]]:
    """At least ``count`` contiguous chunks, none over ``CHUNK_EPISODES`` (a range's
    slices are ranges: nothing per episode is built to hand them out)."""
    n = max(count, -(-len(episodes) // CHUNK_EPISODES), 1)
    size = max(1, -(-len(episodes) // n))
    return [episodes[i : i + size] for i in range(0, len(episodes), size)] or [episodes]
