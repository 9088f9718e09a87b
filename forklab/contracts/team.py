"""How a team member's update names its sender, so that the receiver's history says who
sent it and from which step.

A workflow cannot send an update itself: it sends it from an activity
(``team.send_update``). The update id is ``forklab:<activity id>:<run id>:<workflow
id>`` of the sending activity: it is recorded in the receiver's ``UpdateAccepted`` event,
it lets the team reader place the send at the sender's step, and a retried activity sends
the same id again, which the server answers with the first outcome instead of running
the handler twice.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

#: The activity that sends an update to another member of the team.
TEAM_UPDATE_ACTIVITY = "team.send_update"
_PREFIX = "forklab:"


class UpdateSender(BaseModel):
    model_config = ConfigDict(frozen=True)

    workflow_id: str
    run_id: str
    activity_id: str


class TeamUpdateCall(BaseModel):
    """``team.send_update``'s input: run update ``update`` of ``target`` with ``payload``."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    target: str = Field(min_length=1)
    update: str = Field(min_length=1)
    payload: dict[str, object] = Field(default_factory=dict)


def update_id(sender: UpdateSender) -> str:
    return f"{_PREFIX}{sender.activity_id}:{sender.run_id}:{sender.workflow_id}"


def parse_update_id(value: str) -> UpdateSender | None:
    """The sender an update id names; None for an id of another form (an update a client
    or a person sent)."""
    if not value.startswith(_PREFIX):
        return None
    parts = value[len(_PREFIX) :].split(":", 2)
    if len(parts) != 3 or not all(parts):
        return None
    activity_id, run_id, workflow_id = parts
    return UpdateSender(workflow_id=workflow_id, run_id=run_id, activity_id=activity_id)
