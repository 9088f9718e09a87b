"""Teams as the episodes of an experiment over a cohort (``cohort.team``): the rehearsal's
reading of each run's team and its consistent cuts (nothing starts), and one world's fork
of a whole team through the same path as ``forklab fork-team`` (the coordinator
``forklab.TeamFork``: every member started held, released together or none).

A team fork's name is the cohort fork's id (``cohort_fork_id``), so its members are
``<fork id>/<member id>``; the coordinator and every member carry the experiment run's
``ForkLabExperiment`` search attribute, so the cohort's cleanup finds and stops each of
them. An attempt retried after its worker died finds the coordinator the dead attempt
started (by that id) and waits for it instead of starting another.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from temporalio import activity
from temporalio.client import Client, WorkflowHandle
from temporalio.service import RPCError, RPCStatusCode

from forklab.activities.heartbeat import heartbeat_until
from forklab.activities.runfork.closed_fork import closed_chain
from forklab.activities.runfork.cohort_overrides import fork_override
from forklab.activities.runfork.cohort_reads import read_recorded
from forklab.activities.runfork.fork_start import ForkError, final_state
from forklab.activities.runfork.history_events import RunRecord
from forklab.activities.runfork.history_reads import RunNotFound
from forklab.activities.runfork.team_fork_start import (
    TeamForkError,
    TeamForkRequest,
    TeamForkStarter,
)
from forklab.activities.runfork.team_history import TeamReadError, link, read_histories
from forklab.activities.stores.team_registry import TeamRegistry
from forklab.contracts.fork_request import ForkRequest
from forklab.contracts.team_fork import TeamForkRecord, TeamForkStatus
from forklab.experiments.cohort.fork_point import MODEL_ACTIVITY_TYPES
from forklab.experiments.cohort.plan import CLOSED, CohortRun, RecordedRun
from forklab.experiments.cohort.spec import CohortExperimentSpec, ForkWorld
from forklab.experiments.cohort.team_episode import (
    TeamCutPlan,
    TeamEpisode,
    TeamMemberView,
    TeamView,
    member_forks,
    plan_team_cut,
)
from forklab.experiments.runfork.team_cut import TeamCutError, consistent_cut
from forklab.experiments.runfork.team_receipt import SlotRole


@dataclass
class ResolvedTeams:
    """What the rehearsal read of the cohort's teams."""

    #: per requested member: its team, or why it cannot be forked exactly
    episodes: dict[str, TeamEpisode | str] = field(default_factory=dict)
    #: every member's recorded run (for the estimates and the signed tool list)
    recorded: dict[str, RecordedRun] = field(default_factory=dict)

    def member_tools(self) -> set[str]:
        return {
            s.label or s.activity_type
            for rec in self.recorded.values()
            for s in rec.steps
            if s.activity_type not in MODEL_ACTIVITY_TYPES
        }


async def resolve_teams(
    client: Client, spec: CohortExperimentSpec, runs: Sequence[CohortRun]
) -> ResolvedTeams:
    """Each run's team (followed from it by the message edges of the histories) and its
    consistent cut at every step a world forks the run at. A team that cannot be read
    whole, has a member still running, a result member it cannot name, or a cut that is
    not exact is excluded with the reason (never forked alone, or at another step)."""
    assert spec.cohort.team is not None
    out = ResolvedTeams()
    for run in runs:
        activity.heartbeat(run.workflow_id)
        found = await _resolve(client, spec, run, out.recorded)
        out.episodes[run.workflow_id] = found
    return out


async def _resolve(
    client: Client,
    spec: CohortExperimentSpec,
    run: CohortRun,
    recorded: dict[str, RecordedRun],
) -> TeamEpisode | str:
    episodes = spec.cohort.team
    assert episodes is not None
    try:
        histories = await read_histories(client, run.workflow_id, None, episodes.max_members)
        team = link(histories)
    except (TeamReadError, ValueError) as exc:
        return str(exc)
    for wid in sorted(histories):
        if wid not in recorded:
            try:
                recorded[wid] = await read_recorded(client, wid)
            except RunNotFound:
                return f"member {wid} is no longer in the namespace"
        if recorded[wid].status not in CLOSED:
            return f"member {wid} is {recorded[wid].status.value}, not recorded"
    steps = {wid: recorded[wid].steps for wid in histories}
    types = {wid: recorded[wid].workflow_type for wid in histories}
    result_member = run.workflow_id
    if episodes.result_member is not None:
        named = [wid for wid in sorted(histories) if types[wid] == episodes.result_member]
        if len(named) != 1:
            return (
                f"{len(named)} members have the result member's type "
                f"{episodes.result_member!r}; exactly one must"
            )
        result_member = named[0]
    cuts: list[TeamCutPlan] = []
    for step in sorted({fork_override(run, w).at_step for w in spec.worlds}):
        try:
            cut = consistent_cut(team, run.workflow_id, step)
        except TeamCutError as exc:
            return f"at step {step}: {exc}"
        planned = plan_team_cut(cut, steps, types)
        if isinstance(planned, str):
            return f"at step {step}: {planned}"
        role = next(m.role for m in planned.members if m.workflow_id == result_member)
        if role not in (SlotRole.forked, SlotRole.inherited):
            return f"at step {step}: the result member {result_member} is {role.value}"
        cuts.append(planned)
    return TeamEpisode(result_member=result_member, cuts=cuts)


@dataclass
class ForkedTeam:
    """A world's fork of a team, closed: the coordinator's record and every member's
    closed chain (the forked members' forks; the others' recorded runs)."""

    record: TeamForkRecord
    cut: TeamCutPlan
    chains: dict[str, list[RunRecord]]

    def view(self, team_fork: str, requested: str, result_member: str) -> TeamView:
        return team_view(
            team_fork,
            requested,
            result_member,
            self.cut,
            self.chains,
            member_forks(team_fork, self.cut),
        )


