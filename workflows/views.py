"""What a run shows: the status query, the Web UI's details, the result and the analysis'
account of the infrastructure. Pure functions of a ``RunState``."""

from __future__ import annotations

from activities.models import AnalysisResult, BatchStatus
from experiments.outcomes import InfraUsage
from workflows.messages import ExperimentResult, RunProgress, StatusView
from workflows.run_state import RunState


def progress(state: RunState) -> RunProgress:
    values = list(state.batches.values())
    plan = state.plan
    return RunProgress(
        prefix_chunks=len(plan.capacity.chunks) if plan else 0,
        prefixes_done=len(state.prefixes),
        batches=plan.capacity.batches if plan else 0,
        batches_completed=sum(b.status is BatchStatus.completed for b in values),
        batches_failed=sum(b.status is BatchStatus.failed for b in values),
        batches_skipped=sum(b.status is BatchStatus.skipped for b in values),
        running=state.ledger.running,
    )


def status_view(state: RunState) -> StatusView:
    return StatusView(
        experiment_id=state.spec.id,
        status=state.status,
        stage=state.stage,
        message=state.message,
        error=state.error,
        plan=state.plan,
        approval=state.gate.state,
        budget=state.ledger.use,
        progress=progress(state),
        cleanup=state.cleanup,
        evidence_log=state.evidence_log,
    )


def details(state: RunState) -> str:
    """The Markdown the Web UI shows as the workflow's current details."""
    p = progress(state)
    b = state.ledger.use
    lines = [
        f"**{state.spec.id}** · stage **{state.stage.value}** · {state.message}",
        "",
        f"- prefixes: {p.prefixes_done}/{p.prefix_chunks} chunks",
        f"- world batches: {p.batches_completed}/{p.batches} done, {p.batches_failed} failed, "
        f"{p.batches_skipped} skipped, {p.running} running",
        f"- budget: {b.spent_world_seconds:.1f} of {b.max_world_seconds:g} world-seconds "
        f"spent, {b.reserved_world_seconds:.1f} reserved",
        f"- approval: {state.gate.state.status.value}",
    ]
    if state.plan:
        lines.append(f"- plan fingerprint: `{state.plan.fingerprint}`")
        if state.plan.snapshot.workload_bundle:
            lines.append(f"- workload bundle: `{state.plan.snapshot.workload_bundle}`")
    return "\n".join(lines)


def isolation(state: RunState) -> str:
    """Whether every sandbox ran in bubblewrap with a private network, or why not."""
    ran: list[tuple[bool, str | None, str | None]] = [
        (p.network_isolated, p.note, p.confinement) for p in state.prefixes.values()
    ]
    ran += [
        (b.network_isolated, b.note, b.confinement)
        for b in state.batches.values()
        if b.status is not BatchStatus.skipped
    ]
    notes = [
        note or "no reason given"
        for isolated, note, confinement in ran
        if not isolated or confinement not in (None, "bubblewrap")
    ]
    if not notes:
        return f"every sandbox ({len(ran)}) ran in bubblewrap with a private network namespace"
    return f"{len(notes)} of {len(ran)} sandboxes fell back: {notes[0]}"


def infra(state: RunState) -> InfraUsage:
    """The analysis' account of the infrastructure the run used."""
    b = state.ledger.use
    return InfraUsage(
        world_seconds_budget=b.max_world_seconds,
        world_seconds_spent=round(b.spent_world_seconds, 6),
        max_concurrent_sandboxes=b.max_concurrent_sandboxes,
        peak_concurrent_sandboxes=b.peak_concurrent_sandboxes,
        skipped_batches=b.skipped_batches,
        sandboxes_left=state.cleanup.left if state.cleanup else 0,
    )


def provenance(state: RunState) -> dict[str, str]:
    """The report's provenance lines: plan, snapshot, approval, budget, isolation, cleanup."""
    assert state.plan is not None
    b = state.ledger.use
    approval = state.gate.state
    cleanup = state.cleanup
    return {
        "plan fingerprint": f"`{state.plan.fingerprint}`",
        "snapshot": f"`{state.plan.snapshot.snapshot_id}` ({state.plan.snapshot.backend})",
        "workload bundle": (
            f"`{state.plan.snapshot.workload_bundle}` (shipped by forklab start)"
            if state.plan.snapshot.workload_bundle
            else "none: the workload is built into ForkLab"
        ),
        "provenance": state.plan.snapshot.provenance or "not recorded",
        "approval": (
            f"{approval.status.value} by {approval.decided_by}"
            if approval.decided_by
            else approval.status.value
        ),
        "budget": f"{b.spent_world_seconds:.1f} of {b.max_world_seconds:g} world-seconds",
        "skipped batches": str(b.skipped_batches),
        "network isolation": isolation(state),
        "cleanup": (
            f"{cleanup.found} found, {cleanup.removed} removed, {cleanup.left} left"
            if cleanup
            else "not run"
        ),
    }


def result(state: RunState, analysis: AnalysisResult | None) -> ExperimentResult:
    skipped = [
        f"{b.world} episodes {b.chunk.first}..{b.chunk.stop - 1}: {b.error}"
        for b in state.batches.values()
        if b.status is BatchStatus.skipped
    ]
    plan = state.plan
    return ExperimentResult(
        experiment_id=state.spec.id,
        status=state.status,
        error=state.error,
        plan_fingerprint=plan.fingerprint if plan else None,
        snapshot_id=plan.snapshot.snapshot_id if plan else None,
        approval=state.gate.state,
        budget=state.ledger.use,
        cleanup=state.cleanup,
        analysis=analysis,
        skipped=skipped,
        network_isolation=isolation(state),
        runs=state.runs,
        evidence_log=state.evidence_log,
    )
