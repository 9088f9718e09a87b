"""The team's messaging activity: a member sends an update to another member.

The update id names the sending activity (``forklab.contracts.team``), so the receiver's
history says who sent it and from which step, and a retried attempt is answered with the
first outcome rather than running the handler again.
"""

from __future__ import annotations

from typing import Any

from temporalio import activity
from temporalio.client import Client, WorkflowUpdateFailedError
from temporalio.exceptions import ApplicationError
from temporalio.service import RPCError, RPCStatusCode

from forklab.activities.runfork.run_context import team_part
from forklab.contracts.errors import ForkErrorType
from forklab.contracts.team import TEAM_UPDATE_ACTIVITY, TeamUpdateCall, UpdateSender, update_id


def _target(call: TeamUpdateCall) -> str:
    """Where the update goes: on a team fork's member, to the fork standing for the
    target (never the original); with no fork there, nowhere (blocked)."""
    team = team_part()
    if team is None:
        return call.target
    to = team.address(call.target)
    if to is None:
        raise ApplicationError(
            f"update {call.update!r} to {call.target!r} is blocked: it is not a member of "
            f"team fork {team.team_fork_id!r} with a fork (a send there would reach an "
            "original, or a workflow outside the fork world)",
            type=ForkErrorType.team_send_blocked,
            non_retryable=True,
        )
    return to


class TeamMessenger:
    def __init__(self, client: Client) -> None:
        self._client = client

    @activity.defn(name=TEAM_UPDATE_ACTIVITY)
    async def send_update(self, call: TeamUpdateCall) -> dict[str, Any]:
        info = activity.info()
        sender = UpdateSender(
            workflow_id=info.workflow_id or "",
            run_id=info.workflow_run_id or "",
            activity_id=info.activity_id,
        )
        target = _target(call)
        handle = self._client.get_workflow_handle(target)
        try:
            answer: Any = await handle.execute_update(
                call.update, call.payload, id=update_id(sender), result_type=dict
            )
        except WorkflowUpdateFailedError as exc:
            cause = exc.cause or exc
            raise ApplicationError(
                f"{target!r} refused update {call.update!r}: {cause}", non_retryable=True
            ) from None
        except RPCError as exc:
            if exc.status is RPCStatusCode.NOT_FOUND:
                raise ApplicationError(
                    f"no running workflow {target!r} to send update {call.update!r} to",
                    non_retryable=True,
                ) from None
            raise
        if not isinstance(answer, dict):
            raise ApplicationError(
                f"update {call.update!r} of {target!r} answered a "
                f"{type(answer).__name__}, not an object",
                non_retryable=True,
            )
        return answer
