"""Attacks on agent-run forks, on a real dev server with the real agent worker: a fork
racing its parent for a charge, a fork named after another workflow, and a start whose
memo or input is not what a fork's or an agent's should be (each used to leave the run
open for ever, its workflow task failing and retried)."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path
from typing import Any

import pytest
from agent_fixtures import AgentTestLab, Services, agent_settings
from temporalio.client import Client, WorkflowFailureError, WorkflowHandle
from temporalio.exceptions import ApplicationError
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from forklab.activities.runfork.fork_start import ForkExists, ForkStarter
from forklab.activities.stores.fork_registry import ForkRegistry
from forklab.agents.research import ResearchInput, ResearchPipelineWorkflow
from forklab.agents.tools import EffectTools, LedgerMode, ModelActivities
from forklab.cli.runfork.agent_lab import AgentLab, ForkError
from forklab.contracts.errors import ForkErrorType
from forklab.contracts.fork_request import ForkRequest
from forklab.contracts.runfork import MARKER_MEMO_KEY, RECEIPT_MEMO_KEY
from forklab.workers.config import Settings
from forklab.workers.runfork.agent_worker import (
    connect_agents,
    fork_plugin,
    openai_client,
)
from forklab.workers.stores import effect_ledger


async def _agent_client(temporal_env: WorkflowEnvironment, home: Path, agent: Any) -> Client:
    target = temporal_env.client.service_client.config.target_host
    settings = Settings.load({"address": target, "home": home}, env={})
    client = await connect_agents(settings, agent)
    return client


@pytest.mark.parametrize("mode", [LedgerMode.ledger_query, LedgerMode.ledger])
async def test_a_fork_beside_its_parent_waits_for_the_parents_charge(
    temporal_env: WorkflowEnvironment, services: Services, tmp_path: Path, mode: LedgerMode
) -> None:
    """The parent has sent its charge and not yet recorded it (it hangs 4 s there) when a
    fork of it at step 2 reaches the same charge. The fork used to take the claim over:
    the parent's completion was then refused (the parent failed, ``fenced``) and, without
    the service's status query, the customer was charged twice. Now the fork waits for
    the parent's claim and replays the parent's charge."""
    agent = agent_settings(services, tmp_path / "home")
    client = await _agent_client(temporal_env, tmp_path / "home", agent)
    ledger = effect_ledger(agent)
    hung = tmp_path / "hung"
    tools = EffectTools(
        agent.resolved_effects_url,
        ledger,
        mode,
        crash_point="after_apply",
        crash_flag=hung,
        hang_seconds=4.0,
    )
    models = ModelActivities(openai_client(agent))
    async with Worker(
        client,
        task_queue=agent.agent_task_queue,
        workflows=[ResearchPipelineWorkflow],
        activities=[
            models.chat_model,
            tools.charge_customer,
        ],
        plugins=[fork_plugin(agent)],
    ):
        parent_id = f"parent-{uuid.uuid4().hex[:8]}"
        customer = f"c-{uuid.uuid4().hex[:8]}"
        parent = await client.start_workflow(
            ResearchPipelineWorkflow.run,
            ResearchInput(topic="t", model="slow", customer=customer),
            id=parent_id,
            task_queue=agent.agent_task_queue,
        )
        for _ in range(400):
            if hung.exists():
                break
            await asyncio.sleep(0.05)
        assert hung.exists(), "the parent never reached its charge"
        # the parent's charge is not recorded yet, so `auto` finds nothing to serve
        fork = await AgentLab(client, agent).fork(ForkRequest(run=parent_id, at_step=2))
        fork_state, parent_state = await asyncio.gather(fork.handle.result(), parent.result())
    assert parent_state["invoice"]["status"] == fork_state["invoice"]["status"] == "charged"
    assert fork_state["invoice"]["effect_id"] == parent_state["invoice"]["effect_id"]
    charges = [
        e
        for e in services.effects_log()
        if e["kind"] == "charge" and e["params"]["customer"] == customer
    ]
    assert len(charges) == 1
    events = [
        (e["event"], e["holder"].split("/")[0])
        for e in ledger.events(await AgentLab(client, agent).effect_scope(parent_id))
    ]
    assert events[0] == ("claim:new", parent_id)
    assert ("claim:held", fork.receipt.fork_workflow_id) in events
    assert events[-2:] == [("complete", parent_id), ("claim:replay", fork.receipt.fork_workflow_id)]


async def test_a_fork_cannot_take_an_existing_workflows_id(agent_lab: AgentTestLab) -> None:
    """A fork named after a closed run used to start as that run's next run, so `steps`,
    `diff` and `promote` read the fork's history as that run's; a fork named after an
    earlier fork started, then failed to record its receipt, and `promote` closed the
    earlier fork's family. Both are refused before anything starts."""
    a = await agent_lab.start_research(model="slow", topic="alpha")
    await a.result()
    b = await agent_lab.start_research(model="slow", topic="bravo")
    await b.result()
    b_run = (await b.describe()).run_id
    with pytest.raises(ForkError, match="is the id of an existing workflow"):
        await agent_lab.lab.fork(ForkRequest(run=a.id, at_step=2, name=b.id))
    assert (await b.describe()).run_id == b_run
    assert agent_lab.lab.registry.receipt(b.id) is None
    first = await agent_lab.lab.fork(ForkRequest(run=a.id, at_step=2, name=f"{a.id}-try"))
    await first.handle.result()
    first_run = (await first.handle.describe()).run_id
    c = await agent_lab.start_research(model="slow", topic="charlie")
    await c.result()
    with pytest.raises(ForkError, match="is taken by an earlier fork"):
        await agent_lab.lab.fork(ForkRequest(run=c.id, at_step=2, name=f"{a.id}-try"))
    assert (await first.handle.describe()).run_id == first_run
    receipt = agent_lab.lab.registry.receipt(f"{a.id}-try")
    assert receipt is not None and receipt.parent_workflow_id == a.id
    assert (await agent_lab.lab.promote(f"{a.id}-try")).closed == [a.id]


