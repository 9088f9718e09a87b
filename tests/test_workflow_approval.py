"""The approval gate against a real server: only a signature by the run's approver key,
over the current plan and nonce, before expiry, once; forged, replayed, stolen and
wrong-key approvals are answered (Update) and recorded, and change nothing."""

from __future__ import annotations

import asyncio
import uuid
from concurrent.futures import Executor

import pytest
from orchestration_lab import SANDBOX_ACTIVITIES, Lab, make_spec, signed
from temporalio.client import WorkflowFailureError, WorkflowHandle
from temporalio.service import RPCError

from forklab.activities.experiment.approval_keys import (
    key_path,
    new_private_key,
    public_key_hex,
    read_private_key,
)
from forklab.workers.experiment.worker import build_worker
from forklab.workflows.experiment.messages import (
    ApprovalStatus,
    ExperimentInput,
    ExperimentResult,
    RejectRequest,
    Stage,
    Status,
    workflow_id,
)
from forklab.workflows.experiment.workflow import ExperimentWorkflow


async def _assert_nothing_ran(lab: Lab, handle: WorkflowHandle[object, object]) -> None:
    assert not SANDBOX_ACTIVITIES & set(await lab.activity_types(handle))
    assert lab.sandbox_folders() == []


async def test_forged_wrong_key_stale_and_replayed_approvals_change_nothing(lab: Lab) -> None:
    spec = make_spec(episodes=12)
    handle, key = await lab.start(spec)
    view = await lab.wait_for(handle, Stage.awaiting_approval)
    assert view.plan is not None and view.approval.public_key == public_key_hex(key)
    good = signed(view, key, "ann")
    refused = [
        await lab.send(handle, "approve", signed(view, new_private_key(), "mallory")),
        await lab.send(handle, "approve", good.model_copy(update={"signature": "ab" * 64})),
        await lab.send(handle, "approve", good.model_copy(update={"approver": "mallory"})),
        await lab.send(handle, "approve", signed(view, key, "ann", fingerprint="f" * 64)),
        await lab.send(handle, "approve", signed(view, key, "ann", nonce="0" * 32)),
    ]
    reasons = [a.reason.split(":")[0] for a in refused]
    assert reasons == [
        "bad signature",  # another key
        "bad signature",  # a made-up signature
        "bad signature",  # the right signature under another name
        "wrong plan fingerprint ffffffffffffffff",
        "stale nonce",
    ]
    assert not any(a.accepted for a in refused)
    view = await lab.status(handle)
    assert view.stage is Stage.awaiting_approval and view.approval.status is ApprovalStatus.pending
    await _assert_nothing_ran(lab, handle)

    accepted = await lab.send(handle, "approve", good)
    assert accepted.accepted and accepted.approver == "ann" and accepted.reason == "accepted"
    replayed = await lab.send(handle, "approve", good)
    assert not replayed.accepted and replayed.reason.startswith("already approved")
    result = await handle.result()
    assert result.status is Status.completed
    assert result.approval.decided_by == "ann" and result.approval.attempts_total == 7


async def test_a_signature_read_from_history_approves_nothing_else(lab: Lab) -> None:
    """Run A is approved; its request (in A's history) is replayed on run B of the same
    workflow id and spec (same plan fingerprint, another run and key): refused."""
    spec = make_spec(episodes=12)
    first, key_a = await lab.start(spec)
    view_a = await lab.wait_for(first, Stage.awaiting_approval)
    stolen = signed(view_a, key_a, "ann")
    assert (await lab.send(first, "approve", stolen)).accepted
    assert (await first.result()).status is Status.completed
    history = await lab.history_text(first)
    assert stolen.signature in history  # what a reader of history (or the UI) sees...
    secret = key_a.private_bytes_raw().hex()
    assert secret not in history and "PRIVATE KEY" not in history

    second, _ = await lab.start(spec)  # same workflow id, a new run with its own key
    view_b = await lab.wait_for(second, Stage.awaiting_approval)
    assert view_b.plan is not None and view_a.plan is not None
    assert view_b.plan.fingerprint == view_a.plan.fingerprint
    assert view_b.approval.run_id != view_a.approval.run_id
    verbatim = await lab.send(second, "approve", stolen)
    renonced = await lab.send(
        second, "approve", stolen.model_copy(update={"nonce": view_b.approval.nonce})
    )
    assert verbatim.reason.startswith("stale nonce")
    assert renonced.reason.startswith("bad signature")  # bound to run A and A's key
    await lab.send(second, "reject", RejectRequest(by="bob", reason="test over"))
    assert (await second.result()).status is Status.rejected
    await _assert_nothing_ran(lab, second)


async def test_expired_plan_ends_and_a_late_approval_is_refused(lab: Lab) -> None:
    spec = make_spec(approval={"required": True, "expiry_minutes": 0.05})  # 3 seconds
    handle, key = await lab.start(spec)
    view = await lab.wait_for(handle, Stage.awaiting_approval)
    result = await handle.result()
    assert result.status is Status.expired and result.approval.status is ApprovalStatus.expired
    await _assert_nothing_ran(lab, handle)
    with pytest.raises(RPCError, match="completed"):
        await lab.send(handle, "approve", signed(view, key))


