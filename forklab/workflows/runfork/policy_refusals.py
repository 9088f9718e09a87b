"""A fork's policies on local activities and child workflows: which they refuse, and the
refusal recorded (``forklab.step_decision``) and raised as the call's own failure."""

from __future__ import annotations

from typing import Any

from temporalio import workflow
from temporalio.exceptions import ActivityError, ApplicationError, ChildWorkflowError, RetryState
from temporalio.worker import StartChildWorkflowInput, StartLocalActivityInput

from forklab.contracts.errors import ForkErrorType
from forklab.workflows.runfork.fork_failures import tool_blocked
from forklab.workflows.runfork.fork_state import ForkState
from forklab.workflows.runfork.internal_activities import FORK_ACTIVITY_TIMEOUT, FORK_RETRY

with workflow.unsafe.imports_passed_through():
    from forklab.contracts.runfork import STEP_DECISION, StepDecisionInput
    from forklab.experiments.runfork.blocked import blocked_message
    from forklab.experiments.runfork.policy import ToolPolicy, policy_for
    from forklab.experiments.runfork.steps import StepOrigin


#: A fork's policies refuse local activities and child workflows (recorded with
#: ``forklab.step_decision``); forks recorded before it ran them.
REACH_PATCH = "forklab-policies-reach-local-and-children"


def refused_by_policy(state: ForkState, name: str) -> ToolPolicy | None:
    """The policy (``block`` or ``replay``) that keeps a local activity or child
    workflow ``name`` from running on this fork, or None."""
    marker = state.marker
    if marker is None:
        return None
    policy = policy_for(name, marker.tool_policies)
    if policy not in (ToolPolicy.block, ToolPolicy.replay):
        return None
    return policy if workflow.patched(REACH_PATCH) else None


async def refuse(
    state: ForkState,
    kind: str,
    input: StartLocalActivityInput | StartChildWorkflowInput,
    policy: ToolPolicy,
) -> Any:
    """Records the refusal (history, Web UI, ``forklab steps``) and fails the call as
    a blocked activity fails: the local activity with an ``ActivityError``, the child
    with a ``ChildWorkflowError``, caused by ``fork_tool_blocked`` — what the workflow
    sees when the call itself fails, so its own error handling runs."""
    name = input.activity if isinstance(input, StartLocalActivityInput) else input.workflow
    note = StepDecisionInput(
        index=state.base + state.calls,
        activity_type=name,
        input_sha256="",
        decision=StepOrigin.blocked,
        policy=policy,
        acting=kind,
    )
    try:
        await workflow.execute_activity(
            STEP_DECISION,
            note,
            result_type=StepDecisionInput,
            start_to_close_timeout=FORK_ACTIVITY_TIMEOUT,
            retry_policy=FORK_RETRY,
            summary=f"{kind} {name}: blocked (policy {policy.value})",
        )
    except ActivityError as exc:
        # the decision activity fails with the refusal (on histories recorded before
        # it did, it completed): either way the call fails as below
        cause = exc.cause
        if not (isinstance(cause, ApplicationError) and cause.type == ForkErrorType.tool_blocked):
            raise
    blocked = tool_blocked(blocked_message(note.index, name, policy, kind))
    failure: ActivityError | ChildWorkflowError
    if isinstance(input, StartLocalActivityInput):
        failure = ActivityError(
            "activity error",
            scheduled_event_id=0,
            started_event_id=0,
            identity="forklab",
            activity_type=name,
            activity_id="",
            retry_state=RetryState.NON_RETRYABLE_FAILURE,
        )
    else:
        failure = ChildWorkflowError(
            "child workflow execution error",
            namespace=workflow.info().namespace,
            workflow_id=input.id,
            run_id="",
            workflow_type=name,
            initiated_event_id=0,
            started_event_id=0,
            retry_state=RetryState.NON_RETRYABLE_FAILURE,
        )
    failure.__cause__ = blocked
    raise failure
