"""The evidence packet: hypothesis, worlds, counts, intervals, verdicts, checks, guard and
budget of a finished report — nothing else (no spec, no code, no outcomes per episode)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from forklab.experiments.experiment.report.model import Report
from forklab.experiments.experiment.results import CheckKind


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class PacketWorld(_Frozen):
    name: str
    role: str
    status: str
    episodes: int
    failures: int
    failure_rate: float
    failure_ci_low: float
    failure_ci_high: float


class PacketComparison(_Frozen):
    """``difference`` is the world's success rate minus the reference's."""

    world: str
    vs: str
    rescue: int
    harm: int
    unchanged: int
    net: int
    difference: float
    ci_low: float
    ci_high: float
    holm_p: float


class PacketVerdict(_Frozen):
    world: str
    expected: str
    verdict: str


class PacketCheck(_Frozen):
    """``kind`` keeps the two questions apart: a ``validity`` check says whether the
    experiment can be trusted at all, an ``effect`` check whether the effects went the way
    the hypothesis said (a failed one refutes nothing about validity)."""

    name: str
    kind: CheckKind
    passed: bool


class PacketGuard(_Frozen):
    world: str
    rule: str
    held_out_episodes: int
    held_out_net_before: int
    held_out_net_after: int


class PacketBudget(_Frozen):
    world_seconds_budget: float
    world_seconds_spent: float
    max_concurrent_sandboxes: int
    peak_concurrent_sandboxes: int


class EvidencePacket(_Frozen):
    experiment_id: str
    hypothesis: str
    episodes: int
    confidence: float
    valid: bool
    worlds: list[PacketWorld]
    comparisons: list[PacketComparison]
    verdicts: list[PacketVerdict]
    checks: list[PacketCheck]
    guard: PacketGuard | None
    budget: PacketBudget | None


def evidence_packet(report: Report) -> EvidencePacket:
    guard = report.guard
    infra = report.infra
    return EvidencePacket(
        experiment_id=report.experiment.id,
        hypothesis=report.experiment.hypothesis,
        episodes=report.experiment.episodes,
        confidence=report.settings.confidence,
        valid=report.valid,
        worlds=[
            PacketWorld(
                name=w.name,
                role=w.role.value,
                status=w.status.value,
                episodes=w.episodes,
                failures=w.failures,
                failure_rate=w.failure_rate,
                failure_ci_low=w.failure_ci_low,
                failure_ci_high=w.failure_ci_high,
            )
            for w in report.worlds
        ],
        comparisons=[
            PacketComparison(
                world=c.world,
                vs=c.vs,
                rescue=c.rescue,
                harm=c.harm,
                unchanged=c.unchanged,
                net=c.net,
                difference=c.difference,
                ci_low=c.ci_low,
                ci_high=c.ci_high,
                holm_p=c.holm_p,
            )
            for c in report.comparisons
        ],
        verdicts=[
            PacketVerdict(world=v.world, expected=v.expected.value, verdict=v.verdict.value)
            for v in report.verdicts
        ],
        checks=[PacketCheck(name=c.name, kind=c.kind, passed=c.passed) for c in report.checks],
        guard=None
        if guard is None
        else PacketGuard(
            world=guard.world,
            rule=guard.words,
            held_out_episodes=guard.held_out.before.episodes,
            held_out_net_before=guard.held_out.before.net,
            held_out_net_after=guard.held_out.after.net,
        ),
        budget=None
        if infra is None
        else PacketBudget(
            world_seconds_budget=infra.world_seconds_budget,
            world_seconds_spent=infra.world_seconds_spent,
            max_concurrent_sandboxes=infra.max_concurrent_sandboxes,
            peak_concurrent_sandboxes=infra.peak_concurrent_sandboxes,
        ),
    )
