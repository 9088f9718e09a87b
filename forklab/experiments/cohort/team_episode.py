"""A team as one episode of an experiment over a cohort (``cohort.team``): the cut the
approver signs for each fork point the worlds use, and what a scorer is shown of a forked
team.

Pure: the rehearsal reads the team's histories (``forklab.activities.runfork.cohort_teams``)
and computes each consistent cut with the run-fork half's ``consistent_cut``; here a cut
becomes the plan's record of it (every member, its run id, its step, its role, the digest
of the prefix its fork inherits), or the reason it cannot be forked exactly. The fork
activity computes the cut again from the same closed histories and refuses to start a team
whose cut differs from the signed one.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from forklab.experiments.runfork.steps import Step, StepStatus, prefix_sha256
from forklab.experiments.runfork.team_cut import TeamCut
from forklab.experiments.runfork.team_receipt import SlotRole, member_fork_id, slot_role


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class TeamMemberPlan(_Frozen):
    """One member at the cut: where its fork starts (or why it has none)."""

    workflow_id: str
    run_id: str
    workflow_type: str
    #: ``forked`` (continues live from ``at_step``), ``inherited`` (closed, kept whole:
    #: its recorded result stands) or ``absent`` (a child its parent's fork starts)
    role: SlotRole
    at_step: int = Field(ge=0)
    #: digest of the steps a fork of it inherits (as a single fork's receipt); "" when it
    #: has no fork
    prefix_sha256: str = ""


class TeamCutPlan(_Frozen):
    """The consistent cut of the team for the requested member at ``requested_step``."""

    requested_step: int = Field(ge=0)
    members: list[TeamMemberPlan] = Field(min_length=1)

    def forked(self) -> dict[str, int]:
        """Each forked member's step: what the fork activity checks the live cut against."""
        return {m.workflow_id: m.at_step for m in self.members if m.role is SlotRole.forked}


class TeamEpisode(_Frozen):
    """A run's team as the plan holds it: the member whose result is the team's, and the
    cut for every step a world forks the requested member at (the fork point, and the
    decisive step for a world that overrides its result)."""

    result_member: str
    cuts: list[TeamCutPlan] = Field(min_length=1)

    def cut_at(self, step: int) -> TeamCutPlan:
        for cut in self.cuts:
            if cut.requested_step == step:
                return cut
        raise ValueError(f"the plan holds no cut of the team at step {step}")

    def lines(self, requested: str) -> list[str]:
        """The team and its signed cuts, for people (``forklab cohort status``)."""
        out = [f"team of {requested} (result: {self.result_member}):"]
        for cut in self.cuts:
            out.append(f"  cut at {requested} step {cut.requested_step}:")
            for m in cut.members:
                where = f"at step {m.at_step}" if m.role is SlotRole.forked else "no fork"
                prefix = f" prefix {m.prefix_sha256[:12]}" if m.prefix_sha256 else ""
                out.append(
                    f"    {m.workflow_id:<34} {m.role.value:<9} {where} (run {m.run_id[:8]})"
                    f"{prefix}"
                )
        return out


def plan_team_cut(
    cut: TeamCut, steps: Mapping[str, Sequence[Step]], types: Mapping[str, str]
) -> TeamCutPlan | str:
    """The plan's record of ``cut`` (``steps`` and ``types``: each member's recorded
    steps and workflow type), or why a team fork of it would not be exact: a
    member cut between two message events after a step (a fork starts at a step), a
    frozen member (a cohort freezes none), or a step before a member's cut without a
    recorded result."""
    members: list[TeamMemberPlan] = []
    for m in cut.members:
        role = slot_role(m)
        prefix = ""
        if role is SlotRole.frozen:
            return f"member {m.workflow_id} would be frozen; a cohort forks every member"
        if role is SlotRole.forked:
            if m.point.events:
                return (
                    f"the cut places member {m.workflow_id} between two messages after its "
                    f"step {m.point.step}; a member is forked at a step"
                )
            inherited = list(steps.get(m.workflow_id, ()))[: m.at_step]
            if len(inherited) != m.at_step:
                return f"member {m.workflow_id}'s history holds fewer than {m.at_step} steps"
            for step in inherited:
                if step.status not in (StepStatus.completed, StepStatus.failed):
                    return (
                        f"member {m.workflow_id}'s step {step.index} before its cut is "
                        f"{step.status.value}, so its fork has no recorded result to inherit"
                    )
            prefix = prefix_sha256(inherited)
        members.append(
            TeamMemberPlan(
                workflow_id=m.workflow_id,
                run_id=m.run_id,
                workflow_type=types.get(m.workflow_id, ""),
                role=role,
                at_step=m.at_step,
                prefix_sha256=prefix,
            )
        )
    return TeamCutPlan(requested_step=cut.requested_step, members=members)


class TeamMemberView(_Frozen):
    """One member of a forked team, as a scorer sees it."""

    #: the original member's workflow id, and its workflow type
    member: str
    workflow_type: str
    role: SlotRole
    #: the member's fork (None when it has none: its recorded run stands)
    fork_id: str | None
    #: the closed run's status (``completed``, ``failed``, …)
    status: str
    #: its result (None unless it completed), and its final state (the result, or the
    #: details of the failure it ended with)
    result: Any = None
    final_state: Any = None


class TeamView(_Frozen):
    """What an outcome scorer gets as a team's final state (``cohort.team``): the team
    fork, which member's result is the team's, and every member's end. The scorer's
    ``result`` argument is the result member's result; ``steps`` are its steps."""

    #: the team fork's name ("" for the recorded team, which the rehearsal tries the
    #: scorer on)
    team_fork: str
    requested_member: str
    result_member: str
    members: list[TeamMemberView]


def member_forks(team_fork: str, cut: TeamCutPlan) -> dict[str, str]:
    """Original id -> fork id of every forked member of ``cut`` in the team fork."""
    return {
        m.workflow_id: member_fork_id(team_fork, m.workflow_id)
        for m in cut.members
        if m.role is SlotRole.forked
    }
