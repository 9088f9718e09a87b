"""The coordinator of a team fork: one durable workflow per team fork (its id is the team
fork's name), so that the team is forked whole or not at all.

1. It forks the members in one local activity (``team_forks``): every member's fork
   started held (``team_messages``: a held member runs nothing, not even its own
   handlers), then, once every one exists, the final group receipt recorded (written
   once, with the members' fork receipts), then every member released with the
   ``forklab.team_release`` signal. Local, because an activity's dispatch and the
   workflow task its completion wakes are two round trips through the server, most of
   what a small team fork cost beyond its members' forks. A worker's death only retries
   it: the workflow task it ran in times out, the next worker runs the activity again,
   and since the forks' ids are deterministic it finds what the dead attempt started,
   records the same receipt and releases the members again.
2. If a member's fork cannot be made, the activity fails before recording or releasing
   anything; the coordinator then terminates every member fork it started (none has run
   anything: they were held) and records the team fork as aborted.

``forklab fork-team`` starts the coordinator and waits for its result; killed before the
start, nothing exists; killed after, the coordinator finishes without it.
"""

from __future__ import annotations

from datetime import timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, ApplicationError

with workflow.unsafe.imports_passed_through():
    from forklab.contracts.team_fork import (
        ABORT_MEMBERS,
        FORK_MEMBERS,
        TEAM_FORK_WORKFLOW,
        AbortMembers,
        TeamForkInput,
        TeamForkRecord,
        TeamForkStatus,
    )

#: Forking the members reads their histories and starts a workflow each.
_START_TIMEOUT = timedelta(minutes=5)
#: Team forks begun before the members were forked in a local activity replay with the
#: (remote) activity their histories recorded.
_LOCAL_START_PATCH = "team-fork-local-start"
#: A worker that dies while forking the members is noticed this soon.
_HEARTBEAT = timedelta(seconds=5)
_RETRY = RetryPolicy(maximum_interval=timedelta(seconds=5))


# Outside the sandbox: it is ForkLab's own code, deterministic by construction (no clock,
# randomness or I/O; it only runs activities), and a sandboxed instance's creation — its
# modules imported anew — was a tenth of a small team fork's time on its first workflow task
# and again when the forking activity's result completed the coordinator.
@workflow.defn(name=TEAM_FORK_WORKFLOW, sandboxed=False)
class TeamForkWorkflow:
    def __init__(self) -> None:
        self._status: TeamForkStatus | None = None

    @workflow.query
    def status(self) -> str | None:
        """``forked`` once the members are released, ``aborted``; None before."""
        return self._status.value if self._status is not None else None

    @workflow.run
    async def run(self, inp: TeamForkInput) -> TeamForkRecord:
        summary = f"fork {len(inp.members)} members: start held, record, release"
        try:
            record: TeamForkRecord
            if workflow.patched(_LOCAL_START_PATCH):
                record = await workflow.execute_local_activity(
                    FORK_MEMBERS,
                    inp,
                    result_type=TeamForkRecord,
                    start_to_close_timeout=_START_TIMEOUT,
                    retry_policy=_RETRY,
                    summary=summary,
                )
            else:
                record = await workflow.execute_activity(
                    FORK_MEMBERS,
                    inp,
                    result_type=TeamForkRecord,
                    start_to_close_timeout=_START_TIMEOUT,
                    heartbeat_timeout=_HEARTBEAT,
                    retry_policy=_RETRY,
                    summary=summary,
                )
        except (ActivityError, ApplicationError) as exc:
            # a local activity's failure reaches the workflow as the activity's own error
            cause = exc.cause if isinstance(exc, ActivityError) else exc
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
        self._status = TeamForkStatus.forked
        return record
