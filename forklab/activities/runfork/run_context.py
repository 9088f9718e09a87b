"""What an activity knows about the run that called it, and the run log it writes.

The worker interceptor here reads the fork headers (lineage root, step index) into
context variables for the effect ledger, and publishes each step's start and end to the
run log. The producer is the activity execution and the epoch its attempt, so an attempt
that outlived its successor (a zombie) cannot write after it.
"""

from __future__ import annotations

import asyncio
import contextvars
from typing import Any

from temporalio import activity
from temporalio.converter import default as default_converter
from temporalio.worker import (
    ActivityInboundInterceptor,
    ExecuteActivityInput,
    Interceptor,
)

from forklab.activities.stores.run_log import RunLog
from forklab.contracts.runfork import INTERNAL_PREFIX, LINEAGE_HEADER, STEP_DECISION, STEP_HEADER

_lineage_root: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "forklab_lineage_root", default=None
)
_step: contextvars.ContextVar[int | None] = contextvars.ContextVar("forklab_step", default=None)


def lineage_root() -> str:
    """The lineage root of the calling run (its own workflow id unless it is a fork)."""
    return _lineage_root.get() or activity.info().workflow_id or ""


def holder() -> str:
    info = activity.info()
    return f"{info.workflow_id}/{info.workflow_run_id}/{info.activity_id}"


class RunContextInterceptor(Interceptor):
    def __init__(self, log: RunLog) -> None:
        self._log = log

    def intercept_activity(self, next: ActivityInboundInterceptor) -> ActivityInboundInterceptor:
        return _RunContextInbound(next, self._log)


class _RunContextInbound(ActivityInboundInterceptor):
    def __init__(self, next: ActivityInboundInterceptor, log: RunLog) -> None:
        super().__init__(next)
        self._log = log

    async def _publish(self, seq: int, event: dict[str, Any]) -> None:
        info = activity.info()
        producer = f"{info.workflow_run_id}/{info.activity_id}"
        await asyncio.to_thread(
            self._log.append, info.workflow_id or "", producer, info.attempt, seq, event
        )

    async def execute_activity(self, input: ExecuteActivityInput) -> Any:
        conv = default_converter().payload_converter
        root = input.headers.get(LINEAGE_HEADER)
        step = input.headers.get(STEP_HEADER)
        _lineage_root.set(conv.from_payload(root, str) if root is not None else None)
        _step.set(conv.from_payload(step, int) if step is not None else None)
        info = activity.info()
        name = info.activity_type
        base = {"activity": name, "step": _step.get(), "attempt": info.attempt}
        if name.startswith(INTERNAL_PREFIX) and name != STEP_DECISION:
            return await super().execute_activity(input)
        if name == STEP_DECISION:
            d = input.args[0]
            base.update(
                kind="policy",
                step=d.index,
                tool=d.activity_type,
                decision=d.decision,
                policy=d.policy,
            )
            await self._publish(0, base)
            return await super().execute_activity(input)
        await self._publish(0, {**base, "kind": "step_started"})
        try:
            result = await super().execute_activity(input)
        except BaseException as exc:
            await self._publish(1, {**base, "kind": "step_failed", "error": str(exc)[:300]})
            raise
        await self._publish(1, {**base, "kind": "step_completed"})
        return result
