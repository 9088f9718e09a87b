"""The deterministic claims: one per judged world, written from the packet alone, so they
pass ``check_readout`` by construction (a test holds them to that)."""

from __future__ import annotations

from forklab.experiments.experiment.readout.check import (
    baseline_pair,
    figure_value,
    packet_direction,
)
from forklab.experiments.experiment.readout.packet import EvidencePacket
from forklab.experiments.experiment.readout.schema import (
    Claim,
    Figure,
    FigureName,
    ModelReadout,
    ReadoutVerdict,
)

#: What the deterministic readout cites of each world.
DEFAULT_FIGURES = (
    FigureName.failure_rate,
    FigureName.failures,
    FigureName.episodes,
    FigureName.rescue,
    FigureName.harm,
    FigureName.net,
)


def deterministic_readout(packet: EvidencePacket) -> ModelReadout:
    worlds = {w.name: w for w in packet.worlds}
    claims = []
    for v in packet.verdicts:
        pair = baseline_pair(packet, v.world)
        if pair is None or v.world not in worlds:
            continue
        claims.append(
            Claim(
                world=v.world,
                direction=packet_direction(pair),
                verdict=ReadoutVerdict(v.verdict),
                figures=[
                    Figure(name=n, value=figure_value(n, worlds[v.world], pair))
                    for n in DEFAULT_FIGURES
                ],
            )
        )
    return ModelReadout(claims=claims)
