"""A team fork whose start died after some of its members' forks were started: the
coordinator's activity, run again, finds them held and finishes the team (or, when a
member cannot be made, terminates them: nothing of a half team runs), and a release from
anyone else meanwhile leaves them held.

Deterministic where ``test_team_fork_kill.py`` is not: no worker polls while the team fork
is planned; what a dead attempt of ``forklab.team_fork_members`` leaves behind (one
member's fork started held, its receipt recorded, the others not started) is made with
the same starter and arguments that activity uses; then a worker comes.
"""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from agent_fixtures import Services, agent_settings
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowExecutionStatus, WorkflowHandle
from temporalio.testing import WorkflowEnvironment

from forklab.activities.runfork.fork_keys import issuer_key, team_release_token
from forklab.activities.runfork.fork_start import ForkStarter
from forklab.activities.runfork.overrides import make_override
from forklab.activities.runfork.team_fork_start import (
    TeamForkRequest,
    TeamForkStarted,
    TeamForkStarter,
)
from forklab.activities.stores.fork_registry import ForkRegistry
from forklab.activities.stores.team_registry import TeamRegistry
from forklab.agents.team import CONCLUSION_STEP, ReviewerInput, ReviewerWorkflow, TeamIds
from forklab.agents.team_start import start_team
from forklab.contracts.runfork import TEAM_RELEASE_SIGNAL, release_digest
from forklab.contracts.team_fork import MemberFork, TeamForkInput, TeamForkStatus
from forklab.experiments.runfork.receipt import ForkReceipt
from forklab.temporal import ensure_search_attributes
from forklab.workers.config import Settings
from forklab.workers.runfork.agent_config import AgentSettings
from forklab.workers.runfork.agent_worker import connect_agents
from forklab.workers.runfork.team_worker import build_team_worker, team_task_queue

FULL = (
    "adopt durable execution for every agent workflow, because recorded histories make "
    "each run replayable, auditable and cheap to fork"
)


async def _input(client: Client, workflow_id: str) -> TeamForkInput:
    """The coordinator's input, as its start event recorded it."""
    history = await client.get_workflow_handle(workflow_id).fetch_history()
    started = history.events[0].workflow_execution_started_event_attributes
    (inp,) = await client.data_converter.decode(started.input.payloads, [TeamForkInput])
    assert isinstance(inp, TeamForkInput)
    return inp


async def _start_as_a_dead_attempt_did(
    client: Client, agent: AgentSettings, m: MemberFork, requested_by: str, *, token: bool
) -> None:
    """One member's fork, started as ``forklab.team_fork_members`` starts it (held, taking
    a release only with its team fork's token); without ``token``, as it started it before
    releases carried one (taking any release)."""
    digest = release_digest(team_release_token(issuer_key(agent.home), m.team.team_fork_id))
    team = m.team.model_copy(update={"release_sha256": digest if token else None})
    await ForkStarter(client, ForkRegistry(agent.forks_path), agent.home).fork(
        m.fork_request(requested_by).model_copy(update={"team": team})
    )


@dataclass
class HalfStarted:
    client: Client
    agent: AgentSettings
    ids: TeamIds
    started: TeamForkStarted
    inp: TeamForkInput
    #: the writer's fork, as the dead attempt started it (held, receipt kept)
    left: WorkflowHandle[Any, Any]
    left_run: str
    receipt: ForkReceipt


async def _half_started(
    temporal_env: WorkflowEnvironment, services: Services, tmp_path: Path, *, token: bool = True
) -> HalfStarted:
    """A recorded team and a team fork of it whose start died having started only the
    writer's fork (held); no worker polls yet."""
    home = tmp_path / "home"
    agent = agent_settings(services, home)
    target = temporal_env.client.service_client.config.target_host
    client = await connect_agents(Settings.load({"address": target, "home": home}, env={}), agent)
    await ensure_search_attributes(client)
    async with build_team_worker(client, agent):
        team = await start_team(
            client, f"team-{uuid.uuid4().hex[:8]}", "durable execution", team_task_queue(agent)
        )
        await team.results()
    ids = team.ids
    # no worker polls: the coordinator is started and waits
    started = await TeamForkStarter(client, TeamRegistry(agent.forks_path)).start(
        TeamForkRequest(
            member=ids.researcher,
            at_step=CONCLUSION_STEP,
            name=f"tf-{uuid.uuid4().hex[:6]}",
            result_override=make_override(CONCLUSION_STEP, {"content": FULL, "model": "o"}),
        )
    )
    inp = await _input(client, started.handle.id)
    assert len(inp.members) == 3
    # what a dead attempt left: the writer's fork started (held) and its receipt kept,
    # the researcher's and the reviewer's not started
    (writer,) = [m for m in inp.members if m.workflow_id == ids.writer]
    await _start_as_a_dead_attempt_did(client, agent, writer, inp.plan.requested_by, token=token)
    left = client.get_workflow_handle(writer.fork_workflow_id)
    receipt = ForkRegistry(agent.forks_path).receipt(writer.fork_workflow_id)
    assert receipt is not None
    return HalfStarted(
        client, agent, ids, started, inp, left, (await left.describe()).run_id, receipt
    )


