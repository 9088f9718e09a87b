"""What a run shows: the status query, the Web UI's details, the result and the analysis'
account of the infrastructure. Pure functions of a ``RunState``."""

from __future__ import annotations

from forklab.contracts.experiment import AnalysisResult
from forklab.experiments.experiment.results import InfraUsage
from forklab.workflows.experiment.messages import ExperimentResult, RunProgress, StatusView
from forklab.workflows.experiment.run_state import RunState


def progress(state: RunState) -> RunProgress:
    worlds = state.tally.worlds.values()
    plan = state.plan
    return RunProgress(
        prefix_chunks=plan.capacity.prefix_chunks if plan else 0,
        prefixes_done=state.tally.prefixes.count(),
        batches=plan.capacity.batches if plan else 0,
        batches_completed=sum(w.completed for w in worlds),
        batches_failed=sum(w.failed for w in worlds),
        batches_skipped=sum(w.skipped for w in worlds),
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
        looks=state.tally.looks,
    )


def details(state: RunState) -> str:
    """The Markdown the Web UI shows as the workflow's current details."""
    p = progress(state)
    b = state.ledger.use
    lines = [
        f"**{state.spec.id}** · stage **{state.stage.value}** · {state.message}",
        "",
    ]
    if state.verdicts:
        lines += ["**Verdicts**", "", *(f"- {v}" for v in state.verdicts), "", "**Run**", ""]
    lines += [
        f"- prefixes: {p.prefixes_done}/{p.prefix_chunks} chunks{_handed(state)}",
        f"- world batches: {p.batches_completed}/{p.batches} done, {p.batches_failed} failed, "
        f"{p.batches_skipped} skipped; {p.running} sandboxes running",
        f"- budget: {b.spent_world_seconds:.1f} of {b.max_world_seconds:g} world-seconds "
        f"spent, {b.reserved_world_seconds:.1f} reserved",
        f"- approval: {state.gate.state.status.value}{_approvers(state)}",
    ]
    if state.tally.looks:
        last = state.tally.looks[-1]
        lines.append(
            f"- look {last.look}: "
            + ", ".join(f"{w.world} {w.decision.value} (Z {w.statistic:+.2f})" for w in last.worlds)
            + f"; {b.unspent_world_episodes} world-episodes unspent"
        )
    if state.cleanup is not None:
        lines.append(f"- cleanup: {state.cleanup.summary()}")
    if state.evidence_log is not None:
        lines.append(f"- evidence log: {state.evidence_log}")
    if state.plan:
        lines.append(f"- plan fingerprint: `{state.plan.fingerprint}`")
        if state.plan.snapshot.workload_bundle:
            lines.append(f"- workload bundle: `{state.plan.snapshot.workload_bundle}`")
    return "\n".join(lines)


def _approvers(state: RunState) -> str:
    """Who the worker's policy lets approve, when it names anyone."""
    gate = state.gate.state
    if not gate.approvers:
        return ""
    names = ", ".join(a.name for a in gate.approvers[:10])
    more = f" and {len(gate.approvers) - 10} more" if len(gate.approvers) > 10 else ""
    who = f"requested by {gate.requester}" if gate.requester else "requester unsigned"
    rule = "" if gate.requester_may_approve else ", who may not approve it"
    return f" by a registered approver ({names}{more}); {who}{rule}"


def _handed(state: RunState) -> str:
    plan = state.plan
    return " (run by the rehearsal)" if plan and plan.rehearsal.prefixes else ""


def isolation(state: RunState) -> str:
    """Whether every sandbox ran in bubblewrap with a private network, or why not; and
    where the prefixes ran when the rehearsal handed them over."""
    t = state.tally
    if not t.fallbacks:
        line = f"every sandbox ({t.sandboxes}) ran in bubblewrap with a private network namespace"
    else:
        line = f"{t.fallbacks} of {t.sandboxes} sandboxes fell back: {t.fallback_note}"
    rehearsal = state.plan.rehearsal if state.plan else None
    if rehearsal is not None and rehearsal.prefixes is not None:
        box = (
            "in bubblewrap with no network"
            if rehearsal.confinement in (None, "bubblewrap")
            else f"as a confined process ({rehearsal.note or 'no reason given'})"
        )
        line += f"; the prefixes ran once, in the rehearsal's box {box}"
    return line


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
    design = state.plan.capacity.wave_ends
    unspent = (
        {
            "unspent": f"{b.unspent_world_episodes} world-episodes (~"
            f"{b.unspent_world_seconds:.1f} world-seconds) the sequential design's stops "
            f"left, after {len(state.tally.looks)} of {len(design)} looks"
        }
        if design
        else {}
    )
    return {
        "plan fingerprint": f"`{state.plan.fingerprint}`",
        "snapshot": f"`{state.plan.snapshot.snapshot_id}` ({state.plan.snapshot.backend})",
        "workload bundle": (
            f"`{state.plan.snapshot.workload_bundle}` (shipped by forklab start)"
            if state.plan.snapshot.workload_bundle
            else "none: the workload is built into ForkLab"
        ),
        "provenance": state.plan.snapshot.provenance or "not recorded",
        "prefixes": state.plan.prefixes,
        "approval": (
            f"{approval.status.value} by {approval.decided_by}"
            if approval.decided_by
            else approval.status.value
        ),
        "budget": f"{b.spent_world_seconds:.1f} of {b.max_world_seconds:g} world-seconds",
        **unspent,
        "skipped batches": str(b.skipped_batches),
        "network isolation": isolation(state),
        "cleanup": cleanup.summary() if cleanup else "not run",
    }


def result(state: RunState, analysis: AnalysisResult | None) -> ExperimentResult:
    skipped = list(state.tally.skipped_lines)
    total = sum(w.skipped for w in state.tally.worlds.values())
    if total > len(skipped):
        skipped.append(f"... and {total - len(skipped)} more (the stored progress has every one)")
    plan = state.plan
    return ExperimentResult(
        experiment_id=state.spec.id,
        status=state.status,
        error=state.error,
        verdicts=analysis.verdicts if analysis else [],
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
