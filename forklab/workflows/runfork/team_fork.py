"""The coordinator of a team fork: one durable workflow per team fork (its id is the team
fork's name), so that the team is forked whole or not at all.

1. It starts every member's fork, held (``team_messages``: a held member runs nothing,
   not even its own handlers), in one activity that a worker's death only retries (the
   forks' ids are deterministic, so a retry finds what the dead attempt started).
2. Once every member's fork exists, it records the final group receipt (written once),
   then releases every member with the ``forklab.team_release`` signal. Signals from a
   workflow are durable: a worker killed while releasing resumes and releases the rest.
3. If a member's fork cannot be made, it terminates every member fork it started (none
   has run anything: they were held) and records the team fork as aborted.

``forklab fork-team`` starts the coordinator and waits for its result; killed before the
start, nothing exists; killed after, the coordinator finishes without it.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, ApplicationError

with workflow.unsafe.imports_passed_through():
    from forklab.contracts.runfork import TEAM_RELEASE_SIGNAL
    from forklab.contracts.team_fork import (
        ABORT_MEMBERS,
        RECORD_TEAM_FORK,
        START_MEMBERS,
        TEAM_FORK_WORKFLOW,
        AbortMembers,
        StartedMembers,
        TeamForkInput,
        TeamForkRecord,
        TeamForkStatus,
    )
    from forklab.experiments.runfork.team_receipt import with_member_receipts

#: Starting the members reads their histories and starts a workflow each.
_START_TIMEOUT = timedelta(minutes=5)
#: A worker that dies while starting the members is noticed this soon.
_HEARTBEAT = timedelta(seconds=5)
_RECORD_TIMEOUT = timedelta(minutes=1)
_RETRY = RetryPolicy(maximum_interval=timedelta(seconds=5))


@workflow.defn(name=TEAM_FORK_WORKFLOW)
class TeamForkWorkflow:
    def __init__(self) -> None:
        self._status: TeamForkStatus | None = None

    @workflow.query
    def status(self) -> str | None:
        """``forked`` once the members are released, ``aborted``; None before."""
        return self._status.value if self._status is not None else None

    @workflow.run
    async def run(self, inp: TeamForkInput) -> TeamForkRecord:
        try:
            started: StartedMembers = await workflow.execute_activity(
                START_MEMBERS,
                inp,
                result_type=StartedMembers,
                start_to_close_timeout=_START_TIMEOUT,
                heartbeat_timeout=_HEARTBEAT,
                retry_policy=_RETRY,
                summary=f"start {len(inp.members)} member forks, held",
            )
        except ActivityError as exc:
            cause = exc.cause
            reason = cause.message if isinstance(cause, ApplicationError) else str(exc)
            aborted: TeamForkRecord = await workflow.execute_activity(
                ABORT_MEMBERS,
                AbortMembers(plan=inp.plan, reason=reason),
                result_type=TeamForkRecord,
                start_to_close_timeout=_START_TIMEOUT,
                heartbeat_timeout=_HEARTBEAT,
                retry_policy=_RETRY,
                summary="abort: terminate the member forks started (they ran nothing)",
            )
            self._status = TeamForkStatus.aborted
            return aborted
        record = TeamForkRecord(
            status=TeamForkStatus.forked,
            receipt=with_member_receipts(inp.plan, started.receipts),
        )
        await workflow.execute_activity(
            RECORD_TEAM_FORK,
            record,
            start_to_close_timeout=_RECORD_TIMEOUT,
            retry_policy=_RETRY,
            summary="record the group receipt",
        )
        await asyncio.gather(
            *(
                workflow.get_external_workflow_handle(fork_id).signal(TEAM_RELEASE_SIGNAL)
                for fork_id in sorted(inp.plan.addresses.values())
            )
        )
        self._status = TeamForkStatus.forked
        return record
