"""The approval gate's rules, without a server: who may decide, and the attempt log."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from activities.approval_token import new_token, token_sha256
from workflows.approval_gate import ApprovalGate, Moment
from workflows.messages import ApprovalStatus, ApproveSignal, RejectSignal, Stage, Status

T0 = datetime(2026, 1, 1, tzinfo=UTC)
PLAN = "a" * 64


def at(
    minutes: float = 0.0, status: Status = Status.running, stage: Stage = Stage.awaiting_approval
) -> Moment:
    return Moment(now=T0 + timedelta(minutes=minutes), status=status, stage=stage, fingerprint=PLAN)


def gate(token: str) -> ApprovalGate:
    g = ApprovalGate.opening(True, token_sha256(token), "host:/t")
    g.state.expires_at = T0 + timedelta(minutes=30)
    return g


def test_only_the_right_token_for_the_current_plan_before_expiry_approves_once() -> None:
    token = new_token()
    g = gate(token)
    refusals = [
        g.approve(ApproveSignal(token=new_token(), fingerprint=PLAN, approver="m"), at()),
        g.approve(ApproveSignal(token=token, fingerprint="b" * 64, approver="m"), at()),
        g.approve(ApproveSignal(token=token, fingerprint=PLAN, approver="m"), at(31)),
        g.approve(
            ApproveSignal(token=token, fingerprint=PLAN, approver="m"),
            at(stage=Stage.rehearsing),
        ),
    ]
    assert [a.reason.split(" ")[0] for a in refusals] == ["wrong", "wrong", "the", "the"]
    assert not any(a.accepted for a in refusals) and g.pending
    ok = g.approve(ApproveSignal(token=token, fingerprint=PLAN, approver="ann"), at(1))
    assert ok.accepted and g.state.status is ApprovalStatus.approved
    again = g.approve(ApproveSignal(token=token, fingerprint=PLAN, approver="bob"), at(2))
    assert not again.accepted and again.reason.startswith("already approved")
    assert g.state.decided_by == "ann" and len(g.state.attempts) == 6


def test_reject_decides_once_and_later_attempts_change_nothing() -> None:
    token = new_token()
    g = gate(token)
    first = g.reject(RejectSignal(by="carol", reason="not today"), at())
    assert first.reason == "rejected: not today" and g.state.status is ApprovalStatus.rejected
    late = g.approve(ApproveSignal(token=token, fingerprint=PLAN, approver="dave"), at())
    assert late.reason.startswith("the experiment was rejected")
    again = g.reject(RejectSignal(by="erin"), at())
    assert again.reason == "reject ignored: approval is already rejected"
    assert g.state.decided_by == "carol"
