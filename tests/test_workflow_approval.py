"""The approval gate: only the right token, for the current plan, before expiry, once."""

from __future__ import annotations

import pytest
from orchestration_lab import SANDBOX_ACTIVITIES, Lab, make_spec
from temporalio.client import WorkflowHandle
from temporalio.service import RPCError

from activities.approval_token import token_sha256
from workflows.experiment import ExperimentWorkflow
from workflows.messages import (
    ApprovalStatus,
    ApproveSignal,
    ExperimentInput,
    RejectSignal,
    Stage,
    Status,
    StatusView,
    workflow_id,
)


async def _refused(lab: Lab, handle: WorkflowHandle[object, object], count: int) -> StatusView:
    return await lab.wait_until(handle, lambda v: len(v.approval.attempts) >= count)


async def _assert_nothing_ran(lab: Lab, handle: WorkflowHandle[object, object]) -> None:
    assert not SANDBOX_ACTIVITIES & set(await lab.activity_types(handle))
    assert lab.sandbox_folders() == []


async def test_wrong_token_and_wrong_fingerprint_change_nothing(lab: Lab) -> None:
    spec = make_spec()
    handle, token = await lab.start(spec)
    view = await lab.wait_for(handle, Stage.awaiting_approval)
    assert view.plan is not None
    fingerprint = view.plan.fingerprint
    await handle.signal(
        ExperimentWorkflow.approve,
        ApproveSignal(token="0" * 64, fingerprint=fingerprint, approver="mallory"),
    )
    await handle.signal(
        ExperimentWorkflow.approve,
        ApproveSignal(token=token, fingerprint="f" * 64, approver="bob"),
    )
    view = await _refused(lab, handle, 2)
    wrong_token, wrong_plan = view.approval.attempts
    assert not wrong_token.accepted and wrong_token.reason.startswith("wrong token")
    assert not wrong_plan.accepted and wrong_plan.reason.startswith("wrong plan fingerprint")
    assert fingerprint in wrong_plan.reason
    assert view.stage is Stage.awaiting_approval and view.approval.status is ApprovalStatus.pending
    await _assert_nothing_ran(lab, handle)
    await handle.signal(ExperimentWorkflow.reject, RejectSignal(by="bob", reason="test over"))
    result = await handle.result()
    assert result.status is Status.rejected
    await _assert_nothing_ran(lab, handle)


async def test_approval_after_reject_is_refused_and_nothing_runs(lab: Lab) -> None:
    spec = make_spec()
    handle, token = await lab.start(spec)
    view = await lab.wait_for(handle, Stage.awaiting_approval)
    assert view.plan is not None
    await handle.signal(ExperimentWorkflow.reject, RejectSignal(by="carol", reason="not today"))
    await handle.signal(
        ExperimentWorkflow.approve,
        ApproveSignal(token=token, fingerprint=view.plan.fingerprint, approver="dave"),
    )
    result = await handle.result()
    assert result.status is Status.rejected and result.error == "rejected by carol"
    view = await lab.status(handle)  # queries still answer after the workflow closed
    late = [a for a in view.approval.attempts if a.approver == "dave"]
    assert len(late) == 1 and not late[0].accepted
    assert late[0].reason.startswith("the experiment was rejected")
    assert result.cleanup is not None and result.cleanup.found == 0
    await _assert_nothing_ran(lab, handle)
    root = lab.ledger.experiment(spec.id)
    assert root is not None and root.status == "rejected"


async def test_expired_plan_ends_and_a_late_approval_is_refused(lab: Lab) -> None:
    spec = make_spec(approval={"required": True, "expiry_minutes": 0.05})  # 3 seconds
    handle, token = await lab.start(spec)
    view = await lab.wait_for(handle, Stage.awaiting_approval)
    assert view.plan is not None
    result = await handle.result()
    assert result.status is Status.expired
    assert result.approval.status is ApprovalStatus.expired
    await _assert_nothing_ran(lab, handle)
    with pytest.raises(RPCError, match="completed"):
        await handle.signal(
            ExperimentWorkflow.approve,
            ApproveSignal(token=token, fingerprint=view.plan.fingerprint, approver="erin"),
        )


async def test_a_token_counts_once(lab: Lab) -> None:
    spec = make_spec(episodes=12)
    handle, token = await lab.start(spec)
    view = await lab.approve(handle, token, approver="frank")
    assert view.plan is not None
    await handle.signal(
        ExperimentWorkflow.approve,
        ApproveSignal(token=token, fingerprint=view.plan.fingerprint, approver="grace"),
    )
    result = await handle.result()
    assert result.status is Status.completed
    first, second = result.approval.attempts
    assert first.accepted and first.approver == "frank"
    assert not second.accepted and second.reason.startswith("already approved")
    assert result.approval.decided_by == "frank"


async def test_approval_before_the_plan_is_ready_is_refused(lab: Lab) -> None:
    spec = make_spec(params={"twin_sleep": 0.02})
    handle, token = await lab.start(spec)
    await handle.signal(
        ExperimentWorkflow.approve,
        ApproveSignal(token=token, fingerprint="", approver="henry"),
    )
    view = await _refused(lab, handle, 1)
    assert view.approval.attempts[0].reason.startswith("the plan is not ready yet")
    await lab.wait_for(handle, Stage.awaiting_approval)
    await handle.signal(ExperimentWorkflow.reject, RejectSignal())
    assert (await handle.result()).status is Status.rejected


async def test_without_a_token_hash_a_worker_issues_one(lab: Lab) -> None:
    """Started without a hash (as by ``temporal workflow start``), the worker's activity
    writes an owner-only token file and the workflow keeps only its hash."""
    spec = make_spec(episodes=12)
    handle = await lab.client.start_workflow(
        ExperimentWorkflow.run,
        ExperimentInput(spec=spec, batch_episodes=12, rehearsal_episodes=0),
        id=workflow_id(spec.id),
        task_queue=lab.settings.task_queue,
    )
    view = await lab.wait_for(handle, Stage.awaiting_approval)
    path = lab.settings.home / "tokens" / f"{spec.id}.token"
    assert view.approval.token_location.endswith(str(path))
    assert path.stat().st_mode & 0o777 == 0o600
    token = path.read_text().strip()
    assert view.approval.token_sha256 == token_sha256(token) != token
    await lab.approve(handle, token)
    assert (await handle.result()).status is Status.completed
