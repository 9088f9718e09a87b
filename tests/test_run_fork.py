"""Forking agent runs on a real dev server: the research pipeline through the real
``openai`` client against the local model server, charges through the real service."""

from __future__ import annotations

import pytest
from agent_fixtures import AgentTestLab
from temporalio.client import WorkflowFailureError

from experiments.runfork.policy import ToolPolicy


async def test_fork_at_step_three_with_slow_model_and_blocked_charge(
    agent_lab: AgentTestLab,
) -> None:
    parent = await agent_lab.start_research(model="fast")
    with pytest.raises(WorkflowFailureError):
        await parent.result()
    charges_before = agent_lab.charges()
    before = (await parent.fetch_history()).to_json()
    fork = await agent_lab.lab.fork(
        parent.id,
        at_step=3,
        model="slow",
        tool_policies={"charge_customer": ToolPolicy.block},
    )
    state = await fork.handle.result()
    assert state["status"] == "ok"
    assert state["invoice"]["status"] == "blocked"
    assert agent_lab.charges() == charges_before
    after = (await parent.fetch_history()).to_json()
    assert before == after
    steps = await agent_lab.lab.steps(fork.handle.id)
    assert [s.origin for s in steps[:3]] == ["inherited"] * 3
    print(fork.receipt)
