"""The approval gate: who may decide an experiment's plan, and the log of every attempt.

A plain object over the serialisable ``ApprovalState`` (what status and result show), so
its rules are tested without a server. The workflow hands it the moment of each attempt
(``Moment``: the time, whether the run still runs, whether the plan awaits approval, and a
fresh nonce); the gate answers with the attempt it recorded.

An approval counts only when it carries a signature by this run's approver key over this
experiment, workflow id and first run, the current plan fingerprint, the current nonce and
the approver's name, while the plan awaits approval and before expiry, once. The workflow
keeps only the public key, so nothing in history lets a reader approve; a valid signature,
once seen, uses up its nonce. Every other attempt is recorded with its reason and changes
nothing. The log keeps the latest ``MAX_ATTEMPTS`` attempts, names and reasons truncated,
and counts them all.

A worker's policy may name who approves (``ApproverPolicy``): then only a signature by a
registered approver's own key counts, under that approver's registered name, and the
run's key approves nothing. When the policy also keeps the requester from approving their
own plan, the start must carry the requester's signature (``SignedRequest``) by a
registered key, made at most ``REQUEST_WINDOW`` before the run started (so an old signed
start cannot be replayed under someone else's name much later); that key may then not
approve this run.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from forklab.contracts.approval import approval_payload, request_payload, verify
from forklab.contracts.experiment import ApproverPolicy
from forklab.workflows.experiment.messages import (
    MAX_ATTEMPTS,
    MAX_NAME,
    MAX_REASON,
    ApprovalAttempt,
    ApprovalState,
    ApprovalStatus,
    ApproveRequest,
    RejectRequest,
    SignedRequest,
    Stage,
    Status,
)

#: How long before its run started a signed start may have been signed (and how far
#: after, for clocks that disagree a little).
REQUEST_WINDOW = timedelta(minutes=15)
CLOCK_SKEW = timedelta(minutes=2)


@dataclass(frozen=True)
class Moment:
    """What the gate needs to know about the run when an attempt arrives."""

    now: datetime
    status: Status
    stage: Stage
    #: The fingerprint of the plan under review (None before the plan exists).
    fingerprint: str | None
    experiment_id: str
    #: A nonce the gate moves to when the current one has been used.
    fresh_nonce: str


def clip(text: str, limit: int) -> str:
    """``text`` on one line, at most ``limit`` characters (an ellipsis marks the cut)."""
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


class ApprovalGate:
    """The approval rules and attempt log over one ``ApprovalState``."""

    def __init__(self, state: ApprovalState) -> None:
        self.state = state

    @classmethod
    def opening(
        cls, *, workflow_id: str, run_id: str, public_key: str, key_location: str, nonce: str
    ) -> ApprovalGate:
        return cls(
            ApprovalState(
                status=ApprovalStatus.pending,
                policy="required",
                workflow_id=workflow_id,
                run_id=run_id,
                public_key=public_key,
                key_location=key_location,
                nonce=nonce,
            )
        )

    @property
    def pending(self) -> bool:
        return self.state.status is ApprovalStatus.pending

    def skip(self, policy: str) -> None:
        """The worker's policy lets this run start without approval; ``policy`` says why."""
        self.state.status = ApprovalStatus.not_required
        self.state.policy = policy

    def adopt(
        self,
        policy: ApproverPolicy,
        request: SignedRequest | None,
        *,
        experiment_id: str,
        requested_by: str,
        started_at: datetime,
    ) -> str | None:
        """Take the worker's approver policy; why the run cannot be approved under it
        (None: it can)."""
        state = self.state
        state.approvers = list(policy.approvers)
        state.requester_may_approve = policy.requester_may_approve
        if not state.approvers:
            return None
        registered = {a.public_key: a.name for a in state.approvers}
        if request is not None:
            payload = request_payload(
                workflow_id=state.workflow_id,
                experiment_id=experiment_id,
                requested_by=requested_by,
                requested_at=request.requested_at.isoformat(),
            )
            age = started_at - request.requested_at
            if (
                verify(request.public_key, payload, request.signature)
                and request.public_key in registered
                and -CLOCK_SKEW <= age <= REQUEST_WINDOW
            ):
                state.requester = registered[request.public_key]
                state.requester_key = request.public_key
        if state.requester or state.requester_may_approve:
            return None
        return (
            "this worker's policy keeps requesters from approving their own plans, and the "
            "start carries no valid signature by a registered key made within "
            f"{REQUEST_WINDOW.seconds // 60} minutes of it: start it with forklab start, "
            "holding a key made by forklab keys and registered in FORKLAB_APPROVERS_FILE"
        )

    def expire(self) -> None:
        self.state.status = ApprovalStatus.expired

    def approve(self, req: ApproveRequest, at: Moment) -> ApprovalAttempt:
        refusal = self.refusal(req, at)
        if refusal is None:
            return self._record(at, "approve", req.approver, "accepted", ApprovalStatus.approved)
        return self._record(at, "approve", req.approver, refusal)

    def reject(self, req: RejectRequest, at: Moment) -> ApprovalAttempt:
        if not self.pending or at.status is not Status.running:
            reason = f"reject ignored: approval is already {self.state.status.value}"
            return self._record(at, "reject", req.by, reason)
        # Unsigned (rejecting only stops compute): the sender is recorded by the name given.
        reason = f"rejected{': ' + req.reason if req.reason else ''}"
        return self._record(at, "reject", req.by, reason, ApprovalStatus.rejected)

    def refuse(self, kind: str, who: str, reason: str, at: Moment) -> ApprovalAttempt:
        """Record a message that could not even be read as an approve or reject."""
        return self._record(at, kind, who, reason)

    def refusal(self, req: ApproveRequest, at: Moment) -> str | None:
        """Why ``req`` cannot approve the plan at ``at`` (None: it approves). A request
        whose signature verifies uses up the nonce, accepted or not."""
        state = self.state
        if state.status is ApprovalStatus.approved:
            return "already approved: an approval counts once"
        if state.status is ApprovalStatus.rejected:
            return "the experiment was rejected; start it again under a new spec id"
        if state.status is ApprovalStatus.expired:
            return "the approval window has expired; start it again under a new spec id"
        if state.status is ApprovalStatus.not_required:
            return f"this run needs no approval ({state.policy})"
        if at.status is not Status.running:
            return f"the experiment has already ended ({at.status.value})"
        if at.fingerprint is None or at.stage is not Stage.awaiting_approval or not state.nonce:
            return f"the plan is not ready yet (stage {at.stage.value}); approve once it is"
        if req.fingerprint != at.fingerprint:
            return (
                f"wrong plan fingerprint {clip(req.fingerprint[:16], 16) or '(empty)'}: "
                f"the current plan is {at.fingerprint}; review that plan and approve it"
            )
        if req.nonce != state.nonce:
            return "stale nonce: sign the gate's current nonce (see status; forklab approve does)"
        payload = approval_payload(
            experiment_id=at.experiment_id,
            workflow_id=state.workflow_id,
            run_id=state.run_id,
            fingerprint=at.fingerprint,
            nonce=state.nonce,
            approver=req.approver,
        )
        if state.approvers:
            key = next((a.public_key for a in state.approvers if a.name == req.approver), None)
            if key is None:
                return (
                    f"{clip(req.approver, MAX_NAME)} is not a registered approver: this "
                    "worker's policy names who approves (FORKLAB_APPROVERS_FILE)"
                )
            if not verify(key, payload, req.signature):
                return (
                    "bad signature: it does not verify with the key registered for "
                    f"{clip(req.approver, MAX_NAME)}"
                )
        elif not verify(state.public_key, payload, req.signature):
            return "bad signature: it does not verify with this run's approver key"
        state.nonce = at.fresh_nonce  # this signature is used up, whatever follows
        if state.approvers and not state.requester_may_approve and key == state.requester_key:
            return (
                f"{req.approver} requested this experiment, and this worker's policy says the "
                "requester may not approve their own plan: another registered approver must"
            )
        if state.expires_at is not None and at.now >= state.expires_at:
            return "the approval window has expired; start it again under a new spec id"
        return None

    def _record(
        self,
        at: Moment,
        kind: str,
        who: str,
        reason: str,
        decision: ApprovalStatus | None = None,
    ) -> ApprovalAttempt:
        """Every message is recorded (bounded); only a ``decision`` changes the approval."""
        attempt = ApprovalAttempt(
            at=at.now,
            kind=clip(kind, 40),
            approver=clip(who, MAX_NAME) or "(unnamed)",
            accepted=decision is ApprovalStatus.approved,
            reason=clip(reason, MAX_REASON),
        )
        state = self.state
        state.attempts.append(attempt)
        del state.attempts[:-MAX_ATTEMPTS]
        state.attempts_total += 1
        if decision is not None:
            state.status = decision
            state.decided_by = attempt.approver
            state.decided_at = at.now
        return attempt