def team_view(
    team_fork: str,
    requested: str,
    result_member: str,
    cut: TeamCutPlan,
    chains: Mapping[str, list[RunRecord]],
    forks: Mapping[str, str],
) -> TeamView:
    """What a scorer is shown of a team: every member's end (``chains``: its fork's, or
    its recorded run's), its role and fork id (``forks``)."""
    members = []
    for m in cut.members:
        chain = chains.get(m.workflow_id)
        last = chain[-1] if chain else None
        completed = last is not None and last.status == "completed"
        members.append(
            TeamMemberView(
                member=m.workflow_id,
                workflow_type=m.workflow_type,
                role=m.role,
                fork_id=forks.get(m.workflow_id),
                status=last.status if last is not None else m.role.value,
                result=last.close.get("result") if completed and last else None,
                final_state=final_state(chain) if chain else None,
            )
        )
    return TeamView(
        team_fork=team_fork,
        requested_member=requested,
        result_member=result_member,
        members=members,
    )


class CohortTeamForks:
    """Forks whole teams for an experiment's worlds, with the starter ``forklab
    fork-team`` uses."""

    def __init__(self, client: Client, teams: TeamRegistry) -> None:
        self._client = client
        self._starter = TeamForkStarter(client, teams)

    async def fork(self, run: CohortRun, asked: ForkRequest) -> ForkedTeam:
        """Start the world's team fork (or find the one an earlier attempt started), wait
        for the coordinator and then for every member fork to close, with heartbeats.
        ``asked`` is the world's fork of the run, its requested member: the team fork
        takes its name, step and options. Cancelled, it cancels the coordinator and every
        member fork. A team that cannot be forked (its cut differs from the signed one, a
        member's boundary is refused, the coordinator aborted) is a ``ForkError``: no
        outcome, never a failure."""
        assert run.team is not None and asked.name is not None
        team_fork = asked.name
        cut = run.team.cut_at(asked.at_step)
        forks = member_forks(team_fork, cut)
        try:
            handle = await self._start_or_find(team_fork, asked, cut)
            raw = await heartbeat_until(handle.result(), lambda: team_fork)
            record = TeamForkRecord.model_validate(raw)
            if record.status is not TeamForkStatus.forked:
                raise ForkError(f"team fork {team_fork} aborted: {record.reason}")
            chains = dict(
                zip(
                    forks,
                    await heartbeat_until(
                        asyncio.gather(
                            *(
                                closed_chain(self._client, self._client.get_workflow_handle(f))
                                for f in forks.values()
                            )
                        ),
                        lambda: team_fork,
                    ),
                    strict=True,
                )
            )
        except asyncio.CancelledError:
            await asyncio.shield(self.cancel([team_fork, *forks.values()]))
            raise
        for m in cut.members:
            if m.role is SlotRole.inherited:
                chains[m.workflow_id] = await closed_chain(
                    self._client, self._client.get_workflow_handle(m.workflow_id)
                )
        return ForkedTeam(record=record, cut=cut, chains=chains)

    async def _start_or_find(
        self, team_fork: str, asked: ForkRequest, cut: TeamCutPlan
    ) -> WorkflowHandle[Any, Any]:
        found = self._client.get_workflow_handle(team_fork)
        if await _exists(found):
            return found
        try:
            started = await self._starter.start(
                TeamForkRequest(
                    member=asked.run,
                    at_step=asked.at_step,
                    name=team_fork,
                    requested_by=asked.requested_by,
                    expected_cut=cut.forked(),
                    **asked.options(),
                )
            )
        except TeamForkError as exc:
            if await _exists(found):  # an attempt racing this one started it
                return found
            raise ForkError(str(exc)) from None
        return started.handle

    async def cancel(self, workflow_ids: Sequence[str]) -> None:
        """Cancel the coordinator and the member forks (any may have closed already)."""
        for wid in workflow_ids:
            try:
                await self._client.get_workflow_handle(wid).cancel()
            except RPCError as exc:
                if exc.status not in (RPCStatusCode.NOT_FOUND, RPCStatusCode.FAILED_PRECONDITION):
                    raise


async def _exists(handle: WorkflowHandle[Any, Any]) -> bool:
    try:
        await handle.describe()
    except RPCError as exc:
        if exc.status is RPCStatusCode.NOT_FOUND:
            return False
        raise
    return True


def team_ledger_json(run: CohortRun, world: ForkWorld, team_fork: str) -> dict[str, Any]:
    """What a team fork's ledger row says of its team: the team fork, the requested and
    result members, and each member's fork (or role when it has none)."""
    assert run.team is not None
    cut = run.team.cut_at(fork_override(run, world).at_step)
    forks = member_forks(team_fork, cut)
    return {
        "team_fork": team_fork,
        "requested_member": run.workflow_id,
        "result_member": run.team.result_member,
        "members": {m.workflow_id: forks.get(m.workflow_id, m.role.value) for m in cut.members},
    }


def estimates_of(
    run: CohortRun, recorded: Mapping[str, RecordedRun]
) -> list[tuple[RecordedRun, int]]:
    """Every forked member's recorded run with its step in the run's first cut: what a
    team fork is expected to spend is what they spent after their cuts."""
    assert run.team is not None
    return [
        (recorded[m.workflow_id], m.at_step)
        for m in run.team.cuts[0].members
        if m.role is SlotRole.forked and m.workflow_id in recorded
    ]
