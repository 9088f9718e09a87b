"""The Braintrust spans of an experiment over a cohort, when Braintrust is configured: one
root span for the experiment (hypothesis, spec, plan fingerprint and cohort digest,
approval, budget spent, status, the noise floor) and one child span per world (its role
and one-line description, rescues, harms and unchanged runs by majority, the rate change
and its Holm-adjusted p, the verdict, forks, tokens and world-seconds, and the ``forklab
diff`` command of each rescued and harmed run). Scores in [0, 1]: whether each world's
verdict is what its role expects, and on the root the share of worlds that are.

Like a workload experiment's trace it goes through the evidence log's outbox
(``EvidenceActivities.send``): written after the ledger rows, sent, or queued and sent
by the next experiment; it never replaces the ledger, whose fork rows hold each fork.
"""

from __future__ import annotations

import json
from typing import Any

from forklab.activities.experiment.evidence_log import Span, Trace
from forklab.contracts.cohort import CohortLedgerInput


def _approval(approval_json: str) -> dict[str, Any]:
    """The approval state without the nonce a next approval would have to sign."""
    state: dict[str, Any] = json.loads(approval_json)
    state.pop("nonce", None)
    return state


def cohort_trace(inp: CohortLedgerInput) -> Trace:
    key = f"{inp.experiment_id}:{inp.run_id}"
    report = inp.report
    lines = report.worlds if report else []
    root = Span(
        id=f"{key}:root",
        name=f"cohort experiment {inp.experiment_id}",
        input={"hypothesis": inp.spec.hypothesis.text, "spec": inp.spec.canonical()},
        output={
            "status": inp.status,
            "error": inp.error,
            "runs": report.runs if report else None,
            "flip_rate": report.flip_rate if report else None,
            "flip_ci": [report.flip_ci_low, report.flip_ci_high] if report else None,
            "missing_forks": report.missing_forks if report else None,
            "saved_forks": report.saved_forks if report else None,
        },
        metadata={
            "plan_fingerprint": inp.fingerprint,
            "cohort_digest": inp.plan_digest,
            "approval": _approval(inp.approval_json),
            "spent": json.loads(inp.budget_json),
            "report_digest": report.report_sha256 if report else None,
            "run_id": inp.run_id,
        },
        scores=({"as_expected": sum(w.as_expected for w in lines) / len(lines)} if lines else {}),
    )
    worlds = []
    for w in lines:
        cost = inp.costs.get(w.world)
        worlds.append(
            Span(
                id=f"{key}:world:{w.world}",
                name=f"world {w.world}",
                input={"world": w.world, "role": w.role, "description": w.description},
                output={
                    "verdict": w.verdict,
                    "rescues": w.rescues,
                    "harms": w.harms,
                    "unchanged": w.unchanged,
                    "rate_difference": w.rate_difference,
                    "holm_p": w.holm_p,
                },
                metadata={"rescued": w.rescued, "harmed": w.harmed, "text": w.text},
                metrics=(
                    {"forks": cost.forks, "tokens": cost.tokens, "world_seconds": cost.seconds}
                    if cost
                    else {}
                ),
                scores={"as_expected": 1.0 if w.as_expected else 0.0},
            )
        )
    return Trace(experiment=f"{inp.experiment_id}-{inp.run_id[:8]}", root=root, worlds=worlds)
