"""Checking an experiment's start input and opening its approval gate before anything is
planned: the worker's policy on specs that ask to skip approval, who may approve, the
expiry, and the run's own key pair when the worker registers no approvers. Workload and
cohort experiments start and open their gates alike, with the same activities in the same
order, so one rule (and one reading of their histories) serves both."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from temporalio import workflow
from temporalio.exceptions import ApplicationError

with workflow.unsafe.imports_passed_through():
    from pydantic import ValidationError

    from forklab.contracts import experiment_activities as acts
    from forklab.contracts.errors import ExperimentErrorType
    from forklab.contracts.experiment import ApproverPolicy, KeyInput, PolicyInput
    from forklab.experiments.experiment.spec import Approval
    from forklab.workflows.activity_calls import execute
    from forklab.workflows.experiment import timeouts
    from forklab.workflows.experiment.approval_gate import ApprovalGate
    from forklab.workflows.experiment.messages import ApprovalState, SignedRequest

#: the patch that added the approver-policy step (workload experiments started before it
#: replay without it)
APPROVER_POLICY_PATCH = "approver-policy"
#: The workflows' ``failure_exception_types``: a start input the workflow cannot read (wrong
#: schema, a spec out of bounds, binary, two arguments) fails the run at once with the
#: reason, instead of failing its workflow task forever; nothing has been created at that
#: point, so there is nothing to clean up.
BAD_INPUT = [ValidationError, TypeError]


def check_start(inp: Any, expected: type, *, command: str) -> None:
    """Fails the run at once (a non-retryable ``bad_input``) when its input is not an
    ``expected`` (e.g. a binary payload, decoded as bytes), or when a start request
    carries a carry: a carry holds the approval decision, which only the workflow's own
    continue-as-new may hand over. ``command``: how to start it instead."""
    if not isinstance(inp, expected):
        article = "an" if expected.__name__[0] in "AEIOU" else "a"
        raise ApplicationError(
            f"the workflow input is a {type(inp).__name__}, not {article} {expected.__name__} "
            f"(a JSON object with a spec); start it with {command}",
            type=ExperimentErrorType.bad_input,
            non_retryable=True,
        )
    if getattr(inp, "carry", None) is not None and workflow.info().continued_run_id is None:
        raise ApplicationError(
            "the workflow input has a carry, which only the workflow's own "
            f"continue-as-new may set; start it with {command}",
            type=ExperimentErrorType.bad_input,
            non_retryable=True,
        )


def gate_of(
    carried: ApprovalState | None, *, run_id: str, public_key: str, key_location: str
) -> ApprovalGate:
    """The run's approval gate: the one its previous run carried over, else a new one for
    this run (with a fresh nonce)."""
    if carried is not None:
        return ApprovalGate(carried)
    return ApprovalGate.opening(
        workflow_id=workflow.info().workflow_id,
        run_id=run_id,
        public_key=public_key,
        key_location=key_location,
        nonce=workflow.uuid4().hex,
    )


async def open_gate(
    gate: ApprovalGate,
    experiment_id: str,
    approval: Approval,
    request: SignedRequest | None,
    requested_by: str,
    *,
    versioned: bool,
) -> str | None:
    """Open ``gate`` (or skip it, where the worker's policy lets a spec skip approval);
    the reason the start is refused, or None. ``versioned``: ask for the approver policy
    only under ``APPROVER_POLICY_PATCH`` (a workflow that existed before that step)."""
    if not approval.required:
        policy = await execute(
            acts.APPROVAL_POLICY,
            PolicyInput(experiment_id=experiment_id),
            start_to_close_timeout=timeouts.SHORT_TIMEOUT,
            retry_policy=timeouts.TRANSIENT_RETRY,
            summary="the worker's policy on specs that ask to skip approval",
        )
        if policy.skip_allowed:
            gate.skip(policy.reason)
        else:
            gate.state.policy = policy.reason
    if not gate.pending:
        return None
    # runs started before workers had an approver policy recorded no such step; they
    # replay with the policy they ran under (anyone holding the run's key)
    approvers = ApproverPolicy()
    if not versioned or workflow.patched(APPROVER_POLICY_PATCH):
        approvers = await execute(
            acts.APPROVER_POLICY,
            PolicyInput(experiment_id=experiment_id),
            start_to_close_timeout=timeouts.SHORT_TIMEOUT,
            retry_policy=timeouts.TRANSIENT_RETRY,
            summary="who this worker's policy lets approve",
        )
    refusal = gate.adopt(
        approvers,
        request,
        experiment_id=experiment_id,
        requested_by=requested_by,
        started_at=workflow.info().start_time,
    )
    if refusal is not None:
        return refusal
    gate.state.expires_at = workflow.now() + timedelta(minutes=approval.expiry_minutes)
    if not gate.state.public_key and not gate.state.approvers:
        issued = await execute(
            acts.ISSUE_APPROVAL_KEY,
            KeyInput(workflow_id=gate.state.workflow_id, run_id=gate.state.run_id),
            start_to_close_timeout=timeouts.SHORT_TIMEOUT,
            retry_policy=timeouts.TRANSIENT_RETRY,
            summary="make the approver key pair (private key owner-only on the worker)",
        )
        gate.state.public_key = issued.public_key
        gate.state.key_location = issued.location
    return None
