"""The messages of a team fork's coordinator (``forklab.workflows.runfork.team_fork``):
what it is asked to start, and what it reports.

A team fork is one durable workflow, the coordinator, whose id is the team fork's name.
It starts every member's fork held, and either releases them all (once every one exists
and the group receipt is recorded) or terminates every one it started: a team fork is
never left half started, whoever dies on the way (``forklab fork-team``, a worker)."""

from __future__ import annotations

from enum import StrEnum

from pydantic import BaseModel, ConfigDict, Field

from forklab.contracts.fork_request import ForkOptions, ForkRequest
from forklab.contracts.runfork import TeamPart
from forklab.experiments.runfork.team_receipt import TeamReceipt

#: The coordinator's workflow type and activities (registered by ``ForkLabPlugin``).
TEAM_FORK_WORKFLOW = "forklab.TeamFork"
FORK_MEMBERS = "forklab.team_fork_members"
ABORT_MEMBERS = "forklab.team_abort_members"


class MemberFork(ForkOptions):
    """One member's fork: what ``ForkStarter.fork`` is asked for it (``fork_request``),
    changed as its ``ForkOptions`` say (the overrides only on the requested member's; its
    signals are the operator's and the messages in flight at the cut, in that order). Its
    fields are the coordinator's recorded input, so they stay flat rather than a
    ``ForkRequest`` nested here: a changed shape would not read the recorded ones."""

    workflow_id: str
    fork_workflow_id: str
    #: the member's run the cut was computed on, when it had closed and is its chain's
    #: only run: its fork starts from it without locating the step again (None: located
    #: as a single fork's is)
    run_id: str | None = None
    at_step: int = Field(ge=0)
    team: TeamPart

    def fork_request(self, requested_by: str) -> ForkRequest:
        """The fork of this member, asked for by ``requested_by`` (the team fork's)."""
        return ForkRequest(
            run=self.workflow_id,
            at_step=self.at_step,
            run_id=self.run_id,
            name=self.fork_workflow_id,
            requested_by=requested_by,
            team=self.team,
            **self.options(),
        )


class TeamForkInput(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    #: the group receipt as planned (empty slots)
    plan: TeamReceipt
    members: list[MemberFork]


class TeamForkStatus(StrEnum):
    #: every member's fork exists and was released
    forked = "forked"
    #: a member's fork could not be made: every one started was terminated before it ran
    aborted = "aborted"


class TeamForkRecord(BaseModel):
    """What the registry keeps of a team fork, written once: the final group receipt
    (member receipts in their slots) or, aborted, the plan and why."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    status: TeamForkStatus
    receipt: TeamReceipt
    reason: str | None = None
    #: aborted: the member forks that had started and were terminated (they ran nothing)
    terminated: list[str] = Field(default_factory=list)


class AbortMembers(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    plan: TeamReceipt
    reason: str
