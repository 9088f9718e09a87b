"""A plain workflow whose second step fails (the workflow carries on): a parent whose
prefix holds a step no fork can be served."""

from __future__ import annotations

from datetime import timedelta

from temporalio import activity, workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, ApplicationError


@activity.defn(name="note")
async def note(i: int) -> str:
    return f"note {i}"


@activity.defn(name="boom")
async def boom(i: int) -> str:
    raise ApplicationError(f"boom {i}", non_retryable=True)


@workflow.defn(name="FailsInTheMiddle")
class FailsInTheMiddleWorkflow:
    @workflow.run
    async def run(self, steps: int) -> list[str]:
        out: list[str] = []
        for i in range(1, steps + 1):
            try:
                out.append(
                    await workflow.execute_activity(
                        "boom" if i == 2 else "note",
                        i,
                        result_type=str,
                        start_to_close_timeout=timedelta(seconds=30),
                        retry_policy=RetryPolicy(maximum_attempts=1),
                    )
                )
            except ActivityError:
                out.append(f"failed {i}")
        return out
