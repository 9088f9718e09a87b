"""Finite payloads for ForkLab's own agent workers: a workflow input, signal, update or
activity input holding ``NaN``, ``Infinity`` (or ``1e999``) or nested deeper than
``strict_json.MAX_DEPTH`` is refused where it arrives.

A worker reads payloads with its client's converter, which a worker plugin cannot
replace; the OpenAI Agents plugin's, pydantic's and Temporal's default take those numbers.
The decoded values are checked here instead, before any handler sees them; each refusal
is a non-retryable ``payload_refused`` error whose message is one sentence naming the
field:

- a workflow input: the workflow fails (an exception from ``execute_workflow`` that
  is an ``ApplicationError`` fails the run; it never fails the task, which would retry
  for ever);
- a signal: the workflow fails the same way (a signal cannot be rejected, and dropping
  it would leave the run waiting for what it was sent);
- an update: rejected by the validator where the update has one, else failed by its
  handler (the run goes on);
- an activity input: the activity fails without a retry.

``ForkLabPlugin(strict_payloads=True)`` adds it; users' own workers get it only by asking.
ForkLab's agent workers have it too, but their converter
(``forklab.workers.runfork.agent_converter``) refuses such a payload first wherever a
workflow reads one, so there it decides only an activity's input.
"""

from __future__ import annotations

from typing import Any, NoReturn

from temporalio.exceptions import ApplicationError
from temporalio.worker import (
    ActivityInboundInterceptor,
    ExecuteActivityInput,
    ExecuteWorkflowInput,
    HandleSignalInput,
    HandleUpdateInput,
    Interceptor,
    WorkflowInboundInterceptor,
    WorkflowInterceptorClassInput,
)

from forklab.contracts.errors import ForkErrorType
from forklab.runtime import strict_json


class FinitePayloads(Interceptor):
    """Add to a worker whose workflows and activities take only finite numbers."""

    def intercept_activity(self, next: ActivityInboundInterceptor) -> ActivityInboundInterceptor:
        return _ActivityInbound(next)

    def workflow_interceptor_class(
        self, input: WorkflowInterceptorClassInput
    ) -> type[WorkflowInboundInterceptor] | None:
        return _WorkflowInbound


def _refuse(what: str, exc: strict_json.StrictJsonError) -> NoReturn:
    raise ApplicationError(
        f"{exc}; refused: {what} takes finite numbers only, nested at most "
        f"{strict_json.MAX_DEPTH} levels",
        type=ForkErrorType.payload_refused,
        non_retryable=True,
    ) from None


def check_args(args: Any, what: str) -> None:
    """A non-retryable ``payload_refused`` error when ``args`` hold a non-finite number or
    nest too deeply."""
    try:
        strict_json.check_finite(list(args), what)
    except strict_json.StrictJsonError as exc:
        _refuse(what, exc)


class _WorkflowInbound(WorkflowInboundInterceptor):
    async def execute_workflow(self, input: ExecuteWorkflowInput) -> Any:
        check_args(input.args, "the workflow's input")
        return await super().execute_workflow(input)

    async def handle_signal(self, input: HandleSignalInput) -> None:
        check_args(input.args, f"signal {input.signal!r}")
        await super().handle_signal(input)

    def handle_update_validator(self, input: HandleUpdateInput) -> None:
        check_args(input.args, f"update {input.update!r}")
        super().handle_update_validator(input)

    async def handle_update_handler(self, input: HandleUpdateInput) -> Any:
        check_args(input.args, f"update {input.update!r}")
        return await super().handle_update_handler(input)


class _ActivityInbound(ActivityInboundInterceptor):
    async def execute_activity(self, input: ExecuteActivityInput) -> Any:
        check_args(input.args, "the activity's input")
        return await super().execute_activity(input)
