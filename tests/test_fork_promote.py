"""Promote closes in Temporal too (issue 33, point 9): siblings of the promoted fork that
are still running have their cancellation requested (or, by flag, are left running), and
``trail`` says which."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from agent_fixtures import Services, agent_settings
from sample_workflows import AwaitsApprovalWorkflow, Bank, Calls, TransferDetails
from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from forklab.cli.runfork.agent_lab import AgentLab
from forklab.cli.runfork.fork_commands import render_trail
from forklab.contracts.fork_request import ForkRequest
from forklab.experiments.runfork.policy import ToolPolicy
from forklab.experiments.runfork.promotion import SiblingRun
from forklab.temporal import ForkLabPlugin
from forklab.workers.config import Settings
from forklab.workers.runfork.agent_worker import connect_agents

LIVE = {"*": ToolPolicy.live}


@dataclass
class Family:
    lab: AgentLab
    queue: str


@pytest.fixture
async def family(
    temporal_env: WorkflowEnvironment, services: Services, tmp_path: Path
) -> AsyncIterator[Family]:
    agent = agent_settings(services, tmp_path / "home")
    target = temporal_env.client.service_client.config.target_host
    settings = Settings.load({"address": target, "home": tmp_path / "home"}, env={})
    client = await connect_agents(settings, agent)
    bank = Bank(Calls())
    queue = f"promote-{uuid.uuid4().hex[:8]}"
    async with Worker(
        client,
        task_queue=queue,
        workflows=[AwaitsApprovalWorkflow],
        activities=[bank.withdraw, bank.deposit],
        plugins=[ForkLabPlugin(agent.run_log_path)],
    ):
        yield Family(AgentLab(client, agent), queue)


async def _status(client: Client, wid: str) -> WorkflowExecutionStatus | None:
    for _ in range(100):
        status = (await client.get_workflow_handle(wid).describe()).status
        if status is not WorkflowExecutionStatus.RUNNING:
            return status
        await asyncio.sleep(0.1)
    return WorkflowExecutionStatus.RUNNING


async def _family(family: Family, forks: int) -> tuple[str, list[str]]:
    """A parent waiting for approval after its withdrawal, and forks of it at step 1 (each
    waiting too)."""
    lab = family.lab
    wid = f"pending-{uuid.uuid4().hex[:8]}"
    details = TransferDetails(source="a", target="b", amount=5, reference=wid)
    await lab.client.start_workflow(
        AwaitsApprovalWorkflow.run,
        details,
        id=wid,
        task_queue=family.queue,
    )
    for _ in range(200):
        if len(await lab.steps(wid)) == 1 and (await lab.steps(wid))[0].status == "completed":
            break
        await asyncio.sleep(0.1)
    names = []
    for i in range(forks):
        fork = await lab.fork(
            ForkRequest(run=wid, at_step=1, name=f"{wid}/f{i}", tool_policies=LIVE)
        )
        names.append(fork.handle.id)
    return wid, names


async def test_promote_cancels_running_siblings_and_trail_says_so(family: Family) -> None:
    lab = family.lab
    parent, (winner, loser, done) = await _family(family, 3)
    await lab.client.get_workflow_handle(done).signal(AwaitsApprovalWorkflow.approve)
    assert await _status(lab.client, done) is WorkflowExecutionStatus.COMPLETED
    promotion = await lab.promote(winner, by="tester")
    assert promotion.siblings == {
        parent: SiblingRun.cancelled,
        loser: SiblingRun.cancelled,
        done: SiblingRun.already_closed,
    }
    assert await _status(lab.client, parent) is WorkflowExecutionStatus.CANCELED
    assert await _status(lab.client, loser) is WorkflowExecutionStatus.CANCELED
    # the winner keeps running: promotion decides between forks, it does not end the one
    described = await lab.client.get_workflow_handle(winner).describe()
    assert described.status is WorkflowExecutionStatus.RUNNING
    trail = await lab.trail(winner)
    assert trail["closed_siblings"] == {
        parent: "cancelled",
        loser: "cancelled",
        done: "already_closed",
    }
    assert f"closed by this promotion: {loser} (cancelled)" in render_trail(trail)
    assert (await lab.trail(loser))["decisions"][-1]["label"] == "cancelled"
    await lab.client.get_workflow_handle(winner).terminate("test over")


async def test_promote_keep_running_leaves_siblings_running(family: Family) -> None:
    lab = family.lab
    parent, (winner, other) = await _family(family, 2)
    promotion = await lab.promote(winner, keep_running=True)
    assert promotion.siblings == {parent: SiblingRun.left_running, other: SiblingRun.left_running}
    for wid in (parent, other):
        described = await lab.client.get_workflow_handle(wid).describe()
        assert described.status is WorkflowExecutionStatus.RUNNING
    assert (await lab.trail(winner))["closed_siblings"] == {
        parent: "left_running",
        other: "left_running",
    }
    for wid in (parent, other, winner):
        await lab.client.get_workflow_handle(wid).terminate("test over")
