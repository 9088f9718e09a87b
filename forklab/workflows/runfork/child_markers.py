"""The marker a run gives each child workflow it starts: its lineage root and, on a fork,
what the fork's calls follow."""

from __future__ import annotations

from temporalio import workflow

from forklab.workflows.runfork.fork_state import ForkState

with workflow.unsafe.imports_passed_through():
    from forklab.contracts.runfork import CohortFork, ForkMarker, ModelSwap
    from forklab.experiments.runfork.receipt import BoundaryMode


def child_marker(state: ForkState, cohort: CohortFork | None) -> ForkMarker:
    """What a child of this run inherits: no steps, the lineage root, and on a fork its
    policies, intervention and the model its calls would use now; on a cohort
    experiment's fork, its ``cohort`` part."""
    info = workflow.info()
    marker = state.marker
    model = marker.model_at(state.base + state.calls + 1) if marker is not None else None
    return ForkMarker(
        parent_workflow_id=info.workflow_id,
        source_run_id=info.run_id,
        base_step=0,
        at_step=0,
        boundary=BoundaryMode.lineage_only,
        lineage_root=state.lineage_root,
        model=model,
        model_swaps=[ModelSwap(after_step=0, model=model)] if model is not None else [],
        tool_policies=marker.tool_policies if marker is not None else {},
        intervention=marker.intervention if marker is not None else None,
        cohort=cohort,
        team=marker.team.model_copy(update={"held": False})
        if marker is not None and marker.team is not None
        else None,
        child_of=info.workflow_id,
    )
