"""The activities a fork's workflow runs through the worker interceptor: its inherited
prefix, fetched from the parent's history, and the record of a call its policy decided."""

from __future__ import annotations

from temporalio import activity
from temporalio.client import Client
from temporalio.exceptions import ApplicationError

from forklab.activities.runfork.history_events import ClosedRuns
from forklab.activities.runfork.history_reads import read_run
from forklab.activities.runfork.overrides import override_b64
from forklab.contracts.errors import ForkErrorType
from forklab.contracts.runfork import (
    FETCH_PREFIX,
    STEP_DECISION,
    FetchPrefixInput,
    PrefixPage,
    StepDecisionInput,
)
from forklab.experiments.runfork.blocked import blocked_message
from forklab.experiments.runfork.call_match import in_flight
from forklab.experiments.runfork.overrides import overridden
from forklab.experiments.runfork.steps import Step, StepOrigin, StepStatus


class ForkActivities:
    """Activities a fork's workflow runs through the worker interceptor."""

    def __init__(self, client: Client) -> None:
        self._client = client
        self.runs = ClosedRuns()

    @activity.defn(name=FETCH_PREFIX)
    async def fetch_prefix(self, req: FetchPrefixInput) -> PrefixPage:
        """Steps ``from_step..upto_step`` of the parent's run, with their results, in pages
        of at most ``max_bytes`` (a Temporal payload must stay small)."""
        rec = await read_run(self._client, req.workflow_id, req.run_id, req.base_step, self.runs)
        steps = rec.steps
        if req.result_override is not None:
            steps = overridden(steps, req.result_override, override_b64(req.result_override))
        wanted = [s for s in steps if req.from_step <= s.index <= req.upto_step]
        out: list[Step] = []
        size = 0
        for s in wanted:
            size += len(s.result_b64 or "") + 400
            if out and size > req.max_bytes:
                return PrefixPage(steps=out, next_step=s.index)
            out.append(s)
        after = [
            s
            for s in rec.steps
            if s.index > req.upto_step and s.status is StepStatus.completed and s.result_b64
        ]
        kept: list[Step] = []
        for s in after:
            size += len(s.result_b64 or "") + 400
            if size > req.max_bytes:
                break
            kept.append(s)
        flying = in_flight(rec.steps, req.upto_step)
        return PrefixPage(steps=out, recorded_after=kept, in_flight=flying)

    @activity.defn(name=STEP_DECISION)
    async def step_decision(self, req: StepDecisionInput) -> StepDecisionInput:
        """Records, visibly in history and the Web UI, a live call the fork's policy served
        from the record or blocked; returns the record it was given. A blocked call fails
        here, non-retryable, as ``fork_tool_blocked``: the workflow sees the call fail as
        an ``ActivityError``, so its own error handling (a saga's compensation, a
        fallback) runs on the fork as it would in production."""
        if req.decision is StepOrigin.blocked:
            raise ApplicationError(
                blocked_message(req.index, req.activity_type, req.policy),
                type=ForkErrorType.tool_blocked,
                non_retryable=True,
            )
        return req
