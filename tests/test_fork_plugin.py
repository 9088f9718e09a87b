"""One plugin line makes a worker fork-capable (issue 33, points 1 and 2).

The workflows are written the way Temporal's samples are (``sample_workflows``). Each
parent is recorded by the workflow's original worker; the forks run on the same worker
with ``plugins=[ForkLabPlugin(...)]`` added, nothing else changed. A fork at step N
inherits steps 1..N (none of them runs again) and runs the rest live."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from agent_fixtures import Services, agent_settings
from sample_tools import Mailer
from sample_workflows import (
    Bank,
    Calls,
    DslActivities,
    DSLWorkflow,
    MoneyTransferWorkflow,
    ToolsAgentWorkflow,
    TransferDetails,
    dsl_sequence,
)
from temporalio.api.enums.v1 import IndexedValueType
from temporalio.api.operatorservice.v1 import (
    ListSearchAttributesRequest,
    RemoveSearchAttributesRequest,
)
from temporalio.client import Client
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Replayer, Worker

from forklab.cli.runfork.agent_lab import AgentLab, ForkError
from forklab.contracts.fork_request import ForkRequest
from forklab.experiments.runfork.policy import ToolPolicy
from forklab.temporal import ForkLabPlugin, ensure_search_attributes, search_attributes_hint
from forklab.workers.config import Settings
from forklab.workers.runfork.agent_config import AgentSettings
from forklab.workers.runfork.agent_worker import connect_agents
from forklab.workflows.runfork.search_attributes import RUN_FORK_KEYS

LIVE = {"*": ToolPolicy.live}


@dataclass
class PluginLab:
    client: Client
    agent: AgentSettings
    lab: AgentLab
    calls: Calls

    def queue(self) -> str:
        return f"samples-{uuid.uuid4().hex[:8]}"

    def plugin(self) -> ForkLabPlugin:
        return ForkLabPlugin(self.agent.run_log_path)


@pytest.fixture
async def plugin_lab(
    temporal_env: WorkflowEnvironment, services: Services, tmp_path: Path
) -> AsyncIterator[PluginLab]:
    agent = agent_settings(services, tmp_path / "home")
    target = temporal_env.client.service_client.config.target_host
    settings = Settings.load({"address": target, "home": tmp_path / "home"}, env={})
    client = await connect_agents(settings, agent)
    yield PluginLab(client, agent, AgentLab(client, agent), Calls())


async def _fork_at_every_step(
    lab: PluginLab,
    parent_id: str,
    expected: Any,
    uncounted: Sequence[str] = (),
    same_result: bool = True,
) -> None:
    """Fork ``parent_id`` at each of its steps with every later call live: steps 1..N are
    inherited and nothing of them runs; the rest run live, each once."""
    total = len(await lab.lab.steps(parent_id))
    assert total >= 2
    for n in range(1, total + 1):
        fork = await lab.lab.fork(
            ForkRequest(run=parent_id, at_step=n, name=f"{parent_id}/at-{n}", tool_policies=LIVE)
        )
        result = await asyncio.wait_for(fork.handle.result(), timeout=60)
        if same_result:
            assert result == expected
        steps = await lab.lab.steps(fork.handle.id)
        assert [s.origin for s in steps] == ["inherited"] * n + ["own"] * (total - n)
        live = [s for s in steps[n:] if s.activity_type not in uncounted]
        assert lab.calls.of(fork.handle.id) == len(live)
        assert fork.receipt.restorable and fork.receipt.resolved_step == n


async def test_a_money_transfer_forks_on_the_plugin_worker(plugin_lab: PluginLab) -> None:
    queue, bank = plugin_lab.queue(), Bank(plugin_lab.calls)
    activities = [bank.withdraw, bank.deposit, bank.refund]
    details = TransferDetails(source="acc-a", target="acc-b", amount=250, reference="t1")
    wid = f"transfer-{uuid.uuid4().hex[:8]}"
    async with Worker(
        plugin_lab.client,
        task_queue=queue,
        workflows=[MoneyTransferWorkflow],
        activities=activities,
    ):
        expected = await plugin_lab.client.execute_workflow(
            MoneyTransferWorkflow.run, details, id=wid, task_queue=queue
        )
    assert expected == "transferred: W-t1 D-t1"
    async with Worker(
        plugin_lab.client,
        task_queue=queue,
        workflows=[MoneyTransferWorkflow],
        activities=activities,
        plugins=[plugin_lab.plugin()],
    ):
        await _fork_at_every_step(plugin_lab, wid, expected)
    assert plugin_lab.calls.of(wid) == 2


async def test_a_dsl_interpreter_forks_at_every_step(plugin_lab: PluginLab) -> None:
    queue, acts = plugin_lab.queue(), DslActivities(plugin_lab.calls)
    wid = f"dsl-{uuid.uuid4().hex[:8]}"
    async with Worker(
        plugin_lab.client, task_queue=queue, workflows=[DSLWorkflow], activities=acts.all()
    ):
        expected = await plugin_lab.client.execute_workflow(
            DSLWorkflow.run, dsl_sequence(8), id=wid, task_queue=queue
        )
    assert expected["r8"].startswith("activity3(activity2(")
    async with Worker(
        plugin_lab.client,
        task_queue=queue,
        workflows=[DSLWorkflow],
        activities=acts.all(),
        plugins=[plugin_lab.plugin()],
    ):
        await _fork_at_every_step(plugin_lab, wid, expected)
    # the fork replays on a Replayer with the same plugin, and not without it
    history = await plugin_lab.client.get_workflow_handle(f"{wid}/at-4").fetch_history()
    converter = plugin_lab.client.data_converter
    await Replayer(
        workflows=[DSLWorkflow], plugins=[plugin_lab.plugin()], data_converter=converter
    ).replay_workflow(history)
    with pytest.raises(Exception, match=r"(?i)nondetermin"):
        await Replayer(workflows=[DSLWorkflow], data_converter=converter).replay_workflow(history)


async def test_an_agents_sdk_tools_agent_forks_at_every_step(plugin_lab: PluginLab) -> None:
    queue, mailer = plugin_lab.queue(), Mailer(plugin_lab.calls)
    wid = f"tools-{uuid.uuid4().hex[:8]}"
    question = "TICKET: my refund has not arrived\nCUSTOMER: ana@example.test"
    async with Worker(
        plugin_lab.client,
        task_queue=queue,
        workflows=[ToolsAgentWorkflow],
        activities=[mailer.email_customer],
    ):
        expected = await plugin_lab.client.execute_workflow(
            ToolsAgentWorkflow.run, question, id=wid, task_queue=queue
        )
    steps = await plugin_lab.lab.steps(wid)
    assert [s.activity_type for s in steps] == [
        "invoke_model_activity",
        "email_customer",
        "invoke_model_activity",
    ]
    async with Worker(
        plugin_lab.client,
        task_queue=queue,
        workflows=[ToolsAgentWorkflow],
        activities=[mailer.email_customer],
        plugins=[plugin_lab.plugin()],
    ):
        await _fork_at_every_step(
            plugin_lab, wid, expected, uncounted=["invoke_model_activity"], same_result=False
        )
    assert plugin_lab.calls.of(wid) == 1


async def test_the_plugin_registers_the_search_attributes_on_first_use(
    temporal_env: WorkflowEnvironment, plugin_lab: PluginLab
) -> None:
    """A fresh namespace without ForkLab's attributes gets them when a plugin worker
    starts; where they are missing, ``forklab fork`` says which and how in one sentence."""
    client = plugin_lab.client
    ops = client.operator_service
    namespace = client.namespace
    names = [k.name for k in RUN_FORK_KEYS]
    known = await ops.list_search_attributes(ListSearchAttributesRequest(namespace=namespace))
    present = [n for n in names if n in known.custom_attributes]
    if present:
        await ops.remove_search_attributes(
            RemoveSearchAttributesRequest(namespace=namespace, search_attributes=present)
        )
    try:
        queue, bank = plugin_lab.queue(), Bank(plugin_lab.calls)
        wid = f"transfer-{uuid.uuid4().hex[:8]}"
        details = TransferDetails(source="a", target="b", amount=1, reference="sa")
        async with Worker(
            client,
            task_queue=queue,
            workflows=[MoneyTransferWorkflow],
            activities=[bank.withdraw, bank.deposit],
        ):
            await client.execute_workflow(
                MoneyTransferWorkflow.run, details, id=wid, task_queue=queue
            )
        with pytest.raises(ForkError) as refused:
            await plugin_lab.lab.fork(ForkRequest(run=wid, at_step=1))
        assert str(refused.value) == search_attributes_hint(namespace)
        assert "temporal operator search-attribute create" in str(refused.value)
        async with Worker(
            client,
            task_queue=queue,
            workflows=[MoneyTransferWorkflow],
            activities=[bank.withdraw, bank.deposit],
            plugins=[plugin_lab.plugin()],
        ):
            for _ in range(50):  # the worker registers them as it starts
                known = await ops.list_search_attributes(
                    ListSearchAttributesRequest(namespace=namespace)
                )
                if all(n in known.custom_attributes for n in names):
                    break
                await asyncio.sleep(0.1)
            assert {known.custom_attributes[n] for n in names} == {
                IndexedValueType.INDEXED_VALUE_TYPE_KEYWORD
            }
            fork = await plugin_lab.lab.fork(
                ForkRequest(run=wid, at_step=1, name=f"{wid}/after", tool_policies=LIVE)
            )
            assert await fork.handle.result() == "transferred: W-sa D-sa"
    finally:  # leave the session's server as the other tests expect it
        await ensure_search_attributes(client)
