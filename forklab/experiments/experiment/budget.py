"""How much sandbox time a unit of work may take: the arithmetic behind the hard budget.

Pure functions, shared by the capacity check (before approval) and the workflow (before
every batch). A unit is one prefix chunk or one world over one chunk. Its reservation is
``safety × rate × episodes + START_ALLOWANCE``: ``rate`` is the rehearsed seconds per
episode of that code path, ``START_ALLOWANCE`` pays for creating a sandbox and starting
an interpreter. The reservation is also the unit's wall-clock timeout, so no unit can
spend more than it reserved; the workflow starts a unit only when its reservation fits
in what is left.
"""

from __future__ import annotations

#: Seconds allowed per sandbox for creating it and starting the runner's interpreter.
START_ALLOWANCE = 2.0
#: Rates below this (a sample that ran too fast to time) are treated as this.
MIN_RATE = 1e-6


def reservation(safety: float, rate: float, episodes: int) -> float:
    """World-seconds a unit of ``episodes`` may spend, from a per-episode ``rate``."""
    return safety * max(rate, MIN_RATE) * episodes + START_ALLOWANCE


def revised_reservation(safety: float, rate: float, episodes: int, slowdown: float | None) -> float:
    """The reservation once units of the same kind have run: when sandboxes turned out
    ``slowdown`` times slower than rehearsed, the estimate grows accordingly (never shrinks)."""
    pace = None if slowdown is None else slowdown * max(rate, MIN_RATE)
    return paced_reservation(safety, rate, episodes, pace)


def paced_reservation(safety: float, rate: float, episodes: int, pace: float | None) -> float:
    """The reservation once sandboxes of the same kind were seen to run at ``pace``
    seconds per episode: at least that pace times the safety factor (never shrinks)."""
    planned = reservation(safety, rate, episodes)
    if pace is None:
        return planned
    return max(planned, safety * pace * episodes)


def slowdown(seconds: float, rate: float, episodes: int) -> float:
    """How many times slower than rehearsed a completed unit ran."""
    return seconds / (max(rate, MIN_RATE) * max(episodes, 1))
