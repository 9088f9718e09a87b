"""The readout's prose, written from checked claims and the packet's own values.

Whoever made the claims (a model or ``fallback``), every sentence here is ForkLab's: the
world names, numbers and verdict words come from the packet, the wording from this
module. The summary (validity, hypothesis) and the caveats (budget, guard) are the
packet's alone; a model's claims choose only the order of the worlds and which figures
each cites.
"""

from __future__ import annotations

from forklab.experiments.experiment.analysis.verdicts import Verdict, hypothesis_headline
from forklab.experiments.experiment.readout.check import baseline_pair
from forklab.experiments.experiment.readout.packet import EvidencePacket
from forklab.experiments.experiment.readout.schema import (
    Claim,
    FigureName,
    Finding,
    ModelReadout,
    ReadoutDirection,
    WrittenReadout,
)
from forklab.experiments.experiment.results import CheckKind

_DIRECTION = {
    ReadoutDirection.lowered: "lowered the failure rate",
    ReadoutDirection.raised: "raised the failure rate",
    ReadoutDirection.no_clear_change: "made no clear change to the failure rate",
}


def _pct(rate: float) -> str:
    return f"{rate * 100:.1f}%"


def _validity(packet: EvidencePacket) -> str:
    """Can the experiment be trusted: its validity checks, and nothing else."""
    checks = [c for c in packet.checks if c.kind is CheckKind.validity]
    failed = [c.name for c in checks if not c.passed]
    if not failed:
        return f"Valid experiment: all {len(checks)} validity checks passed."
    return (
        f"Not a valid experiment: {len(failed)} of {len(checks)} validity checks failed "
        f"({', '.join(failed)}), so the effects are not evidence."
    )


def _hypothesis(packet: EvidencePacket) -> str:
    """Did the effects go the pre-registered way: how many of the hypothesis's
    predictions (one per world) held, naming the others."""
    return hypothesis_headline(
        packet.valid, [(v.world, Verdict(v.verdict)) for v in packet.verdicts]
    )


def _figures(claim: Claim, packet: EvidencePacket) -> str:
    """The cited figures, at the packet's values, in a fixed order and wording."""
    w = next(w for w in packet.worlds if w.name == claim.world)
    c = baseline_pair(packet, claim.world)
    assert c is not None  # check_readout refuses a claim about a world without one
    cited = {f.name for f in claim.figures}
    f = FigureName
    wording = [
        (f.failure_rate, f"failure rate {_pct(w.failure_rate)}"),
        (f.failures, f"{w.failures} failures"),
        (f.episodes, f"{w.episodes} episodes"),
        (f.rescue, f"{c.rescue} rescued"),
        (f.harm, f"{c.harm} harmed"),
        (f.net, f"net {c.net}"),
        (f.difference, f"success difference {c.difference:+.3f}"),
        (f.ci_low, f"{round(packet.confidence * 100)}% interval from {c.ci_low:+.3f}"),
        (f.ci_high, f"interval to {c.ci_high:+.3f}"),
        (f.holm_p, f"Holm p {c.holm_p:.3g}"),
    ]
    if {f.failures, f.episodes} <= cited:  # one figure read as one: "10 of 40 episodes failed"
        wording[1:3] = [(f.failures, f"{w.failures} of {w.episodes} episodes failed")]
    return ", ".join(text for name, text in wording if name in cited)


def _statement(claim: Claim, packet: EvidencePacket) -> str:
    pair = baseline_pair(packet, claim.world)
    assert pair is not None
    figures = _figures(claim, packet)
    cited = f" ({figures})" if figures else ""
    # no world name: the finding shows it beside the statement ("**boost** (supported):
    # lowered the failure rate against baseline …"), once
    return f"{_DIRECTION[claim.direction]} against {pair.vs}{cited}."


def written_readout(claims: ModelReadout, packet: EvidencePacket) -> WrittenReadout:
    """The prose of checked ``claims`` (``check_readout`` found nothing in them)."""
    summary = f"{len(packet.worlds)} worlds, {packet.episodes} episodes each. " + " ".join(
        (_validity(packet), _hypothesis(packet))
    )
    findings = [
        Finding(world=c.world, verdict=c.verdict, statement=_statement(c, packet))
        for c in claims.claims
    ]
    caveats = []
    if packet.budget is not None:
        b = packet.budget
        caveats.append(
            f"Spent {b.world_seconds_spent:.1f} of {b.world_seconds_budget:g} world-seconds, "
            f"at most {b.peak_concurrent_sandboxes} "
            f"{'sandbox' if b.peak_concurrent_sandboxes == 1 else 'sandboxes'} at once."
        )
    if packet.guard is not None:
        g = packet.guard
        caveats.append(
            f"Guard for {g.world}: {g.rule}. On {g.held_out_episodes} held-out episodes its "
            f"net is {g.held_out_net_after:+d}, against {g.held_out_net_before:+d} when "
            f"{g.world} is always applied."
        )
    return WrittenReadout(summary=summary, findings=findings, caveats=caveats)
