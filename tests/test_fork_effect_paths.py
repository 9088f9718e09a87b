"""Tool policies cover every way a workflow acts (issue 35, point 2): a charge made through
a local activity or a child workflow, on a real dev server with the real effect ledger
and payments service. Before, a fork given `charge_customer=block` charged the customer
again through either (under a lineage root of its own, so the ledger did not meet the
parent's charge), `forklab steps` showed neither, and a misspelt tool name in a policy
was taken silently."""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from agent_fixtures import Services, agent_settings
from effect_paths import (
    ChargeChildWorkflow,
    ChargeViaChildWorkflow,
    ChargeViaLocalWorkflow,
    prepare,
)
from orchestration_lab import forklab
from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from forklab.agents.tools import EffectTools, LedgerMode
from forklab.cli.runfork.agent_lab import AgentLab, ForkError
from forklab.contracts.fork_request import ForkRequest
from forklab.experiments.runfork.policy import ToolPolicy
from forklab.temporal import ForkLabPlugin
from forklab.workers.config import ENV
from forklab.workers.stores import effect_ledger

BLOCK = {"charge_customer": ToolPolicy.block}


@dataclass
class PathsLab:
    lab: AgentLab
    client: Client
    queue: str
    services: Services
    env: dict[str, str]

    async def run(self, workflow: str) -> tuple[str, str, dict[str, Any]]:
        customer = f"c-{uuid.uuid4().hex[:8]}"
        wid = f"{workflow}-{uuid.uuid4().hex[:8]}"
        handle = await self.client.start_workflow(workflow, customer, id=wid, task_queue=self.queue)
        return wid, customer, await handle.result()

    def charges(self, customer: str) -> int:
        return sum(
            1
            for e in self.services.effects_log()
            if e["kind"] == "charge" and e["params"]["customer"] == customer
        )


@pytest.fixture
async def paths_lab(
    temporal_env: WorkflowEnvironment, services: Services, tmp_path: Path
) -> AsyncIterator[PathsLab]:
    address = temporal_env.client.service_client.config.target_host
    client = await Client.connect(address, data_converter=pydantic_data_converter)
    agent = agent_settings(services, tmp_path / "home")
    tools = EffectTools(agent.resolved_effects_url, effect_ledger(agent), LedgerMode.ledger_query)
    env = {
        **os.environ,
        ENV["address"]: address,
        ENV["home"]: str(agent.home),
        "FORKLAB_AGENT_TASK_QUEUE": agent.agent_task_queue,
    }
    async with Worker(
        client,
        task_queue=agent.agent_task_queue,
        workflows=[ChargeViaLocalWorkflow, ChargeViaChildWorkflow, ChargeChildWorkflow],
        activities=[prepare, tools.charge_customer],
        plugins=[ForkLabPlugin(home=agent.home)],
    ):
        yield PathsLab(AgentLab(client, agent), client, agent.agent_task_queue, services, env)


async def test_block_stops_a_charge_made_through_a_local_activity(paths_lab: PathsLab) -> None:
    wid, customer, parent = await paths_lab.run("ChargeViaLocal")
    assert parent["status"] == "charged" and paths_lab.charges(customer) == 1
    fork = await paths_lab.lab.fork(ForkRequest(run=wid, at_step=1, tool_policies=BLOCK))
    assert await fork.handle.result() == {"status": "blocked"}
    assert paths_lab.charges(customer) == 1
    # the refusal is recorded where `forklab steps` reads it
    (refused,) = await paths_lab.lab.acting_calls(fork.handle.id)
    assert (refused.kind, refused.name, refused.after_step, refused.blocked) == (
        "local activity",
        "charge_customer",
        1,
        True,
    )


async def test_a_local_charge_on_a_fork_meets_the_lineages_charge(paths_lab: PathsLab) -> None:
    """`auto`: the local activity runs (it cannot be served: its input is not recorded),
    with the lineage root, so the effect ledger replays the parent's charge."""
    wid, customer, parent = await paths_lab.run("ChargeViaLocal")
    fork = await paths_lab.lab.fork(ForkRequest(run=wid, at_step=1))
    assert await fork.handle.result() == parent
    assert paths_lab.charges(customer) == 1


async def test_block_reaches_the_calls_of_a_child_workflow(paths_lab: PathsLab) -> None:
    wid, customer, parent = await paths_lab.run("ChargeViaChild")
    assert parent["status"] == "charged" and paths_lab.charges(customer) == 1
    fork = await paths_lab.lab.fork(ForkRequest(run=wid, at_step=1, tool_policies=BLOCK))
    assert await fork.handle.result() == {"status": "blocked"}
    assert paths_lab.charges(customer) == 1
    # the child's own history shows the blocked call, and its lineage is the parent's
    child = f"{fork.handle.id}-charge"
    assert [s.origin for s in await paths_lab.lab.steps(child)] == ["blocked"]
    assert await paths_lab.lab.effect_scope(child) == await paths_lab.lab.effect_scope(wid)
    # a policy may name the child workflow itself: it is not started
    fork = await paths_lab.lab.fork(
        ForkRequest(run=wid, at_step=1, tool_policies={"ChargeChild": ToolPolicy.block})
    )
    assert await fork.handle.result() == {"status": "child blocked"}
    assert paths_lab.charges(customer) == 1
    out = forklab(paths_lab.env, "steps", fork.handle.id)
    assert "child     blocked" in out.stdout and "ChargeChild (child workflow)" in out.stdout


async def test_a_childs_charge_on_a_fork_meets_the_lineages_charge(paths_lab: PathsLab) -> None:
    wid, customer, parent = await paths_lab.run("ChargeViaChild")
    fork = await paths_lab.lab.fork(ForkRequest(run=wid, at_step=1))
    assert await fork.handle.result() == parent
    assert paths_lab.charges(customer) == 1


async def test_steps_shows_local_activities_and_children(paths_lab: PathsLab) -> None:
    local, _, _ = await paths_lab.run("ChargeViaLocal")
    child, _, _ = await paths_lab.run("ChargeViaChild")
    out = forklab(paths_lab.env, "steps", local)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert "prepare" in lines[1] and "charge_customer (local activity)" in lines[2], lines
    out = forklab(paths_lab.env, "steps", child)
    assert f"ChargeChild (child workflow {child}-charge)" in out.stdout.splitlines()[2]
    out = forklab(paths_lab.env, "steps", local, "--json")
    listed = json.loads(out.stdout)
    assert [s["activity_type"] for s in listed["steps"]] == ["prepare"]
    assert [(e["kind"], e["name"], e["after_step"]) for e in listed["events"]] == [
        ("local activity", "charge_customer", 1),
    ]


async def test_a_policy_naming_a_tool_the_run_never_called_is_refused(
    paths_lab: PathsLab,
) -> None:
    """Before: `charge_custmer=block` was accepted and the charge ran under `auto`."""
    wid, _, _ = await paths_lab.run("ChargeViaChild")
    with pytest.raises(ForkError) as refused:
        await paths_lab.lab.fork(
            ForkRequest(run=wid, at_step=1, tool_policies={"charge_custmer": ToolPolicy.block})
        )
    assert str(refused.value) == (
        f"--tool-policy names 'charge_custmer', which run {wid!r} never called; its tools: "
        "ChargeChild, charge_customer, prepare"
    )
    assert paths_lab.lab.registry.children(wid) == []
    out = forklab(
        paths_lab.env, "fork", wid, "--at-step", "1", "--tool-policy", "charge_custmer=block"
    )
    assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert "never called; its tools: ChargeChild, charge_customer, prepare" in out.stderr
