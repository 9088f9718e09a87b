"""Forking agent runs on a real dev server: the research pipeline through the real
``openai`` client against the local model server over HTTP, charges and mail through
the real payments/mail service, the support agent on the OpenAI Agents SDK."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from agent_fixtures import AgentTestLab
from fork_failures import blocked_in
from temporalio.client import WorkflowFailureError

from forklab.agents.support import SupportAgentWorkflow, SupportInput
from forklab.contracts.fork_request import ForkRequest
from forklab.experiments.runfork.policy import ToolPolicy
from forklab.experiments.runfork.receipt import BoundaryMode
from forklab.experiments.runfork.steps import StepOrigin, prefix_sha256


async def _history_bytes(handle: Any) -> list[bytes]:
    """The parent's events, serialised deterministically (JSON map order is not)."""
    history = await handle.fetch_history()
    return [e.SerializeToString(deterministic=True) for e in history.events]


async def _failed_parent(agent_lab: AgentTestLab) -> str:
    parent = await agent_lab.start_research(model="fast")
    with pytest.raises(WorkflowFailureError) as failure:
        await parent.result()
    assert "low_quality_report" in str(failure.value.cause)
    return parent.id


async def test_fork_at_step_three_with_slow_model_and_blocked_charge(
    agent_lab: AgentTestLab,
) -> None:
    parent_id = await _failed_parent(agent_lab)
    parent = agent_lab.client.get_workflow_handle(parent_id)
    charges_before = agent_lab.charges()
    assert charges_before >= 1
    before = await _history_bytes(parent)
    fork = await agent_lab.lab.fork(
        ForkRequest(
            run=parent_id,
            at_step=3,
            name=f"{parent_id}/slow",
            model="slow",
            intervention={"why": "fast writes thin recommendations"},
            tool_policies={"charge_customer": ToolPolicy.block},
            requested_by="tester",
        )
    )
    state = await fork.handle.result()
    assert state["status"] == "ok"
    assert state["invoice"]["status"] == "blocked"
    assert state["sections"]["recommendations"].startswith("[slow]")
    assert agent_lab.charges() == charges_before
    assert await _history_bytes(parent) == before  # byte for byte
    # the receipt: what was asked and what was inherited
    r = fork.receipt
    parent_steps = await agent_lab.lab.steps(parent_id)
    assert (r.requested_step, r.resolved_step) == (3, 3)
    assert r.parent_workflow_id == parent_id and r.lineage == [parent_id]
    assert r.parent_run_id == (await parent.describe()).run_id
    assert r.boundary is BoundaryMode.exact and r.restorable
    assert r.prefix_sha256 == prefix_sha256(parent_steps[:3])
    assert r.intervention == {"why": "fast writes thin recommendations"}
    assert r.tool_policies == {"charge_customer": ToolPolicy.block, "*": ToolPolicy.auto}
    assert r.model == "slow" and r.requested_by == "tester"
    # it is in the fork's first event (a start header), details and search attributes;
    # the memo holds the marker alone, under Temporal's 2 KiB memo warning
    assert (await agent_lab.lab.chain(fork.handle.id))[0].receipt == r
    desc = await fork.handle.describe()
    assert set(desc.raw_description.workflow_execution_info.memo.fields) == {"forklab_fork"}
    assert desc.raw_description.workflow_execution_info.memo.ByteSize() < 2048
    attrs = {k.name: v for k, v in ((p.key, p.value) for p in desc.typed_search_attributes)}
    assert attrs["ForkLabParent"] == parent_id and attrs["ForkLabBoundary"] == "exact"
    # the lineage root is the parent chain's identity: its id and its first run id
    first_run = (await agent_lab.lab.chain(parent_id))[0].run_id
    assert attrs["ForkLabLineageRoot"] == f"{parent_id}@{first_run}"
    # the blocked charge is a visible step; the trail shows it and the ledger
    steps = await agent_lab.lab.steps(fork.handle.id)
    assert [s.origin for s in steps][:4] == [StepOrigin.inherited] * 3 + [StepOrigin.blocked]
    trail = await agent_lab.lab.trail(fork.handle.id)
    assert trail["policy_decisions"][0]["activity_type"] == "charge_customer"
    assert [e["key_name"] for e in trail["ledger"]] == ["charge:inv-1"]
    # diff: only tail paths changed; the common ancestor is the parent
    d = await agent_lab.lab.diff(parent_id, fork.handle.id)
    assert d.common_ancestor == parent_id and d.divergence_step == 4
    assert all(
        p.startswith(("sections.recommendations", "sections.summary", "invoice", "status", "score"))
        for p in d.diff.paths
    ), d.diff.paths


