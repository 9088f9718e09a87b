"""The example team on a real dev server (model calls over HTTP to the local stand-in),
and the team read back from its recorded histories.

- the researcher's conclusion (its step 3) decides the outcome: with the same writer and
  reviewer, a ``fast`` researcher's thin conclusion is rejected, a ``slow`` one's approved;
- the team reader finds all three members from the researcher alone, with the findings
  signal and the review update (request and answer) placed in both histories, and the
  consistent cut at the researcher's conclusion moves the writer and the reviewer back;
- a parent with a child (and a signal from outside) reads as a team with a child start,
  a child result and an outside message.
"""

from __future__ import annotations

import asyncio
import json
import os
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from agent_fixtures import Services, agent_settings
from helpers import forklab_in_process as forklab
from team_workflows import GreetingChild, GreetingParent, ParallelListener, compose_greeting, pause
from temporalio.client import Client, WorkflowHandle, WorkflowUpdateFailedError
from temporalio.service import RPCError
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from forklab.activities.runfork.history_reads import read_chain
from forklab.activities.runfork.team_history import TeamReadError, read_member, read_team
from forklab.agents.team import (
    CONCLUSION_STEP,
    Review,
    ReviewerInput,
    ReviewerWorkflow,
    ReviewRequest,
)
from forklab.agents.team_start import TeamHandles, start_team
from forklab.experiments.runfork.team_cut import (
    EdgeStatus,
    MessageKind,
    Point,
    Position,
    consistent_cut,
)
from forklab.temporal import ensure_search_attributes
from forklab.workers.config import Settings
from forklab.workers.runfork.agent_config import AgentSettings
from forklab.workers.runfork.agent_worker import connect_agents
from forklab.workers.runfork.team_worker import build_team_worker, team_task_queue


@dataclass
class TeamLab:
    client: Client
    agent: AgentSettings

    async def run(self, researcher_model: str) -> tuple[TeamHandles, dict[str, Any]]:
        team_id = f"team-{uuid.uuid4().hex[:8]}"
        handles = await start_team(
            self.client,
            team_id,
            "durable execution",
            team_task_queue(self.agent),
            researcher_model=researcher_model,
        )
        return handles, await handles.results()


@pytest.fixture
async def team_lab(
    temporal_env: WorkflowEnvironment, services: Services, tmp_path: Path
) -> AsyncIterator[TeamLab]:
    agent = agent_settings(services, tmp_path / "home")
    target = temporal_env.client.service_client.config.target_host
    settings = Settings.load({"address": target, "home": tmp_path / "home"}, env={})
    client = await connect_agents(settings, agent)
    await ensure_search_attributes(client)
    async with build_team_worker(client, agent):
        yield TeamLab(client=client, agent=agent)


async def test_the_researchers_conclusion_decides_the_teams_outcome(team_lab: TeamLab) -> None:
    _, thin = await team_lab.run("fast")
    _, full = await team_lab.run("slow")
    # the writer and the reviewer are the same agents with the same models
    assert thin["researcher"]["conclusion"].startswith("draft:")
    assert not full["researcher"]["conclusion"].startswith("draft:")
    assert thin["researcher"]["sections"]["research"].replace("[fast]", "") == full["researcher"][
        "sections"
    ]["research"].replace("[slow]", "")
    # the writer wrote from the conclusion it was signalled, the reviewer judged it
    for run in (thin, full):
        assert run["writer"]["conclusion"] == run["researcher"]["conclusion"]
        assert run["writer"]["review"] == run["reviewer"]
    assert thin["reviewer"]["approved"] is False
    assert thin["reviewer"]["reason"] == "the researcher's conclusion is not substantive"
    assert full["reviewer"]["approved"] is True


