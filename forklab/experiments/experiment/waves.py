"""The waves of a sequential design and the chunks that follow them, without numpy.

A sequential design (``sequential.py``) runs its episodes in ``looks`` waves, wave k ending
at episode ``ceil(N·k/K)``, and decides after each. The durable path's unit of work is a
chunk of episodes, so a chunk must never straddle a wave's end: otherwise a world would run
episodes past the look that stops it, and the look would wait on work of the next wave.
Each wave is split into chunks of at most ``batch`` episodes; without waves the chunks are
the fixed design's ``[i·batch, (i+1)·batch)``. Workflows and the wire types read these
rules, so this module imports nothing that loads numpy.
"""

from __future__ import annotations

from enum import StrEnum


class Decision(StrEnum):
    """A world's decision after a look, as the report and the status read it."""

    efficacy = "efficacy"
    futility = "futility"
    check_decided = "check_decided"
    continue_ = "continue"
    completed = "completed"


#: Decisions after which a world starts no more work.
STOPS = frozenset({Decision.efficacy, Decision.futility, Decision.check_decided})


def wave_ends(episodes: int, looks: int) -> list[int]:
    """Cumulative episodes at the end of each wave: as equal as integers allow."""
    return [-(-episodes * (k + 1) // looks) for k in range(looks)]


def _waves(episodes: int, ends: list[int]) -> list[tuple[int, int]]:
    starts = [0, *ends[:-1]]
    return [(a, b) for a, b in zip(starts, ends or [episodes], strict=False) if b > a] or [
        (0, episodes)
    ]


def chunk_spans(episodes: int, batch: int, ends: list[int]) -> list[tuple[int, int]]:
    """Every chunk as ``(first, stop)``: each wave cut into chunks of at most ``batch``
    episodes (one wave of every episode when ``ends`` is empty)."""
    spans = []
    for first, stop in _waves(episodes, ends):
        spans += [(a, min(a + batch, stop)) for a in range(first, stop, batch)]
    return spans


def chunk_count(episodes: int, batch: int, ends: list[int]) -> int:
    return sum(-(-(b - a) // batch) for a, b in _waves(episodes, ends))


def chunk_span(episodes: int, batch: int, ends: list[int], index: int) -> tuple[int, int]:
    """Chunk ``index``'s ``(first, stop)``, computed over the waves (at most 50), not by
    listing every chunk."""
    for first, stop in _waves(episodes, ends):
        count = -(-(stop - first) // batch)
        if index < count:
            a = first + index * batch
            return a, min(a + batch, stop)
        index -= count
    raise IndexError(f"no chunk {index}")


def wave_chunks(episodes: int, batch: int, ends: list[int], look: int) -> tuple[int, int]:
    """The chunk indices ``[first, stop)`` of wave ``look`` (0-based)."""
    waves = _waves(episodes, ends)
    before = sum(-(-(b - a) // batch) for a, b in waves[:look])
    a, b = waves[look]
    return before, before + -(-(b - a) // batch)
