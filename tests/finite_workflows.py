"""A workflow that calls the agent worker's ``chat_model`` activity with the temperature
``1e999`` (the only way to hand an activity a payload: a workflow schedules it; sent raw,
as a converter would write ``inf`` as ``null``), for the finite-payload tests. Loaded by
the tests' worker only."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from temporalio import workflow
from temporalio.api.common.v1 import Payload
from temporalio.common import RawValue, RetryPolicy
from temporalio.exceptions import ActivityError, ApplicationError


@workflow.defn(name="ChatWithInfinity")
class ChatWithInfinity:
    @workflow.run
    async def run(self) -> dict[str, Any]:
        text = '{"model": "fast", "messages": [{"role": "user", "content": "hi"}], '
        text += '"temperature": 1e999}'
        call = RawValue(Payload(metadata={"encoding": b"json/plain"}, data=text.encode()))
        try:
            await workflow.execute_activity(
                "chat_model",
                call,
                start_to_close_timeout=timedelta(seconds=20),
                retry_policy=RetryPolicy(maximum_attempts=3, maximum_interval=timedelta(1)),
            )
        except ActivityError as exc:
            cause = exc.cause
            return {
                "retry_state": exc.retry_state.name if exc.retry_state else None,
                "type": cause.type if isinstance(cause, ApplicationError) else None,
                "message": cause.message if isinstance(cause, ApplicationError) else str(cause),
            }
        return {"retry_state": None, "type": None, "message": "the activity ran"}
