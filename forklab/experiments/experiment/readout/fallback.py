"""The deterministic readout: the same shape as a model's, written from the packet alone,
so it passes ``check_readout`` by construction (a test holds it to that)."""

from __future__ import annotations

from forklab.experiments.experiment.readout.packet import EvidencePacket, hypothesis_supported
from forklab.experiments.experiment.readout.schema import Finding, ModelReadout, ReadoutVerdict
from forklab.experiments.experiment.results import CheckKind


def _pct(rate: float) -> str:
    return f"{rate * 100:.1f}%"


def _validity(packet: EvidencePacket) -> list[str]:
    """Can the experiment be trusted: its validity checks, and nothing else."""
    checks = [c for c in packet.checks if c.kind is CheckKind.validity]
    failed = [c.name for c in checks if not c.passed]
    if not failed:
        return [f"Valid experiment: all {len(checks)} validity checks passed."]
    return [
        f"Not a valid experiment: {len(failed)} of {len(checks)} validity checks failed "
        f"({', '.join(failed)}), so the effects are not evidence."
    ]


def _hypothesis(packet: EvidencePacket) -> list[str]:
    """Did the effects go the pre-registered way: the effect checks (each world's verdict is
    in its finding, so a sentence here never pairs a world with a verdict word)."""
    supported = hypothesis_supported(packet)
    if supported is None:
        return ["Hypothesis not judged: the experiment is not valid."]
    if not supported:
        failed = [c.name for c in packet.checks if c.kind is CheckKind.effect and not c.passed]
        return [
            f"Hypothesis not supported: {', '.join(failed)} failed; each world's verdict follows."
        ]
    return ["Hypothesis supported: every world moved as pre-registered."]


def deterministic_readout(packet: EvidencePacket) -> ModelReadout:
    worlds = {w.name: w for w in packet.worlds}
    comparisons = {(c.world, c.vs): c for c in packet.comparisons}
    findings = []
    for v in packet.verdicts:
        w = worlds.get(v.world)
        pair = next((c for (world, _), c in comparisons.items() if world == v.world), None)
        parts = []
        if w is not None:
            parts.append(
                f"failure rate {_pct(w.failure_rate)} ({w.failures} of {w.episodes} episodes)"
            )
        if pair is not None:
            parts.append(
                f"against {pair.vs}: {pair.rescue} rescued, {pair.harm} harmed, net {pair.net}"
            )
        findings.append(
            Finding(
                world=v.world,
                verdict=ReadoutVerdict(v.verdict),
                statement=(f"{v.world}: " + "; ".join(parts) + ".") if parts else f"{v.world}.",
            )
        )
    summary = f"{len(packet.worlds)} worlds, {packet.episodes} episodes each. " + " ".join(
        _validity(packet) + _hypothesis(packet)
    )
    caveats = []
    if packet.budget is not None:
        b = packet.budget
        caveats.append(
            f"Spent {b.world_seconds_spent:g} of {b.world_seconds_budget:g} world-seconds, "
            f"at most {b.peak_concurrent_sandboxes} sandboxes at once."
        )
    if packet.guard is not None:
        g = packet.guard
        caveats.append(
            f"Guard for {g.world} (when {g.rule}): net {g.held_out_net_before} before, "
            f"{g.held_out_net_after} after, on {g.held_out_episodes} held-out episodes."
        )
    return ModelReadout(summary=summary, findings=findings, caveats=caveats)
