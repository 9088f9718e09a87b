"""Workflows that charge a customer other than through a plain activity: through a local
activity, and through a child workflow. Each calls ``prepare`` first (step 1, a fork's
boundary) and reports how the charge went; a charge its fork's policy blocks is
reported as ``blocked``, as the research pipeline does."""

from __future__ import annotations

from datetime import timedelta

from temporalio import activity, workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, ApplicationError, ChildWorkflowError

with workflow.unsafe.imports_passed_through():
    from forklab.agents.tools import ChargeRequest, EffectResult
    from forklab.contracts.errors import ForkErrorType

_RETRY = RetryPolicy(maximum_attempts=3)


@activity.defn(name="prepare")
async def prepare(customer: str) -> str:
    return f"prepared {customer}"


def _blocked(exc: BaseException) -> bool:
    while isinstance(exc, ActivityError | ChildWorkflowError) and exc.cause is not None:
        exc = exc.cause
    return isinstance(exc, ApplicationError) and exc.type == ForkErrorType.tool_blocked


def _request(customer: str) -> ChargeRequest:
    return ChargeRequest(key_name="inv-paths", customer=customer, amount_cents=1200)


@workflow.defn(name="ChargeViaLocal")
class ChargeViaLocalWorkflow:
    @workflow.run
    async def run(self, customer: str) -> dict[str, str]:
        await workflow.execute_activity(
            "prepare", customer, start_to_close_timeout=timedelta(seconds=30)
        )
        try:
            done: EffectResult = await workflow.execute_local_activity(
                "charge_customer",
                _request(customer),
                result_type=EffectResult,
                start_to_close_timeout=timedelta(seconds=30),
                retry_policy=_RETRY,
            )
        except (ActivityError, ApplicationError) as exc:
            if _blocked(exc):
                return {"status": "blocked"}
            raise
        return {"status": "charged", "effect_id": done.effect_id}


@workflow.defn(name="ChargeChild")
class ChargeChildWorkflow:
    @workflow.run
    async def run(self, customer: str) -> dict[str, str]:
        try:
            done: EffectResult = await workflow.execute_activity(
                "charge_customer",
                _request(customer),
                result_type=EffectResult,
                start_to_close_timeout=timedelta(seconds=30),
                retry_policy=_RETRY,
            )
        except (ActivityError, ApplicationError) as exc:
            if _blocked(exc):
                return {"status": "blocked"}
            raise
        return {"status": "charged", "effect_id": done.effect_id}


@workflow.defn(name="ChargeViaChild")
class ChargeViaChildWorkflow:
    @workflow.run
    async def run(self, customer: str) -> dict[str, str]:
        await workflow.execute_activity(
            "prepare", customer, start_to_close_timeout=timedelta(seconds=30)
        )
        try:
            result: dict[str, str] = await workflow.execute_child_workflow(
                ChargeChildWorkflow.run, customer, id=f"{workflow.info().workflow_id}-charge"
            )
        except (ChildWorkflowError, ApplicationError) as exc:
            if _blocked(exc):
                return {"status": "child blocked"}
            raise
        return result
