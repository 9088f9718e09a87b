"""kill -9 of the worker running a team fork: the team ends whole, never half.

The example team is recorded, then ``forklab team-worker`` (a separate process) is the
only worker when the team fork starts. It is killed with SIGKILL as soon as it runs the
coordinator's workflow task, the one whose local activity starts the members' forks. Until
a new worker comes, every member fork that exists is held: nothing of it ran. The dead
worker's task times out, the new worker runs the local activity again (the dead attempt's
forks are found, not started twice), then releases the whole team.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path

from agent_fixtures import Services, agent_settings
from temporalio.api.enums.v1 import EventType, PendingWorkflowTaskState
from temporalio.client import Client
from temporalio.service import RPCError
from temporalio.testing import WorkflowEnvironment

from forklab.activities.runfork.team_fork_start import TeamForkRequest, TeamForkStarter
from forklab.activities.stores.team_registry import TeamRegistry
from forklab.agents.team import CONCLUSION_STEP
from forklab.agents.team_start import start_team
from forklab.contracts.team_fork import TeamForkStatus
from forklab.temporal import ensure_search_attributes
from forklab.workers.config import Settings
from forklab.workers.runfork.agent_worker import connect_agents
from forklab.workers.runfork.team_worker import build_team_worker, team_task_queue


async def _exists(client: Client, workflow_id: str) -> bool:
    try:
        await client.get_workflow_handle(workflow_id).describe()
    except RPCError:
        return False
    return True


async def _ran_anything(client: Client, workflow_id: str) -> bool:
    history = await client.get_workflow_handle(workflow_id).fetch_history()
    return any(e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED for e in history.events)


async def test_kill_9_of_the_worker_during_a_team_fork_leaves_no_half_team(
    temporal_env: WorkflowEnvironment, services: Services, tmp_path: Path
) -> None:
    home = tmp_path / "home"
    agent = agent_settings(services, home)
    target = temporal_env.client.service_client.config.target_host
    settings = Settings.load({"address": target, "home": home}, env={})
    client = await connect_agents(settings, agent)
    await ensure_search_attributes(client)
    queue = team_task_queue(agent)
    async with build_team_worker(client, agent):
        team = await start_team(client, f"team-{uuid.uuid4().hex[:8]}", "durable execution", queue)
        await team.results()
    ids = team.ids
    env = {
        **os.environ,
        "FORKLAB_ADDRESS": target,
        "FORKLAB_HOME": str(home),
        "FORKLAB_MODEL_BASE_URL": services.model_url,
        "FORKLAB_EFFECTS_URL": services.effects_url,
        "FORKLAB_AGENT_TASK_QUEUE": agent.agent_task_queue,
    }
    worker = subprocess.Popen(
        [str(Path(sys.executable).parent / "forklab"), "team-worker"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        assert worker.stdout is not None
        assert "team worker" in worker.stdout.readline().decode()
        name = f"tf-{uuid.uuid4().hex[:6]}"
        started = await TeamForkStarter(client, TeamRegistry(agent.forks_path)).start(
            TeamForkRequest(member=ids.researcher, at_step=CONCLUSION_STEP, name=name)
        )
        forks = list(started.plan.addresses.values())
        # kill -9 the only worker as soon as it runs the coordinator's task: the task ends
        # only once its local activity did, so the members are not all released yet
        for _ in range(2000):
            desc = await started.handle.describe()
            task = desc.raw_description.pending_workflow_task
            if task.state == PendingWorkflowTaskState.PENDING_WORKFLOW_TASK_STATE_STARTED:
                break
            await asyncio.sleep(0.005)
        else:
            raise AssertionError("the team worker never took the coordinator's task")
        os.killpg(worker.pid, signal.SIGKILL)
        worker.wait(timeout=30)
    finally:
        if worker.poll() is None:
            os.killpg(worker.pid, signal.SIGKILL)
            worker.wait(timeout=30)
    # no worker: whatever member forks exist are held, none ran anything
    existing = [f for f in forks if await _exists(client, f)]
    for fork_id in existing:
        assert not await _ran_anything(client, fork_id), fork_id
    # a new worker: the start is retried, and the team is forked whole
    async with build_team_worker(client, agent):
        record = await asyncio.wait_for(started.result(), timeout=120)
        assert record.status is TeamForkStatus.forked
        assert sorted(record.receipt.addresses.values()) == sorted(forks)
        results = {
            f: await asyncio.wait_for(client.get_workflow_handle(f).result(), timeout=120)
            for f in forks
        }
    assert results[record.receipt.addresses[ids.reviewer]]["approved"] is False
    events = (await started.handle.fetch_history()).events
    kinds = [e.event_type for e in events]
    # the members were forked in a local activity (its marker, no activity task), in the
    # task after the one the killed worker was running, which timed out
    assert EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED not in kinds, kinds
    forked_in = next(
        i
        for i, e in enumerate(events)
        if e.marker_recorded_event_attributes.marker_name == "core_local_activity"
    )
    assert EventType.EVENT_TYPE_WORKFLOW_TASK_TIMED_OUT in kinds[:forked_in], kinds
    # each member ran only after its release, which came after every member existed
    for fork_id in forks:
        events = (await client.get_workflow_handle(fork_id).fetch_history()).events
        kinds = [e.event_type for e in events]
        released = kinds.index(EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED)
        first_activity = kinds.index(EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED)
        assert released < first_activity
    print(f"killed with {len(existing)} of {len(forks)} member forks started (held)")