async def test_auto_replays_the_inherited_charge_and_replay_miss_blocks(
    agent_lab: AgentTestLab,
) -> None:
    parent_id = await _failed_parent(agent_lab)
    charges = agent_lab.charges()
    auto = await agent_lab.lab.fork(ForkRequest(run=parent_id, at_step=3, model="slow"))
    state = await auto.handle.result()
    assert state["invoice"]["status"] == "charged"  # the parent's recorded charge
    assert agent_lab.charges() == charges
    steps = await agent_lab.lab.steps(auto.handle.id)
    assert steps[3].origin == StepOrigin.replayed and steps[4].origin == StepOrigin.own
    # replay: a model call with a new model has no recorded twin: blocked, not run
    strict = await agent_lab.lab.fork(
        ForkRequest(
            run=parent_id, at_step=3, model="slow", tool_policies={"chat_model": ToolPolicy.replay}
        )
    )
    with pytest.raises(WorkflowFailureError) as failure:
        await strict.handle.result()
    assert blocked_in(failure.value.cause)
    # live: the charge runs, and the effect ledger (same lineage root, same key and
    # request) returns the recorded effect instead of charging again
    live = await agent_lab.lab.fork(
        ForkRequest(
            run=parent_id,
            at_step=3,
            model="slow",
            tool_policies={"charge_customer": ToolPolicy.live},
        )
    )
    assert (await live.handle.result())["invoice"]["status"] == "charged"
    assert agent_lab.charges() == charges
    events = agent_lab.lab.ledger.events(await agent_lab.lab.effect_scope(parent_id))
    assert any(e["event"] == "claim:replay" and live.handle.id in e["holder"] for e in events)


async def test_lineage_only_reruns_live_and_fork_of_fork(agent_lab: AgentTestLab) -> None:
    parent_id = await _failed_parent(agent_lab)
    lineage = await agent_lab.lab.fork(
        ForkRequest(run=parent_id, at_step=3, boundary=BoundaryMode.lineage_only)
    )
    with pytest.raises(WorkflowFailureError):
        await lineage.handle.result()  # same model, same verdict, every step re-run
    assert lineage.receipt.resolved_step == 0 and not lineage.receipt.restorable
    assert all(
        s.origin != StepOrigin.inherited for s in await agent_lab.lab.steps(lineage.handle.id)
    )
    child = await agent_lab.lab.fork(ForkRequest(run=parent_id, at_step=3, model="slow"))
    child_state = await child.handle.result()
    grandchild = await agent_lab.lab.fork(
        ForkRequest(run=child.handle.id, at_step=5, model="candidate")
    )
    state = await grandchild.handle.result()
    assert grandchild.receipt.lineage == [parent_id, child.handle.id]
    assert state["sections"]["recommendations"] == child_state["sections"]["recommendations"]
    assert state["sections"]["summary"].startswith("[candidate]")
    steps = await agent_lab.lab.steps(grandchild.handle.id)
    assert [s.origin for s in steps][:5] == [StepOrigin.inherited] * 5