@pytest.mark.parametrize("token", [True, False])
async def test_a_team_fork_started_again_after_some_members_finishes_the_team(
    token: bool, temporal_env: WorkflowEnvironment, services: Services, tmp_path: Path
) -> None:
    """Without ``token``, the dead attempt was a worker from before releases carried one:
    the member it started takes the release of the worker that finishes the team."""
    half = await _half_started(temporal_env, services, tmp_path, token=token)
    client, agent, ids, started = half.client, half.agent, half.ids, half.started
    left, left_run, receipt = half.left, half.left_run, half.receipt
    async with build_team_worker(client, agent):
        record = await asyncio.wait_for(started.result(), timeout=120)
        assert record.status is TeamForkStatus.forked, record.reason
        forks = dict(record.receipt.addresses)
        results = {
            w: await asyncio.wait_for(client.get_workflow_handle(f).result(), timeout=120)
            for w, f in forks.items()
        }
    # the writer's fork is the one the dead attempt started (not a second one), with its
    # receipt, and the team it joined was released whole
    assert (await left.describe()).run_id == left_run
    assert record.receipt.slot(ids.writer).receipt == receipt
    assert sorted(forks) == sorted([ids.researcher, ids.writer, ids.reviewer])
    # the override reached the writer's fork through the researcher's: the verdict flips
    assert results[ids.reviewer]["approved"] is True
    for fork_id in forks.values():
        kinds = [
            e.event_type for e in (await client.get_workflow_handle(fork_id).fetch_history()).events
        ]
        released = kinds.index(EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED)
        assert released < kinds.index(EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED), fork_id


@pytest.mark.parametrize("forged", [False, True])
async def test_a_team_fork_that_cannot_finish_terminates_what_a_dead_attempt_started(
    forged: bool, temporal_env: WorkflowEnvironment, services: Services, tmp_path: Path
) -> None:
    """With ``forged``, the held writer's fork is sent ``forklab.team_release`` by others
    before any worker comes: bare (as the coordinator sent it before releases carried a
    token), with a made-up token, and with the token of another team fork of this home.
    None releases it: taken, its first workflow task would have run its steps before the
    coordinator aborted the team."""
    half = await _half_started(temporal_env, services, tmp_path)
    client, agent, ids, started = half.client, half.agent, half.ids, half.started
    releases = [
        [],
        ["f" * 64],
        [team_release_token(issuer_key(agent.home), f"{started.plan.team_fork_id}-other")],
    ]
    for args in releases if forged else []:
        await half.left.signal(TEAM_RELEASE_SIGNAL, args=args)
    # someone else's workflow holds the reviewer's fork id: the team cannot be finished
    squatter = await client.start_workflow(
        ReviewerWorkflow.run,
        ReviewerInput(topic="squat"),
        id=started.plan.addresses[ids.reviewer],
        task_queue=f"nobody-{uuid.uuid4().hex[:6]}",
    )
    async with build_team_worker(client, agent):
        record = await asyncio.wait_for(started.result(), timeout=120)
    assert record.status is TeamForkStatus.aborted
    # the writer's fork the dead attempt left is terminated with the researcher's, and
    # neither ran anything; the squatter is left alone
    assert half.left.id in record.terminated
    assert sorted(record.terminated) == sorted(
        started.plan.addresses[w] for w in (ids.researcher, ids.writer)
    )
    for fork_id in record.terminated:
        handle = client.get_workflow_handle(fork_id)
        assert (await handle.describe()).status is WorkflowExecutionStatus.TERMINATED
        kinds = [e.event_type for e in (await handle.fetch_history()).events]
        assert EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED not in kinds, fork_id
        signalled = kinds.count(EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED)
        assert signalled == (len(releases) if forged and fork_id == half.left.id else 0)
    assert (await squatter.describe()).status is WorkflowExecutionStatus.RUNNING
    await squatter.terminate("test over")
