"""An experiment world's faults on a fork's live calls: a call that fails with an injected
fault, and a tool's result as the world's faults change it."""

from __future__ import annotations

import base64
import json
from typing import Any

from temporalio import workflow
from temporalio.api.common.v1 import Payload
from temporalio.exceptions import ApplicationError
from temporalio.worker import StartActivityInput

from forklab.contracts.errors import ForkErrorType
from forklab.workflows.runfork.fork_state import ForkState

with workflow.unsafe.imports_passed_through():
    from forklab.contracts.runfork import CohortFork
    from forklab.experiments.cohort.faults import CallSite, apply_faults
    from forklab.experiments.runfork.steps import Step, StepStatus


async def injected(input: StartActivityInput, index: int, why: str) -> Any:
    raise ApplicationError(
        f"step {index} ({input.activity}) failed with {why}",
        type=ForkErrorType.injected_fault,
        non_retryable=True,
    )


async def faulted(
    state: ForkState,
    handle: workflow.ActivityHandle[Any],
    input: StartActivityInput,
    index: int,
    cohort: CohortFork,
) -> Any:
    """The live tool call's result after the world's faults; one the call's result
    type cannot read any more fails the call, as a broken response would."""
    result = await handle
    conv = workflow.payload_converter()
    try:
        value = json.loads(conv.to_payloads([result])[0].data)
    except ValueError:
        return result
    earlier = state.tool_results.setdefault(input.activity, [])
    if not earlier:
        earlier.extend(
            _json_of(s)
            for s in sorted(state.inherited, key=lambda s: s.index)
            if s.activity_type == input.activity and s.status is StepStatus.completed
        )
    site = CallSite(
        seed=cohort.seed, run=cohort.run, fork=cohort.fork, call=index, tool=input.activity
    )
    out = apply_faults(cohort.faults, site, value, list(earlier))
    earlier.append(value)
    if not out.applied:
        return result
    if input.ret_type is None:
        return out.value
    changed = Payload(metadata={"encoding": b"json/plain"}, data=json.dumps(out.value).encode())
    try:
        return conv.from_payload(changed, input.ret_type)
    except Exception:  # whatever the result type's reader raises on a broken response
        kinds = ", ".join(k.value for k in out.applied)
        why = f"an injected {kinds}: its response no longer reads as its result type"
        return await injected(input, index, why)


def _json_of(step: Step) -> Any:
    payload = Payload.FromString(base64.b64decode(step.result_b64 or ""))
    try:
        return json.loads(payload.data)
    except ValueError:
        return None
