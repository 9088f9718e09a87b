"""Are a model's claims faithful to the packet? Each must name a judged world of the packet
(its name exactly: "the teleport world", "Latency" or any other wording names none), give
that world's verdict and the direction its interval shows, cite each figure at the
packet's value, and the claims must cover every judged world once.

The check is deliberately strict: claims it rejects cost nothing (the deterministic
readout is shown instead); claims it wrongly accepted would put a statement in the report
that the evidence does not make. What it accepts is then written out by
``forklab.experiments.experiment.readout.write`` from the packet's values, not the
model's.
"""

from __future__ import annotations

import math

from forklab.experiments.experiment.readout.packet import (
    EvidencePacket,
    PacketComparison,
    PacketWorld,
)
from forklab.experiments.experiment.readout.schema import (
    Claim,
    FigureName,
    ModelReadout,
    ReadoutDirection,
)

#: Figures that are counts: a claim must cite them exactly.
COUNTS = frozenset(
    {
        FigureName.failures,
        FigureName.episodes,
        FigureName.rescue,
        FigureName.harm,
        FigureName.net,
    }
)
#: How close a cited fraction (a rate, a difference, a bound, a p value) must be: three
#: decimals, or 0.1% of its size (a p value of 1e-9 is not "1e-6").
_ABS, _REL = 5e-4, 1e-3


def baseline_pair(packet: EvidencePacket, world: str) -> PacketComparison | None:
    """The comparison a world's verdict reads: the world against the baseline."""
    base = next((w.name for w in packet.worlds if w.role == "baseline"), None)
    return next((c for c in packet.comparisons if c.world == world and c.vs == base), None)


def packet_direction(pair: PacketComparison) -> ReadoutDirection:
    """The failure rate's direction as the interval of the success difference says it."""
    if pair.ci_low > 0:
        return ReadoutDirection.lowered
    if pair.ci_high < 0:
        return ReadoutDirection.raised
    return ReadoutDirection.no_clear_change


def figure_value(name: FigureName, world: PacketWorld, pair: PacketComparison) -> float:
    """The packet's value of one figure of a world."""
    source: PacketWorld | PacketComparison = (
        world
        if name in (FigureName.failure_rate, FigureName.failures, FigureName.episodes)
        else pair
    )
    return float(getattr(source, name.value))


def _figure_matches(name: FigureName, said: float, truth: float) -> bool:
    if name in COUNTS:
        return said == truth
    return math.isclose(said, truth, rel_tol=_REL, abs_tol=_ABS)


def _said(text: str) -> str:
    """A model's string, quoted and cut short, for a problem line."""
    return repr(text if len(text) <= 40 else text[:39] + "…")


def _claim_problems(claim: Claim, packet: EvidencePacket) -> list[str]:
    verdicts = {v.world: v.verdict for v in packet.verdicts}
    worlds = {w.name: w for w in packet.worlds}
    if claim.world not in worlds:
        return [f"names world {_said(claim.world)}, which the packet does not hold"]
    pair = baseline_pair(packet, claim.world)
    if claim.world not in verdicts or pair is None:
        return [f"makes a claim about {claim.world}, which the packet does not judge"]
    problems = []
    if claim.verdict.value != verdicts[claim.world]:
        problems.append(
            f"says {claim.world} is {claim.verdict.value}; the packet says {verdicts[claim.world]}"
        )
    truth = packet_direction(pair)
    if claim.direction is not truth:
        problems.append(
            f"says {claim.world} {claim.direction.value} the failure rate; "
            f"the packet's interval says {truth.value}"
        )
    seen = set()
    for figure in claim.figures:
        if figure.name in seen:
            problems.append(f"cites {claim.world}'s {figure.name.value} twice")
        seen.add(figure.name)
        value = figure_value(figure.name, worlds[claim.world], pair)
        if not _figure_matches(figure.name, figure.value, value):
            problems.append(
                f"cites {claim.world}'s {figure.name.value} as {figure.value:g}; "
                f"the packet says {value:g}"
            )
    return problems


def check_readout(readout: ModelReadout, packet: EvidencePacket) -> list[str]:
    """What the claims say that the packet does not; empty when faithful."""
    problems: list[str] = []
    judged = [v.world for v in packet.verdicts]
    claimed = [c.world for c in readout.claims]
    for claim in readout.claims:
        problems += _claim_problems(claim, packet)
    for world in dict.fromkeys(claimed):
        if claimed.count(world) > 1:
            problems.append(f"makes {claimed.count(world)} claims about {_said(world)}")
    missing = [w for w in judged if w not in claimed]
    if missing:
        problems.append(f"leaves out judged worlds: {', '.join(missing)}")
    return list(dict.fromkeys(problems))
