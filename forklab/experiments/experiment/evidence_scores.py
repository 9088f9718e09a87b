"""The validity checks as scores in [0, 1], the form an evaluation ledger (Braintrust)
keeps them in: one set for the experiment, one per world.

Experiment scores: each validity check is 1 when it passed, 0 when it failed; the
intervention effect is the share of compared worlds whose verdict is ``supported`` (so a
half-right hypothesis scores 0.5, not 0). A world's scores are the checks that concern it:
its own completion, code and snapshot identity, and — for a placebo, a positive control or
a treatment — whether it behaved as pre-registered.
"""

from __future__ import annotations

from forklab.experiments.experiment.analysis.verdicts import Verdict
from forklab.experiments.experiment.report.model import Report
from forklab.experiments.experiment.results import WorldStatus
from forklab.experiments.experiment.spec import Direction, Role

#: Score name → the report's check it reads (``intervention_effect`` reads the verdicts).
CHECK_SCORES = {
    "completion": "completion",
    "workload_identity": "workload_identity",
    "common_snapshot": "common_snapshot",
    "common_random_numbers": "common_random_numbers",
    "placebo_fidelity": "placebo_fidelity",
    "positive_control_direction": "positive_control",
    "infrastructure_fit": "infrastructure_fit",
}
SCORE_NAMES = (*CHECK_SCORES, "intervention_effect")


def experiment_scores(report: Report) -> dict[str, float]:
    passed = {c.name: c.passed for c in report.checks}
    scores = {
        score: float(passed[check]) for score, check in CHECK_SCORES.items() if check in passed
    }
    if report.verdicts:
        supported = sum(v.verdict is Verdict.supported for v in report.verdicts)
        scores["intervention_effect"] = supported / len(report.verdicts)
    return scores


def world_scores(report: Report, world: str, checks: dict[str, bool]) -> dict[str, float]:
    """``checks`` are the world's own provenance checks (completed, workload identity,
    common snapshot) as the durable run recorded them. A placebo's and a positive
    control's score is this world's part of the experiment's check (its numbers against
    the baseline's, whatever the other checks say); a treatment's is its verdict, which a
    failed validity check makes ``invalid`` (0): an effect is only claimed when valid."""
    scores = {
        "completion": float(checks.get("completed", False)),
        "workload_identity": float(checks.get("workload_identity", False)),
        "common_snapshot": float(checks.get("common_snapshot", False)),
    }
    verdict = next((v for v in report.verdicts if v.world == world), None)
    if verdict is None:
        return scores
    if verdict.role is Role.placebo:
        scores["placebo_fidelity"] = float(_behaved(report, world, Direction.none))
    elif verdict.role is Role.positive_control:
        scores["positive_control_direction"] = float(_behaved(report, world, verdict.expected))
    else:
        scores["intervention_effect"] = float(verdict.verdict is Verdict.supported)
    return scores


def _behaved(report: Report, world: str, expected: Direction) -> bool:
    """Whether ``world`` moved as pre-registered against the baseline, as the
    ``placebo_fidelity`` and ``positive_control`` checks judge it: a placebo episode for
    episode identical, a positive control's failure rate on the expected side."""
    rows = {w.name: w for w in report.worlds}
    base = next((w for w in report.worlds if w.role is Role.baseline), None)
    mine = rows.get(world)
    if base is None or mine is None:
        return False
    if report.sequential is not None:
        # judged as its design: a control may have stopped once its check was decided
        path = next((p for p in report.sequential.worlds if p.world == world), None)
        return path is not None and path.verdict is Verdict.supported
    done = WorldStatus.completed
    if base.status is not done or mine.status is not done or mine.episodes != base.episodes:
        return False
    if expected is Direction.none and mine.role is Role.placebo:
        pair = next((c for c in report.comparisons if c.world == world and c.vs == base.name), None)
        return pair is not None and pair.rescue == 0 and pair.harm == 0
    if expected is Direction.increase:
        return mine.failure_rate > base.failure_rate
    if expected is Direction.decrease:
        return mine.failure_rate < base.failure_rate
    return mine.failure_rate == base.failure_rate
