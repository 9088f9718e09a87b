"""The waves of a sequential design over a cohort (``analysis.sequential``), without numpy:
the workflow reads these rules.

The design's waves are waves of *runs*: the plan's runs in a pre-registered order (a
permutation fixed by the experiment's seed and the number of runs, both signed with the
plan, and by nothing an outcome could change), cut where the design's looks fall
(``waves.wave_ends`` over the runs). Every fork of a wave's runs, in every world still
running, finishes before its look. At a look each world is compared with the baseline on
the **majority** of each run's k forks (``votes.vote_of``: a majority decided early by
``stop_when_decided`` is the full vote's, so votes and waves compose): a rescue where the
world's majority succeeds and the baseline's fails, a harm the other way round. A run
with a fork without an outcome (in either world) leaves the pair, as in the report.
"""

from __future__ import annotations

import hashlib
from functools import lru_cache

from forklab.experiments.cohort.matrix import MISSING
from forklab.experiments.cohort.votes import vote_of
from forklab.experiments.experiment.waves import wave_ends


@lru_cache(maxsize=8)
def run_order(seed: int, runs: int) -> tuple[int, ...]:
    """The order the design's waves take the plan's runs in: each run index ranked by a
    hash of (seed, index), so the order is fixed before any fork runs and is the same on
    every replay and after every continue-as-new."""

    def rank(i: int) -> bytes:
        return hashlib.blake2b(f"forklab-wave-order|{seed}|{i}".encode(), digest_size=8).digest()

    return tuple(sorted(range(runs), key=rank))


def run_wave_ends(runs: int, looks: int) -> list[int]:
    """Cumulative runs (positions in ``run_order``) at the end of each wave."""
    return wave_ends(runs, looks)


def majority(row: str, forks: int) -> bool | None:
    """A run's outcome in one world for the design: its decided majority, or None (a fork
    without an outcome, or a majority not decided)."""
    if MISSING in row:
        return None
    return vote_of(row, forks)


def look_counts(
    baseline: list[str], world: list[str], order: tuple[int, ...], ends: list[int], forks: int
) -> tuple[list[int], list[int]]:
    """Cumulative rescues and harms of ``world`` against ``baseline`` (one row per run, as
    the matrix holds them) at each wave end in ``ends``, the runs taken in ``order``."""
    rescue: list[int] = []
    harm: list[int] = []
    r = h = 0
    start = 0
    for end in ends:
        for run in order[start:end]:
            b, w = majority(baseline[run], forks), majority(world[run], forks)
            if b is None or w is None:
                continue
            r += int(w and not b)
            h += int(b and not w)
        rescue.append(r)
        harm.append(h)
        start = end
    return rescue, harm