async def test_a_reviewer_takes_one_review_and_refuses_another(team_lab: TeamLab) -> None:
    """A second writer (a fork's, misaddressed) cannot change a reviewer's verdict."""
    reviewer = await team_lab.client.start_workflow(
        ReviewerWorkflow.run,
        ReviewerInput(topic="durable execution"),
        id=f"reviewer-{uuid.uuid4().hex[:8]}",
        task_queue=team_task_queue(team_lab.agent),
    )
    good = ReviewRequest(conclusion="a full and substantive conclusion " * 3, draft="x " * 20)
    thin = ReviewRequest(conclusion="draft: tbd", draft="x " * 20)
    outcomes = await asyncio.gather(
        reviewer.execute_update(ReviewerWorkflow.review, good),
        reviewer.execute_update(ReviewerWorkflow.review, thin),
        return_exceptions=True,
    )
    refused = [o for o in outcomes if isinstance(o, WorkflowUpdateFailedError)]
    assert len(refused) == 1
    assert "already taken a review" in str(refused[0].cause)
    taken = next(o for o in outcomes if isinstance(o, Review))
    assert (await reviewer.result())["approved"] is taken.approved


async def test_the_team_is_read_from_its_histories_and_cut_at_the_conclusion(
    team_lab: TeamLab,
) -> None:
    handles, _ = await team_lab.run("fast")
    ids = handles.ids
    team = await read_team(team_lab.client, ids.researcher)
    assert {m.workflow_id: m.steps for m in team.members} == {
        ids.researcher: 3,
        ids.writer: 2,
        ids.reviewer: 1,
    }
    assert all(m.closed for m in team.members)
    by_kind = {(m.kind, m.sender, m.receiver): m for m in team.messages}
    findings = by_kind[(MessageKind.signal, ids.researcher, ids.writer)]
    assert findings.name == "findings"
    # sent after the conclusion (step 3); the writer got it before its first step
    assert findings.sent_at == Position(after_step=3)
    assert findings.received_at == Position(after_step=0)
    review = by_kind[(MessageKind.update, ids.writer, ids.reviewer)]
    answer = by_kind[(MessageKind.update_result, ids.reviewer, ids.writer)]
    # the writer's step 2 carried the update and its answer
    assert review.sent_at == answer.received_at == Position(after_step=1)
    assert review.received_at == Position(after_step=0)
    assert answer.sent_at == Position(after_step=1)
    assert len(team.messages) == 3

    cut = consistent_cut(team, ids.researcher, CONCLUSION_STEP)
    assert cut.points() == {
        ids.researcher: Point(step=3),
        ids.writer: Point(step=0),
        ids.reviewer: Point(step=0),
    }
    assert {e.status for e in cut.edges} == {EdgeStatus.after_cut}
    # from the reviewer, following the edges back, the same team is found
    again = await read_team(team_lab.client, ids.reviewer)
    assert {m.workflow_id for m in again.members} == {m.workflow_id for m in team.members}


async def test_forklab_team_prints_members_messages_and_the_cut(team_lab: TeamLab) -> None:
    handles, _ = await team_lab.run("fast")
    ids = handles.ids
    env = {
        **os.environ,
        "FORKLAB_ADDRESS": team_lab.client.service_client.config.target_host,
        "FORKLAB_HOME": str(team_lab.agent.home),
    }
    done = forklab(env, "team", ids.writer, "--at-step", "3", "--member", ids.researcher)
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "members (3):" in out and "messages (3):" in out
    assert f"signal        'findings'   {ids.researcher} (after step 3) -> {ids.writer}" in out
    assert f"cut for {ids.researcher} at step 3:" in out
    assert f"{ids.writer:<32} at step 0 of 2   moved back by signal:findings:" in out
    as_json = forklab(env, "team", ids.researcher, "--json")
    assert len(json.loads(as_json.stdout)["team"]["members"]) == 3
    bad = forklab(env, "team", ids.researcher, "--at-step", "9")
    assert bad.returncode == 2
    assert bad.stderr.strip().endswith("the step to cut it at must be 0..3")
    missing = forklab(env, "team", "no-such-team-member")
    assert missing.returncode == 2 and "no workflow 'no-such-team-member'" in missing.stderr