async def test_promote_closes_siblings_and_outcomes_are_append_only(
    agent_lab: AgentTestLab,
) -> None:
    parent_id = await _failed_parent(agent_lab)
    a = await agent_lab.lab.fork(ForkRequest(run=parent_id, at_step=3, model="slow"))
    b = await agent_lab.lab.fork(ForkRequest(run=parent_id, at_step=3, model="candidate"))
    await asyncio.gather(a.handle.result(), b.handle.result())
    agent_lab.lab.outcome(a.handle.id, "good", 0.9)
    agent_lab.lab.outcome(a.handle.id, "better", 0.95)
    closed = (await agent_lab.lab.promote(a.handle.id)).closed
    assert set(closed) == {parent_id, b.handle.id}
    kinds = [d["kind"] for d in agent_lab.lab.registry.decisions(a.handle.id)]
    assert kinds == ["outcome", "outcome", "promoted"]
    assert agent_lab.lab.registry.decisions(b.handle.id)[0]["kind"] == "closed"
    import sqlite3

    with sqlite3.connect(agent_lab.agent.forks_path) as db, pytest.raises(sqlite3.DatabaseError):
        db.execute("UPDATE receipts SET receipt_json='{}'")


async def test_watch_resumes_mid_run_without_loss_or_duplicates(
    agent_lab: AgentTestLab,
) -> None:
    parent = await agent_lab.start_research(model="slow", fail_on_low_score=False)
    seen: list[int] = []
    events: list[dict[str, Any]] = []
    stream = await agent_lab.lab.run_stream(parent.id)
    after = -1
    while not seen or len(seen) < 3:  # read part of the log while the run is going
        for e in agent_lab.lab.watch(stream, after):
            seen.append(e.offset)
            events.append(e.event)
            after = e.offset
        await asyncio.sleep(0.05)
    # a "disconnect": resume from the last offset once the run has finished
    await parent.result()
    for e in agent_lab.lab.watch(stream, after):
        seen.append(e.offset)
        events.append(e.event)
    assert seen == list(range(len(seen)))
    assert agent_lab.lab.run_log.count(stream) == len(seen) == 12  # 6 steps x 2
    assert [e["kind"] for e in events].count("step_completed") == 6


async def test_support_agent_on_the_agents_sdk_forks_without_resending(
    agent_lab: AgentTestLab,
) -> None:
    mails = lambda: sum(1 for e in agent_lab.services.effects_log() if e["kind"] == "email")  # noqa: E731
    before = mails()
    parent = await agent_lab.client.start_workflow(
        SupportAgentWorkflow.run,
        SupportInput(ticket="I want a refund for order 7", customer="ann@example.test"),
        id=f"support-{agent_lab.agent.agent_task_queue}",
        task_queue=agent_lab.agent.agent_task_queue,
    )
    result = await parent.result()
    assert "email" in result.final_output.lower()
    assert mails() == before + 1
    steps = await agent_lab.lab.steps(parent.id)
    assert [s.activity_type for s in steps] == [
        "invoke_model_activity",
        "email.send",
        "invoke_model_activity",
    ]
    # fork after the model chose to send the email: auto replays the recorded send
    fork = await agent_lab.lab.fork(ForkRequest(run=parent.id, at_step=1))
    assert (await fork.handle.result())["final_output"] == result.final_output
    assert mails() == before + 1
    # block: the tool is refused on the fork and the email is never sent
    blocked = await agent_lab.lab.fork(
        ForkRequest(run=parent.id, at_step=1, tool_policies={"email.send": ToolPolicy.block})
    )
    try:
        await blocked.handle.result()
    except WorkflowFailureError as exc:
        # the SDK reports the tool's failure in its own words: the refusal is in history
        assert "Activity task failed" in str(exc.cause) or blocked_in(exc.cause)
    assert mails() == before + 1
    fork_steps = await agent_lab.lab.steps(blocked.handle.id)
    assert fork_steps[1].origin == StepOrigin.blocked
    # --model swaps the model of every live model call in the SDK's activity input
    swapped = await agent_lab.lab.fork(ForkRequest(run=parent.id, at_step=2, model="candidate"))
    await swapped.handle.result()
    labels = [s.label for s in await agent_lab.lab.steps(swapped.handle.id)]
    assert labels[2] == "invoke_model_activity (candidate)"
