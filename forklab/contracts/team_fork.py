"""The messages of a team fork's coordinator (``forklab.workflows.runfork.team_fork``):
what it is asked to start, and what it reports.

A team fork is one durable workflow, the coordinator, whose id is the team fork's name.
It starts every member's fork held, and either releases them all (once every one exists
and the group receipt is recorded) or terminates every one it started: a team fork is
never left half started, whoever dies on the way (``forklab fork-team``, a worker)."""

from __future__ import annotations

from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from forklab.contracts.fork_request import ForkRequest
from forklab.contracts.runfork import CohortFork, TeamPart
from forklab.experiments.runfork.overrides import ForkSignal, ResultOverride
from forklab.experiments.runfork.policy import ToolPolicy
from forklab.experiments.runfork.receipt import BoundaryMode
from forklab.experiments.runfork.team_receipt import TeamReceipt

#: The coordinator's workflow type and activities (registered by ``ForkLabPlugin``).
TEAM_FORK_WORKFLOW = "forklab.TeamFork"
FORK_MEMBERS = "forklab.team_fork_members"
ABORT_MEMBERS = "forklab.team_abort_members"


class MemberFork(BaseModel):
    """One member's fork: what ``ForkStarter.fork`` is asked for it (``fork_request``).
    Its fields are the coordinator's recorded input, so they stay as they are rather than
    a ``ForkRequest`` nested here: a changed shape would not read the recorded ones."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    workflow_id: str
    fork_workflow_id: str
    #: the member's run the cut was computed on, when it had closed and is its chain's
    #: only run: its fork starts from it without locating the step again (None: located
    #: as a single fork's is)
    run_id: str | None = None
    at_step: int = Field(ge=0)
    boundary: BoundaryMode = BoundaryMode.exact
    model: str | None = None
    tool_policies: dict[str, ToolPolicy] = Field(default_factory=dict)
    intervention: dict[str, Any] | None = None
    result_override: ResultOverride | None = None
    #: (step, JSON): that step runs live with the JSON as its input
    input_override: tuple[int, Any] | None = None
    #: the operator's signals and the messages in flight at the cut, in that order
    signals: list[ForkSignal] = Field(default_factory=list)
    team: TeamPart
    #: the fork of an experiment over a cohort of teams: the world's seeds, prompt patch
    #: and faults (``ForkStarter.fork``'s ``cohort``)
    cohort: CohortFork | None = None
    #: the experiment run whose cleanup finds the fork (its ``ForkLabExperiment``)
    experiment_tag: str | None = None

    def fork_request(self, requested_by: str) -> ForkRequest:
        """The fork of this member, asked for by ``requested_by`` (the team fork's)."""
        return ForkRequest(
            run=self.workflow_id,
            at_step=self.at_step,
            run_id=self.run_id,
            name=self.fork_workflow_id,
            intervention=self.intervention,
            model=self.model,
            tool_policies=self.tool_policies,
            boundary=self.boundary,
            requested_by=requested_by,
            result_override=self.result_override,
            input_override=self.input_override,
            signals=self.signals,
            team=self.team,
            cohort=self.cohort,
            experiment_tag=self.experiment_tag,
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
