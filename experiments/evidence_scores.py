"""The validity checks as scores in [0, 1], the form an evaluation ledger (Braintrust)
keeps them in: one set for the experiment, one per world.

Experiment scores: each validity check is 1 when it passed, 0 when it failed; the
intervention effect is the share of compared worlds whose verdict is ``supported`` (so a
half-right hypothesis scores 0.5, not 0). A world's scores are the checks that concern it:
its own completion, code and snapshot identity, and — for a placebo, a positive control or
a treatment — whether it behaved as pre-registered.
"""

from __future__ import annotations

from experiments.analysis.verdicts import Verdict
from experiments.report.model import Report
from experiments.spec import Role

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
    common snapshot) as the durable run recorded them."""
    scores = {
        "completion": float(checks.get("completed", False)),
        "workload_identity": float(checks.get("workload_identity", False)),
        "common_snapshot": float(checks.get("common_snapshot", False)),
    }
    verdict = next((v for v in report.verdicts if v.world == world), None)
    if verdict is None:
        return scores
    ok = float(verdict.verdict is Verdict.supported)
    key = {
        Role.placebo: "placebo_fidelity",
        Role.positive_control: "positive_control_direction",
    }.get(verdict.role, "intervention_effect")
    scores[key] = ok
    return scores
