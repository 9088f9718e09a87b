"""Starting a team fork (``forklab fork-team``): read the team, compute the consistent
cut, plan the group receipt, and hand every member's fork to one coordinator workflow
(``forklab.workflows.runfork.team_fork``), which starts them all held and releases them
together, or none.

What each member's fork gets: its point in the cut (``at_step``), the team's model, tool
policies and intervention, the overrides when it is the requested member, the signals in
flight at the cut to it (delivered at its start, kept in its receipt's ``signals``), and
its addresses (``TeamPart``): the forks standing for the members it may message.
"""

from __future__ import annotations

import getpass
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from temporalio.client import Client, WorkflowHandle
from temporalio.common import SearchAttributePair, TypedSearchAttributes, WorkflowIDReusePolicy
from temporalio.exceptions import WorkflowAlreadyStartedError

from forklab.activities.runfork.team_history import (
    TeamReadError,
    delivered_at_start,
    link,
    read_histories,
)
from forklab.activities.stores.team_registry import TeamRegistry
from forklab.contracts.fork_request import ForkOptions
from forklab.contracts.runfork import TeamPart, fork_task_queue
from forklab.contracts.search_attributes import EXPERIMENT
from forklab.contracts.team import TEAM_UPDATE_ACTIVITY
from forklab.contracts.team_fork import (
    TEAM_FORK_WORKFLOW,
    MemberFork,
    TeamForkInput,
    TeamForkRecord,
)
from forklab.experiments.runfork.policy import DEFAULT_KEY, ToolPolicy
from forklab.experiments.runfork.team_cut import TeamCut, TeamCutError, consistent_cut
from forklab.experiments.runfork.team_receipt import (
    OverrideKind,
    SlotRole,
    TeamOverride,
    TeamReceipt,
    member_fork_id,
    plan_team_fork,
)


class TeamForkError(ValueError):
    """A team fork that cannot be made as asked; the message says which field and why."""


class TeamForkRequest(ForkOptions):
    """What ``forklab fork-team`` asks: the member and step, the team's bounds, and what
    the forks change (``ForkOptions``, as for a single fork: the model, tool policies,
    intervention, boundary, cohort and experiment tag on every member's fork; the
    overrides and signals on the requested member's). The experiment tag also marks the
    coordinator, so that the experiment run's cleanup finds it too."""

    member: str
    at_step: int
    members: list[str] | None = None
    freeze: tuple[str, ...] = ()
    #: the team fork's name, the coordinator's id (None: ``<member>--team-<8 hex>``); its
    #: members' forks are ``<name>/<member id>``
    name: str | None = None
    #: who asked, for the group receipt (None: the user running this process)
    requested_by: str | None = None
    #: the step of every forked member in the cut an approver signed: a team whose cut,
    #: computed again here, differs is refused
    expected_cut: dict[str, int] | None = None


@dataclass
class TeamForkStarted:
    cut: TeamCut
    plan: TeamReceipt
    handle: WorkflowHandle[Any, Any]

    async def result(self) -> TeamForkRecord:
        """The coordinator's record: forked (every member released) or aborted."""
        record = await self.handle.result()
        return TeamForkRecord.model_validate(record)


def _overrides(req: TeamForkRequest) -> list[TeamOverride]:
    out: list[TeamOverride] = []
    if req.result_override is not None:
        o = req.result_override
        out.append(
            TeamOverride(member=req.member, kind=OverrideKind.result, step=o.step, value=o.value)
        )
    if req.input_override is not None:
        step, value = req.input_override
        out.append(TeamOverride(member=req.member, kind=OverrideKind.input, step=step, value=value))
    out += [
        TeamOverride(
            member=req.member,
            kind=OverrideKind.signal,
            name=s.name,
            value=s.args[0] if s.args else None,
        )
        for s in req.signals
    ]
    return out


def team_part(plan: TeamReceipt, cut: TeamCut) -> TeamPart:
    """The addresses every member fork of ``plan`` carries (each of its members named
    once: ``TeamPart.forked``)."""
    team = plan.team_fork_id
    return TeamPart(
        team_fork_id=team,
        forked=sorted(o for o, f in plan.addresses.items() if f == member_fork_id(team, o)),
        addresses={o: f for o, f in plan.addresses.items() if f != member_fork_id(team, o)},
        without_fork=sorted(
            m.workflow_id for m in cut.members if m.workflow_id not in plan.addresses
        ),
    )