async def test_a_found_fork_gets_its_receipt_only_when_this_home_signed_it(
    agent_lab: AgentTestLab, tmp_path: Path
) -> None:
    """A cohort fork activity killed between the fork's start and its receipt finds the
    fork on its retry; the receipt is then recorded from the fork's own start (5 of 6
    receipts were recorded before, when a worker was killed mid-experiment). A workflow
    under that id that this home did not start as that fork gives nothing: the receipt in
    its memo would otherwise put a stranger's run into the fork registry."""
    a = await agent_lab.start_research(model="slow", topic="alpha")
    await a.result()
    fork = await agent_lab.lab.fork(ForkRequest(run=a.id, at_step=2))
    await fork.handle.result()
    lost = ForkRegistry(tmp_path / "lost.sqlite")  # the receipt the dead attempt never wrote
    starter = ForkStarter(agent_lab.client, lost, agent_lab.agent.home)
    await starter.record_started(fork.handle.id)
    assert lost.receipt(fork.handle.id) == fork.receipt
    stranger = await agent_lab.client.start_workflow(
        ResearchPipelineWorkflow.run,
        ResearchInput(topic="x", model="slow"),
        id=f"stranger-{uuid.uuid4().hex[:8]}",
        task_queue=agent_lab.agent.agent_task_queue,
        memo={RECEIPT_MEMO_KEY: fork.receipt.model_dump(mode="json")},
    )
    await stranger.result()
    with pytest.raises(ForkExists, match="this home did not start as that fork"):
        await starter.record_started(stranger.id)
    copied = ForkRegistry(tmp_path / "copied.sqlite")
    with pytest.raises(ForkExists, match="does not trust"):
        await ForkStarter(agent_lab.client, copied, tmp_path / "other-home").record_started(
            fork.handle.id
        )
    assert lost.receipt(stranger.id) is None and copied.receipt(fork.handle.id) is None


async def _failure(handle: WorkflowHandle[Any, Any]) -> BaseException:
    """How the run ended; fails the test if it is still open after 30 s."""
    try:
        await asyncio.wait_for(handle.result(), 30)
    except WorkflowFailureError as exc:
        return exc.cause
    except TimeoutError:
        history = await handle.fetch_history()
        failed = [
            e.workflow_task_failed_event_attributes.failure.message
            for e in history.events
            if e.HasField("workflow_task_failed_event_attributes")
        ]
        pytest.fail(f"the run is still open; its workflow task failed: {failed[:1]}")
    pytest.fail("the run completed")


async def test_a_malformed_fork_marker_fails_the_run_instead_of_wedging_it(
    agent_lab: AgentTestLab,
) -> None:
    charges = agent_lab.charges()
    for marker in ({"bogus": 1}, "not a marker", {"lineage_root": ["x"]}):
        handle = await agent_lab.client.start_workflow(
            ResearchPipelineWorkflow.run,
            ResearchInput(topic="x", model="slow"),
            id=f"marker-{uuid.uuid4().hex[:8]}",
            task_queue=agent_lab.agent.agent_task_queue,
            memo={MARKER_MEMO_KEY: marker},
        )
        cause = await _failure(handle)
        assert isinstance(cause, ApplicationError) and cause.type == ForkErrorType.marker_invalid, (
            cause
        )
        assert cause.message.startswith(f"memo {MARKER_MEMO_KEY!r} is not a fork marker ("), cause
    assert agent_lab.charges() == charges


async def test_an_agent_started_with_bad_input_fails_instead_of_wedging(
    agent_lab: AgentTestLab,
) -> None:
    """A raw start (`temporal workflow start`) with input the agent's model refuses."""
    charges = agent_lab.charges()
    for bad in ({"topic": ""}, {"topic": "x", "amount_cents": -5}, {"nope": 1}, "text"):
        handle = await agent_lab.client.start_workflow(
            "ResearchPipeline",
            bad,
            id=f"badin-{uuid.uuid4().hex[:8]}",
            task_queue=agent_lab.agent.agent_task_queue,
        )
        cause = await _failure(handle)
        # refused by the agents' converter before the workflow runs (agent_converter.py)
        assert isinstance(cause, ApplicationError), cause
        assert cause.type == ForkErrorType.payload_refused, cause
        assert cause.message.startswith("a ResearchInput payload does not validate ("), cause
        assert ", first: field " in cause.message and "\n" not in cause.message
    assert agent_lab.charges() == charges