async def test_named_members_bound_the_team_and_the_rest_is_outside(team_lab: TeamLab) -> None:
    handles, _ = await team_lab.run("slow")
    ids = handles.ids
    team = await read_team(team_lab.client, ids.researcher, members=[ids.writer])
    assert {m.workflow_id for m in team.members} == {ids.researcher, ids.writer}
    outside = [m for m in team.messages if m.receiver is None]
    assert [(m.kind, m.sender, m.name) for m in outside] == [
        (MessageKind.update, ids.writer, "review")
    ]
    with pytest.raises(TeamReadError, match="no workflow 'nobody-here' in this namespace"):
        await read_team(team_lab.client, "nobody-here")


async def test_a_parent_and_its_child_read_as_a_team(temporal_env: WorkflowEnvironment) -> None:
    client = temporal_env.client
    queue = f"team-child-{uuid.uuid4().hex[:8]}"
    parent_id = f"parent-{uuid.uuid4().hex[:8]}"
    async with Worker(
        client,
        task_queue=queue,
        workflows=[GreetingParent, GreetingChild],
        activities=[compose_greeting],
    ):
        handle = await client.start_workflow(
            GreetingParent.run, "team", id=parent_id, task_queue=queue
        )
        child = client.get_workflow_handle(f"{parent_id}-child")
        # the child waits, after its first step, for a signal from outside the team
        await _first_step_done(child)
        await child.signal(GreetingChild.go)
        assert await handle.result() == "Hello, Hello, Hello, Hello, team!!!!"
    team = await read_team(client, parent_id)
    assert {m.workflow_id: m.steps for m in team.members} == {
        parent_id: 2,
        f"{parent_id}-child": 2,
    }
    kinds = {m.kind: m for m in team.messages}
    start, result, go = (
        kinds[MessageKind.child_start],
        kinds[MessageKind.child_result],
        kinds[MessageKind.signal],
    )
    assert start.sent_at == Position(after_step=1) and start.received_at == Position(after_step=-1)
    assert result.sent_at == Position(after_step=2)
    assert result.received_at == Position(after_step=1, seq=1)
    assert go.sender is None and go.receiver == f"{parent_id}-child"
    # forking the child at its first step places the parent between its child's start
    # and its result; the outside signal is then not delivered to the child's fork
    cut = consistent_cut(team, f"{parent_id}-child", 1)
    assert cut.of(parent_id).point == Point(step=1, events=1)
    go_edge = next(e for e in cut.edges if e.message.kind is MessageKind.signal)
    assert go_edge.status is EdgeStatus.after_cut


async def test_a_member_s_steps_are_numbered_as_forklab_steps_numbers_them(
    temporal_env: WorkflowEnvironment,
) -> None:
    """Calls in parallel complete in another order than the one they were scheduled in:
    a member's positions count the steps completed before an event, where ``forklab
    steps`` places it, so a cut at step N holds what a fork at step N inherits."""
    client = temporal_env.client
    queue, wid = f"team-par-{uuid.uuid4().hex[:8]}", f"par-{uuid.uuid4().hex[:8]}"
    async with Worker(client, task_queue=queue, workflows=[ParallelListener], activities=[pause]):
        handle = await client.start_workflow(ParallelListener.run, 2.0, id=wid, task_queue=queue)
        await _first_step_done(handle)  # the call scheduled second; the first still runs
        await handle.signal(ParallelListener.hear)
        assert await handle.result() == 1
    member = await read_member(client, wid)
    (run,) = await read_chain(client, wid)
    (signal,) = [e for e in run.others if e.kind == "signal"]
    assert signal.after_step == 1 and [s.call for s in run.steps] == [2, 1]
    assert [r.at for r in member.received] == [Position(after_step=1)]
    assert member.steps == 2


async def _first_step_done(handle: WorkflowHandle[Any, Any]) -> None:
    for _ in range(200):
        try:
            history = await handle.fetch_history()
        except RPCError:
            history = None
        # the step's result handed to the workflow: a workflow task completed after it (a
        # signal arriving sooner joins that task, and the SDK applies it before the result)
        events = list(history.events) if history is not None else []
        done = [
            i
            for i, e in enumerate(events)
            if e.HasField("activity_task_completed_event_attributes")
        ]
        if done and any(
            e.HasField("workflow_task_completed_event_attributes") for e in events[done[0] :]
        ):
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"{handle.id} did not finish its first step")