def _steps(cut: dict[str, int]) -> str:
    return ", ".join(f"{w} at {n}" for w, n in sorted(cut.items()))


class TeamForkStarter:
    """Starts team forks for one namespace (``client``); ``teams`` is the registry whose
    records say which names are taken."""

    def __init__(self, client: Client, teams: TeamRegistry) -> None:
        self.client = client
        self.teams = teams

    async def start(self, req: TeamForkRequest) -> TeamForkStarted:
        """Plans the team fork and starts its coordinator (nothing else starts here)."""
        name = req.name or f"{req.member}--team-{uuid.uuid4().hex[:8]}"
        if self.teams.get(name) is not None:
            raise TeamForkError(f"team fork name {name!r} is taken; choose another")
        try:
            histories = await read_histories(self.client, req.member, req.members)
            team = link(histories)
            cut = consistent_cut(team, req.member, req.at_step, frozen=req.freeze)
            inflight = delivered_at_start(histories, cut)
        except (TeamReadError, TeamCutError) as exc:
            raise TeamForkError(str(exc)) from None
        policies = dict(req.tool_policies)
        policies.setdefault(DEFAULT_KEY, ToolPolicy.auto)
        # a member's message to another after the cut is sent again, to the receiver's
        # fork: served from the original's record, it would never reach the fork
        policies.setdefault(TEAM_UPDATE_ACTIVITY, ToolPolicy.live)
        try:
            plan = plan_team_fork(
                cut,
                team_fork_id=name,
                tool_policies=policies,
                requested_by=req.requested_by or getpass.getuser(),
                created_at=datetime.now(UTC),
                overrides=_overrides(req),
                intervention=req.intervention,
                model=req.model,
            )
        except ValueError as exc:
            raise TeamForkError(str(exc)) from None
        forked = {
            s.workflow_id: cut.of(s.workflow_id).at_step
            for s in plan.slots
            if s.role is SlotRole.forked
        }
        if req.expected_cut is not None and forked != req.expected_cut:
            raise TeamForkError(
                f"the team's cut ({_steps(forked)}) differs from the signed plan's "
                f"({_steps(req.expected_cut)}); rehearse and approve it again"
            )
        part = team_part(plan, cut)
        # what every member's fork changes; the overrides and signals asked for are the
        # requested member's alone
        requested = ForkOptions(**req.options(tool_policies=policies))
        others = requested.model_copy(
            update={"result_override": None, "input_override": None, "signals": []}
        )
        members: list[MemberFork] = []
        for slot in plan.slots:
            if slot.role is not SlotRole.forked or slot.fork_workflow_id is None:
                continue
            point = cut.of(slot.workflow_id)
            if point.point.events:
                raise TeamForkError(
                    f"the cut places {slot.workflow_id!r} between two messages after its step "
                    f"{point.point.step} (a parent between its child's start and result); a "
                    "member is forked at a step: cut another member or step"
                )
            own = requested if slot.workflow_id == req.member else others
            read = histories[slot.workflow_id]
            members.append(
                MemberFork(
                    workflow_id=slot.workflow_id,
                    fork_workflow_id=slot.fork_workflow_id,
                    run_id=read.run_id if read.closed and read.runs == 1 else None,
                    at_step=point.at_step,
                    team=part,
                    **own.options(signals=[*own.signals, *inflight.get(slot.workflow_id, [])]),
                )
            )
        queue = fork_task_queue(histories[req.member].task_queue)
        try:
            handle = await self.client.start_workflow(
                TEAM_FORK_WORKFLOW,
                TeamForkInput(plan=plan, members=members),
                id=name,
                task_queue=queue,
                result_type=TeamForkRecord,
                id_reuse_policy=WorkflowIDReusePolicy.REJECT_DUPLICATE,
                search_attributes=TypedSearchAttributes(
                    []
                    if req.experiment_tag is None
                    else [SearchAttributePair(EXPERIMENT, req.experiment_tag)]
                ),
                # a worker of this client on the queue (the API, a test, an experiment's
                # worker) gets the first task with the start's answer: one round trip less
                request_eager_start=True,
                static_summary=(
                    f"team fork of {req.member} at step {req.at_step}: {len(members)} member forks"
                ),
            )
        except WorkflowAlreadyStartedError:
            raise TeamForkError(
                f"team fork name {name!r} is the id of an existing workflow; choose another"
            ) from None
        return TeamForkStarted(cut=cut, plan=plan, handle=handle)
