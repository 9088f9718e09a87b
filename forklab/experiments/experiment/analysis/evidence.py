"""Evidence per unit of compute: which worlds taught the most per world-second.

A world's *information* is ``−log10 p`` of its exact McNemar test against the baseline:
zero when the world is indistinguishable from the baseline (p = 1), one more for every
tenfold drop in p. It needs no direction and no model, and it only grows with discordant
pairs that agree with each other. Dividing by the world-seconds the world consumed gives
the rate at which it produced evidence, the figure to rank by when deciding which worlds
to run again or at larger n. The McNemar p is the unadjusted one: Holm's adjustment
depends on the other worlds, and a world's cost-effectiveness should not.
"""

from __future__ import annotations

import math

from pydantic import BaseModel


class EvidenceRow(BaseModel):
    world: str
    vs: str
    information: float
    world_seconds: float
    information_per_second: float | None
    rank: int


def information(p: float) -> float:
    """−log10 p, floored at zero and safe for p = 0 (never returned by an exact test)."""
    return max(0.0, -math.log10(max(p, 1e-300)))


def rank_evidence(rows: list[tuple[str, str, float, float]]) -> list[EvidenceRow]:
    """``rows`` are (world, vs, McNemar p, world-seconds); best evidence rate first.

    A world whose seconds were not measured (0) ranks after every measured one.
    """
    scored = []
    for world, vs, p, seconds in rows:
        info = information(p)
        rate = info / seconds if seconds > 0 else None
        scored.append((world, vs, info, seconds, rate))
    scored.sort(key=lambda r: (r[4] is None, -(r[4] or 0.0), -r[2], r[0]))
    return [
        EvidenceRow(
            world=world,
            vs=vs,
            information=round(info, 6),
            world_seconds=round(seconds, 6),
            information_per_second=None if rate is None else round(rate, 6),
            rank=i + 1,
        )
        for i, (world, vs, info, seconds, rate) in enumerate(scored)
    ]
