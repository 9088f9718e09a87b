"""Calls a fork does not run: an inherited call's recorded outcome, handed over in the
parent's completion order, and a call its policies serve from the record or block
(recorded with ``forklab.step_decision``)."""

from __future__ import annotations

import base64
from typing import Any

from temporalio import workflow
from temporalio.api.common.v1 import Payload
from temporalio.exceptions import ActivityError, ApplicationError, RetryState
from temporalio.worker import StartActivityInput

from forklab.contracts.errors import ForkErrorType
from forklab.workflows.runfork.fork_failures import tool_blocked
from forklab.workflows.runfork.fork_state import ForkState, deliver_pending_signals
from forklab.workflows.runfork.internal_activities import FORK_ACTIVITY_TIMEOUT, FORK_RETRY

with workflow.unsafe.imports_passed_through():
    from forklab.contracts.runfork import STEP_DECISION, StepDecisionInput
    from forklab.experiments.runfork.blocked import blocked_message
    from forklab.experiments.runfork.call_match import PrefixMatcher
    from forklab.experiments.runfork.steps import Step, StepStatus, payload_digest


def input_digest(args: Any) -> str:
    payloads = workflow.payload_converter().to_payloads(list(args))
    return payload_digest([(p.metadata.get("encoding", b""), p.data) for p in payloads])


def _decode(step: Step, ret_type: type | None) -> Any:
    """A recorded result as the workflow expects it; one that does not decode fails the
    run (non-retryable) rather than its workflow task, which would be retried for ever."""
    if step.result_b64 is None:
        return None  # an activity that completed without a result payload
    converter = workflow.payload_converter()
    try:
        payload = Payload.FromString(base64.b64decode(step.result_b64))
        return (
            converter.from_payload(payload, ret_type)
            if ret_type
            else converter.from_payload(payload)
        )
    except Exception as exc:
        raise ApplicationError(
            f"step {step.index} ({step.activity_type[:100]}): its recorded result cannot be "
            f"served ({type(exc).__name__})",
            type=ForkErrorType.prefix_unservable,
            non_retryable=True,
        ) from None


def _inherited_block(input: StartActivityInput, step: Step) -> ActivityError:
    """The failure an inherited blocked call raises: an ``ActivityError`` caused by
    ``fork_tool_blocked``, as the parent fork's workflow saw it (no activity runs)."""
    error = ActivityError(
        "activity error",
        scheduled_event_id=0,
        started_event_id=0,
        identity="forklab",
        activity_type=input.activity,
        activity_id="",
        retry_state=RetryState.NON_RETRYABLE_FAILURE,
    )
    cause = tool_blocked(f"step {step.index} ({input.activity}) was blocked on the parent fork")
    error.__cause__ = cause
    return error


async def serve_inherited(
    state: ForkState, input: StartActivityInput, step: Step, matcher: PrefixMatcher
) -> Any:
    """An inherited call's recorded outcome, handed over in the parent's completion
    order: a workflow that waits on calls in parallel sees them finish as the parent
    did, and so takes the same path to the boundary."""
    messages = state.messages

    def turn() -> bool:  # its place among the inherited results and messages
        return matcher.turn_of(step) and messages.clear_before(step.index)

    if not turn():
        await workflow.wait_condition(turn)
    matcher.delivered()
    side = state.side_effects
    if side is not None:
        side.at(step.index)
    if matcher.all_delivered and state.signals:
        await deliver_pending_signals(state)  # the fork point: the last inherited result
    if side is not None and state.at_fork_point():
        side.end()
    if step.status is StepStatus.blocked:
        # the parent fork's workflow saw this call fail: so does this one
        raise _inherited_block(input, step)
    return _decode(step, input.ret_type)


async def decided(input: StartActivityInput, note: StepDecisionInput) -> Any:
    # a blocked call fails this activity (fork_tool_blocked): the workflow sees an
    # ActivityError, as it would if the tool itself had failed
    await workflow.execute_activity(
        STEP_DECISION,
        note,
        result_type=StepDecisionInput,
        start_to_close_timeout=FORK_ACTIVITY_TIMEOUT,
        retry_policy=FORK_RETRY,
        summary=f"step {note.index}: {input.activity} {note.decision} (policy {note.policy})",
    )
    if note.result_b64 is None:
        # a history recorded when the decision activity completed for blocked calls too
        raise tool_blocked(blocked_message(note.index, input.activity, note.policy))
    step = Step(
        index=note.index,
        activity_type=note.activity_type,
        input_sha256=note.input_sha256,
        status=StepStatus.completed,
        run_id="",
        result_b64=note.result_b64,
    )
    return _decode(step, input.ret_type)