async def test_reject_then_approve_is_refused_and_nothing_runs(lab: Lab) -> None:
    spec = make_spec()
    handle, key = await lab.start(spec)
    view = await lab.wait_for(handle, Stage.awaiting_approval)
    rejected = await lab.send(handle, "reject", RejectRequest(by="carol", reason="not today"))
    assert rejected.reason == "rejected: not today" and rejected.kind == "reject"
    late = await lab.send(handle, "approve", signed(view, key, "dave"))
    assert not late.accepted and late.reason.startswith("the experiment was rejected")
    result = await handle.result()
    assert result.status is Status.rejected and result.error == "rejected by carol"
    assert result.cleanup is not None and result.cleanup.found == 0
    await _assert_nothing_ran(lab, handle)
    root = lab.ledger.experiment(spec.id)
    assert root is not None and root.status == "rejected"


async def test_approval_before_the_plan_is_ready_is_refused(lab: Lab) -> None:
    spec = make_spec(params={"twin_sleep": 0.02})
    handle, _ = await lab.start(spec)
    early = await lab.send(
        handle,
        "approve",
        {"approver": "henry", "fingerprint": "", "nonce": "", "signature": ""},
    )
    assert early.reason.startswith("the plan is not ready yet")
    await lab.wait_for(handle, Stage.awaiting_approval)
    await lab.send(handle, "reject", RejectRequest())
    assert (await handle.result()).status is Status.rejected


async def test_without_a_key_a_worker_makes_one_keyed_by_workflow_and_run(lab: Lab) -> None:
    """Started without a public key (as by ``temporal workflow start``), the worker's
    activity writes an owner-only private key for this workflow id and run; the workflow
    keeps only the public key."""
    spec = make_spec(episodes=12)
    handle = await lab.client.start_workflow(
        ExperimentWorkflow.run,
        ExperimentInput(
            spec=spec, batch_episodes=12, rehearsal_episodes=0, workload_bundle=lab.ship(spec)
        ),
        id=workflow_id(spec.id),
        task_queue=lab.settings.task_queue,
        result_type=ExperimentResult,
    )
    view = await lab.wait_for(handle, Stage.awaiting_approval)
    path = key_path(lab.settings.home, handle.id, view.approval.run_id)
    assert view.approval.key_location.endswith(str(path.parent))
    assert path.stat().st_mode & 0o777 == 0o600
    assert path.parent.stat().st_mode & 0o777 == 0o700
    key = read_private_key(path)
    assert view.approval.public_key == public_key_hex(key)
    await lab.approve(handle, key)
    assert (await handle.result()).status is Status.completed
    history = await lab.history_text(handle)
    assert view.approval.public_key in history  # decoded payloads are searched...
    assert key.private_bytes_raw().hex() not in history and "PRIVATE KEY" not in history


async def test_the_worker_not_the_spec_decides_whether_approval_may_be_skipped(
    lab: Lab, cpu: Executor
) -> None:
    spec = make_spec(episodes=12, approval={"required": False, "expiry_minutes": 30})
    handle, _ = await lab.start(spec)  # the default worker: approval is never skipped
    view = await lab.wait_for(handle, Stage.awaiting_approval)
    assert view.approval.status is ApprovalStatus.pending
    assert "this worker's policy requires it" in view.approval.policy
    await lab.send(handle, "reject", RejectRequest(by="policy-test"))
    assert (await handle.result()).status is Status.rejected
    await _assert_nothing_ran(lab, handle)

    lenient = lab.settings.model_copy(
        update={"allow_unapproved": True, "task_queue": f"lenient-{uuid.uuid4().hex[:8]}"}
    )
    other = make_spec(episodes=12, approval={"required": False, "expiry_minutes": 30})
    async with build_worker(lab.client, lenient, cpu):
        result = await lab.client.execute_workflow(
            ExperimentWorkflow.run,
            ExperimentInput(
                spec=other, batch_episodes=12, rehearsal_episodes=0, workload_bundle=lab.ship(other)
            ),
            id=workflow_id(other.id),
            task_queue=lenient.task_queue,
            result_type=ExperimentResult,
        )
    assert result.status is Status.completed, result.error
    assert result.approval.status is ApprovalStatus.not_required
    assert "this worker allows it" in result.approval.policy


async def test_hostile_workload_cannot_read_the_key_a_worker_made(lab: Lab) -> None:
    """Started raw, the worker writes the private key under its home before the rehearsal;
    the rehearsal's workload code (in a box) looks for it there and finds nothing."""
    base = make_spec(episodes=12)
    home = lab.settings.home
    params = {"home": str(home), "port": lab.settings.port}
    spec = base.model_copy(
        update={
            "workload": base.workload.model_copy(
                update={"name": "orchestration_workloads:Hostile", "params": params}
            )
        }
    )
    handle = await lab.client.start_workflow(
        ExperimentWorkflow.run,
        ExperimentInput(
            spec=spec, batch_episodes=12, rehearsal_episodes=0, workload_bundle=lab.ship(spec)
        ),
        id=workflow_id(spec.id),
        task_queue=lab.settings.task_queue,
        result_type=ExperimentResult,
    )
    with pytest.raises(WorkflowFailureError):  # failed before approval: restartable
        await asyncio.wait_for(handle.result(), timeout=120)
    result = await lab.status(handle)
    keys = list((home / "approval-keys").rglob("*.key"))
    assert len(keys) == 1  # the key was there to steal
    assert result.status is Status.failed and result.error is not None
    assert "hostile report: secrets=[]" in result.error, result.error
    assert "PRIVATE" not in result.error
    assert result.approval.attempts_total == 0
