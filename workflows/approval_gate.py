"""The approval gate: who may decide an experiment's plan, and the log of every attempt.

A plain object over the serialisable ``ApprovalState`` (what status and result show), so
its rules are tested without a server. The workflow hands it the moment of each attempt
(``Moment``: the time, whether the run still runs, whether the plan awaits approval);
the gate answers with the attempt it recorded. An approval counts only with the right
token, for the current plan, before expiry, once; every other attempt is recorded with
its reason and changes nothing.
"""

from __future__ import annotations

import hmac
from dataclasses import dataclass
from datetime import datetime

from activities.approval_token import token_sha256
from workflows.messages import (
    ApprovalAttempt,
    ApprovalState,
    ApprovalStatus,
    ApproveSignal,
    RejectSignal,
    Stage,
    Status,
)


@dataclass(frozen=True)
class Moment:
    """What the gate needs to know about the run when an attempt arrives."""

    now: datetime
    status: Status
    stage: Stage
    #: The fingerprint of the plan under review (None before the plan exists).
    fingerprint: str | None


class ApprovalGate:
    """The approval rules and attempt log over one ``ApprovalState``."""

    def __init__(self, state: ApprovalState) -> None:
        self.state = state

    @classmethod
    def opening(cls, required: bool, token_hash: str, token_location: str) -> ApprovalGate:
        status = ApprovalStatus.pending if required else ApprovalStatus.not_required
        return cls(
            ApprovalState(status=status, token_sha256=token_hash, token_location=token_location)
        )

    @property
    def pending(self) -> bool:
        return self.state.status is ApprovalStatus.pending

    def approve(self, sig: ApproveSignal, at: Moment) -> ApprovalAttempt:
        refusal = self.refusal(sig, at)
        if refusal is None:
            return self._record(at.now, sig.approver, "accepted", ApprovalStatus.approved)
        return self._record(at.now, sig.approver, refusal)

    def reject(self, sig: RejectSignal, at: Moment) -> ApprovalAttempt:
        if not self.pending or at.status is not Status.running:
            reason = f"reject ignored: approval is already {self.state.status.value}"
            return self._record(at.now, sig.by, reason)
        reason = f"rejected{': ' + sig.reason if sig.reason else ''}"
        return self._record(at.now, sig.by, reason, ApprovalStatus.rejected)

    def expire(self) -> None:
        self.state.status = ApprovalStatus.expired

    def refusal(self, sig: ApproveSignal, at: Moment) -> str | None:
        """Why ``sig`` cannot approve the plan at ``at`` (None: it approves)."""
        state = self.state
        if state.status is ApprovalStatus.approved:
            return "already approved: an approval token counts once"
        if state.status is ApprovalStatus.rejected:
            return "the experiment was rejected; start it again under a new spec id"
        if state.status is ApprovalStatus.expired:
            return "the approval window has expired; start it again under a new spec id"
        if state.status is ApprovalStatus.not_required:
            return "this experiment's spec does not require approval"
        if at.status is not Status.running:
            return f"the experiment has already ended ({at.status.value})"
        if at.fingerprint is None or at.stage is not Stage.awaiting_approval:
            return f"the plan is not ready yet (stage {at.stage.value}); approve once it is"
        if not hmac.compare_digest(token_sha256(sig.token), state.token_sha256):
            return "wrong token: use the token printed (and filed) when the experiment started"
        if sig.fingerprint != at.fingerprint:
            return (
                f"wrong plan fingerprint {sig.fingerprint[:16] or '(empty)'}: the current plan "
                f"is {at.fingerprint}; review that plan and approve it"
            )
        if state.expires_at is not None and at.now >= state.expires_at:
            return "the approval window has expired; start it again under a new spec id"
        return None

    def _record(
        self, now: datetime, who: str, reason: str, decision: ApprovalStatus | None = None
    ) -> ApprovalAttempt:
        """Every approve/reject is recorded; only a ``decision`` changes the approval."""
        attempt = ApprovalAttempt(
            at=now, approver=who, accepted=decision is ApprovalStatus.approved, reason=reason
        )
        self.state.attempts.append(attempt)
        if decision is not None:
            self.state.status = decision
            self.state.decided_by = who
            self.state.decided_at = now
        return attempt
