"""The LangGraph support agent on ``temporalio-langgraph``, on a real dev server: the
model node over HTTP to the local stand-in, the tools node through the real mail service
and the effect ledger.

- it runs, and ``forklab steps`` lists its nodes as steps;
- it forks exactly at every node boundary: inherited nodes are served from history (no
  model call, no email again), the parent's history stays byte-identical, and a fork of
  the tools node under ``block`` does not send;
- without :class:`LangGraphInputs` the same fork is refused at the first node: the
  integration puts wall-clock checkpoint ids in every node's input.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from agent_fixtures import Services, agent_settings
from fork_failures import blocked_in
from helpers import forklab_in_process as forklab
from temporalio.client import Client, WorkflowFailureError, WorkflowHandle
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Replayer, Worker

from forklab.agents.support_graph import SupportGraphInput, SupportGraphWorkflow
from forklab.agents.tools import LedgerMode
from forklab.cli.runfork.agent_lab import AgentLab
from forklab.contracts.errors import ForkErrorType
from forklab.contracts.fork_request import ForkRequest
from forklab.experiments.runfork.policy import ToolPolicy
from forklab.experiments.runfork.steps import StepOrigin
from forklab.workers.config import Settings
from forklab.workers.runfork.agent_config import AgentSettings
from forklab.workers.runfork.agent_worker import (
    connect_agents,
    fork_plugin,
)
from forklab.workers.runfork.langgraph_worker import (
    build_langgraph_worker,
    langgraph_plugin,
    langgraph_task_queue,
)
from forklab.workflows.runfork.langgraph_inputs import LangGraphInputs

NODES = ["support-graph.model", "support-graph.tools", "support-graph.model"]


@dataclass
class GraphLab:
    client: Client
    agent: AgentSettings
    settings: Settings
    services: Services
    lab: AgentLab

    async def run(self, queue: str | None = None) -> tuple[WorkflowHandle[Any, Any], str]:
        customer = f"{uuid.uuid4().hex[:8]}@example.test"
        handle = await self.client.start_workflow(
            SupportGraphWorkflow.run,
            SupportGraphInput(ticket="I want a refund for order 7", customer=customer),
            id=f"graph-{uuid.uuid4().hex[:8]}",
            task_queue=queue or langgraph_task_queue(self.agent),
        )
        return handle, customer

    def emails_to(self, customer: str) -> int:
        return sum(
            1
            for e in self.services.effects_log()
            if e["kind"] == "email" and e["params"].get("to") == customer
        )


@pytest.fixture
async def graph_lab(
    temporal_env: WorkflowEnvironment, services: Services, tmp_path: Path
) -> AsyncIterator[GraphLab]:
    agent = agent_settings(services, tmp_path / "home")
    target = temporal_env.client.service_client.config.target_host
    settings = Settings.load({"address": target, "home": tmp_path / "home"}, env={})
    client = await connect_agents(settings, agent)
    async with build_langgraph_worker(client, agent, LedgerMode.ledger_query):
        yield GraphLab(client, agent, settings, services, AgentLab(client, agent))


async def _history_bytes(handle: WorkflowHandle[Any, Any]) -> list[bytes]:
    history = await handle.fetch_history()
    return [e.SerializeToString(deterministic=True) for e in history.events]


async def test_the_graph_runs_and_forklab_steps_lists_its_nodes(graph_lab: GraphLab) -> None:
    handle, customer = await graph_lab.run()
    result = await handle.result()
    assert result["answer"] == "Replied to the customer by email."
    assert [m["role"] for m in result["messages"]] == [
        "system",
        "user",
        "assistant",
        "tool",
        "assistant",
    ]
    assert graph_lab.emails_to(customer) == 1
    env = {
        **os.environ,
        "FORKLAB_ADDRESS": graph_lab.settings.address,
        "FORKLAB_HOME": str(graph_lab.agent.home),
    }
    done = forklab(env, "steps", handle.id)
    assert done.returncode == 0, done.stderr
    rows = done.stdout.splitlines()[1:]
    assert [row.split()[-1] for row in rows] == NODES
    assert all(" own " in row and " completed " in row for row in rows)


def _mails(messages: list[dict[str, Any]]) -> list[str]:
    return [m["content"] for m in messages if m["role"] == "tool"]


async def test_the_graph_forks_exactly_at_every_node(graph_lab: GraphLab) -> None:
    parent, customer = await graph_lab.run()
    recorded = await parent.result()
    before = await _history_bytes(parent)
    for at in (1, 2, 3):
        fork = await graph_lab.lab.fork(
            ForkRequest(run=parent.id, at_step=at, name=f"{parent.id}/at-{at}")
        )
        assert (fork.receipt.requested_step, fork.receipt.resolved_step) == (at, at)
        result = await fork.handle.result()
        assert result["answer"] == recorded["answer"]
        steps = await graph_lab.lab.steps(fork.handle.id)
        assert [s.activity_type for s in steps] == NODES
        assert [s.origin for s in steps][:at] == [StepOrigin.inherited] * at
        if at == 1:
            # after the boundary, the tools node's call is the parent's, input for
            # input: under ``auto`` it is served the parent's recorded result
            assert steps[1].origin == StepOrigin.replayed
        assert _mails(result["messages"]) == _mails(recorded["messages"])
    assert graph_lab.emails_to(customer) == 1
    assert await _history_bytes(parent) == before
    # a fork's history replays deterministically on a worker set up like this one
    replayer = Replayer(
        workflows=[SupportGraphWorkflow],
        interceptors=[LangGraphInputs()],
        plugins=[
            langgraph_plugin(graph_lab.agent, LedgerMode.ledger_query),
            fork_plugin(graph_lab.agent),
        ],
        data_converter=graph_lab.client.data_converter,
    )
    history = await graph_lab.client.get_workflow_handle(f"{parent.id}/at-2").fetch_history()
    await replayer.replay_workflow(history)
    # and only there: without the steady inputs the served prefix no longer matches
    bare = Replayer(
        workflows=[SupportGraphWorkflow],
        plugins=[
            langgraph_plugin(graph_lab.agent, LedgerMode.ledger_query),
            fork_plugin(graph_lab.agent),
        ],
        data_converter=graph_lab.client.data_converter,
    )
    with pytest.raises(Exception, match=rf"{ForkErrorType.prefix_diverged}|[Nn]ondetermin"):
        await bare.replay_workflow(history)


async def test_a_blocked_tools_node_does_not_send(graph_lab: GraphLab) -> None:
    parent, customer = await graph_lab.run()
    await parent.result()
    fork = await graph_lab.lab.fork(
        ForkRequest(
            run=parent.id,
            at_step=1,
            name=f"{parent.id}/blocked",
            tool_policies={"support-graph.tools": ToolPolicy.block},
        )
    )
    with pytest.raises(WorkflowFailureError) as failure:
        await fork.handle.result()
    assert blocked_in(failure.value.cause)
    assert graph_lab.emails_to(customer) == 1


async def test_without_steady_inputs_the_fork_is_refused_at_the_first_node(
    graph_lab: GraphLab,
) -> None:
    """The defence's own test: the same worker without ``LangGraphInputs``. (A fork at
    step 2 with the defence is ``test_the_graph_forks_exactly_at_every_node``.)"""
    queue = f"{langgraph_task_queue(graph_lab.agent)}-plain"
    plain = Worker(
        graph_lab.client,
        task_queue=queue,
        workflows=[SupportGraphWorkflow],
        plugins=[
            langgraph_plugin(graph_lab.agent, LedgerMode.ledger_query),
            fork_plugin(graph_lab.agent),
        ],
    )
    async with plain:
        parent, _ = await graph_lab.run(queue)
        await parent.result()
        fork = await graph_lab.lab.fork(
            ForkRequest(run=parent.id, at_step=2, name=f"{parent.id}/plain")
        )
        with pytest.raises(WorkflowFailureError) as failure:
            await fork.handle.result()
    cause = repr(failure.value.cause)
    assert ForkErrorType.prefix_diverged.value in cause
    assert "at step 1 (support-graph.model) the fork's input differs" in cause
