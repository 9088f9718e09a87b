"""A cohort plan of ``runs`` failed runs forked at step 3, for the pure cohort tests (votes,
waves, looks) that need a plan and no Temporal."""

from __future__ import annotations

from forklab.experiments.cohort.plan import CohortPlan, CohortRun, RunStatus, cohort_digest
from forklab.experiments.runfork.policy import ToolPolicy


def failed_plan(runs: int, prefix: str) -> CohortPlan:
    """Runs ``<prefix>0`` … ``<prefix><runs - 1>``, each failed at step 4, forked at 3."""
    plan = CohortPlan(
        runs=[
            CohortRun(
                workflow_id=f"{prefix}{i}",
                run_id=f"run-{i}",
                chain_run_ids=[f"run-{i}"],
                workflow_type="Agent",
                status=RunStatus.failed,
                fork_point="failed",
                at_step=3,
                decisive_step=4,
                prefix_sha256="a" * 64,
                failed=True,
            )
            for i in range(runs)
        ],
        excluded=[],
        tools={"search": ToolPolicy.live},
    )
    plan.digest = cohort_digest(plan)
    return plan
