"""Blocked looks like failed (issue 33, point 8): a call a fork's policy blocks fails *the
activity* (``fork_tool_blocked``, non-retryable), so the workflow's own ``except
ActivityError`` path runs on the fork as it would in production — here the
money-transfer saga's refund."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from agent_fixtures import Services, agent_settings
from sample_workflows import Bank, Calls, MoneyTransferWorkflow, TransferDetails
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Replayer, Worker

from forklab.cli.runfork.agent_lab import AgentLab
from forklab.contracts.errors import ForkErrorType
from forklab.contracts.fork_request import ForkRequest
from forklab.experiments.runfork.policy import ToolPolicy
from forklab.experiments.runfork.steps import StepOrigin, StepStatus
from forklab.temporal import ForkLabPlugin
from forklab.workers.config import Settings
from forklab.workers.runfork.agent_worker import connect_agents


@pytest.fixture
async def lab_and_client(
    temporal_env: WorkflowEnvironment, services: Services, tmp_path: Path
) -> AsyncIterator[tuple[AgentLab, Client, ForkLabPlugin]]:
    agent = agent_settings(services, tmp_path / "home")
    target = temporal_env.client.service_client.config.target_host
    settings = Settings.load({"address": target, "home": tmp_path / "home"}, env={})
    client = await connect_agents(settings, agent)
    yield AgentLab(client, agent), client, ForkLabPlugin(agent.run_log_path)


async def test_a_blocked_deposit_runs_the_saga_s_refund_on_the_fork(
    lab_and_client: tuple[AgentLab, Client, ForkLabPlugin],
) -> None:
    lab, client, plugin = lab_and_client
    calls = Calls()
    bank = Bank(calls)
    activities = [bank.withdraw, bank.deposit, bank.refund]
    queue, wid = f"saga-{uuid.uuid4().hex[:8]}", f"transfer-{uuid.uuid4().hex[:8]}"
    details = TransferDetails(source="acc-a", target="acc-b", amount=250, reference="t1")
    async with Worker(
        client, task_queue=queue, workflows=[MoneyTransferWorkflow], activities=activities
    ):
        parent = await client.execute_workflow(
            MoneyTransferWorkflow.run, details, id=wid, task_queue=queue
        )
    assert parent == "transferred: W-t1 D-t1"
    policies = {"deposit": ToolPolicy.block, "*": ToolPolicy.live}
    async with Worker(
        client,
        task_queue=queue,
        workflows=[MoneyTransferWorkflow],
        activities=activities,
        plugins=[plugin],
    ):
        fork = await lab.fork(
            ForkRequest(run=wid, at_step=1, name=f"{wid}/no-deposit", tool_policies=policies)
        )
        # the workflow's `except ActivityError:` compensation ran: the money went back
        assert await asyncio.wait_for(fork.handle.result(), timeout=60) == "refunded: W-t1 R-t1"
        assert calls.counts[(fork.handle.id, "refund")] == 1
        assert calls.counts[(fork.handle.id, "deposit")] == 0
        steps = await lab.steps(fork.handle.id)
        assert [(s.activity_type, s.origin, s.status) for s in steps] == [
            ("withdraw", StepOrigin.inherited, StepStatus.completed),
            ("deposit", StepOrigin.blocked, StepStatus.blocked),
            ("refund", StepOrigin.own, StepStatus.completed),
        ]
        # in history the call failed as an activity, non-retryable, named by its type
        history = await fork.handle.fetch_history()
        failed = [
            e.activity_task_failed_event_attributes.failure
            for e in history.events
            if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_FAILED
        ]
        assert len(failed) == 1
        info = failed[0].application_failure_info
        assert info.type == ForkErrorType.tool_blocked.value and info.non_retryable
        assert "step 2 (deposit) is blocked on this fork" in failed[0].message
        # a fork of the fork inherits the refusal and takes the same compensation
        again = await lab.fork(
            ForkRequest(run=fork.handle.id, at_step=2, name=f"{wid}/again", tool_policies=policies)
        )
        assert await asyncio.wait_for(again.handle.result(), timeout=60) == "refunded: W-t1 R-t1"
        assert calls.counts[(again.handle.id, "deposit")] == 0
        await Replayer(
            workflows=[MoneyTransferWorkflow],
            plugins=[plugin],
            data_converter=client.data_converter,
        ).replay_workflow(history)
