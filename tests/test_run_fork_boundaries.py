"""Boundary modes and parent states on a plain (framework-free) workflow: the fork
mechanism depends on nothing but activities."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from agent_fixtures import Services, agent_settings
from fork_failures import blocked_error
from fork_workloads import StepsInput, StepsWorkflow, echo, hold
from temporalio.api.common.v1 import WorkflowExecution
from temporalio.api.workflowservice.v1 import GetWorkflowExecutionHistoryReverseRequest
from temporalio.client import Client, WorkflowFailureError, WorkflowHandle
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Replayer, Worker

from forklab.activities.runfork import history_reads
from forklab.activities.runfork.history_events import digest_payloads
from forklab.activities.runfork.history_reads import locate_step
from forklab.cli.runfork.agent_lab import AgentLab, ForkError
from forklab.contracts.fork_request import ForkRequest
from forklab.experiments.runfork.policy import ToolPolicy
from forklab.experiments.runfork.receipt import BoundaryMode
from forklab.experiments.runfork.steps import StepOrigin, prefix_sha256
from forklab.temporal import ForkLabPlugin


@dataclass
class StepsLab:
    lab: AgentLab
    client: Client
    queue: str

    async def start(self, **fields: object) -> str:
        wid = f"steps-{uuid.uuid4().hex[:8]}"
        await self.client.start_workflow(
            StepsWorkflow.run,
            StepsInput(**fields),
            id=wid,
            task_queue=self.queue,  # type: ignore[arg-type]
        )
        return wid


@pytest.fixture
async def steps_lab(
    temporal_env: WorkflowEnvironment, services: Services, tmp_path: Path
) -> AsyncIterator[StepsLab]:
    client = await Client.connect(
        temporal_env.client.service_client.config.target_host,
        data_converter=pydantic_data_converter,
    )
    agent = agent_settings(services, tmp_path / "home")
    async with Worker(
        client,
        task_queue=agent.agent_task_queue,
        workflows=[StepsWorkflow],
        activities=[echo, hold],
        plugins=[ForkLabPlugin(agent.run_log_path)],
    ):
        yield StepsLab(AgentLab(client, agent), client, agent.agent_task_queue)


async def test_fork_serves_the_prefix_and_replays_deterministically(steps_lab: StepsLab) -> None:
    wid = await steps_lab.start(steps=6)
    parent = steps_lab.client.get_workflow_handle(wid)
    expected = await parent.result()
    # auto (the default): the tail's calls are identical to the parent's, so replayed
    auto = await steps_lab.lab.fork(ForkRequest(run=wid, at_step=4))
    assert await auto.handle.result() == expected
    steps = await steps_lab.lab.steps(auto.handle.id)
    assert [s.origin for s in steps] == [StepOrigin.inherited] * 4 + [StepOrigin.replayed] * 2
    fork = await steps_lab.lab.fork(
        ForkRequest(run=wid, at_step=4, tool_policies={"*": ToolPolicy.live})
    )
    assert await fork.handle.result() == expected
    steps = await steps_lab.lab.steps(fork.handle.id)
    assert [s.origin for s in steps] == [StepOrigin.inherited] * 4 + [StepOrigin.own] * 2
    history = await fork.handle.fetch_history()
    # only two echo activities ran on the fork, after the one prefix read (which verified
    # the marker before reading anything)
    scheduled = [
        e.activity_task_scheduled_event_attributes.activity_type.name
        for e in history.events
        if e.HasField("activity_task_scheduled_event_attributes")
    ]
    assert scheduled == ["forklab.fetch_prefix", "echo", "echo"]
    await Replayer(
        workflows=[StepsWorkflow],
        plugins=[ForkLabPlugin(steps_lab.lab.agent.run_log_path)],
        data_converter=pydantic_data_converter,
    ).replay_workflow(history)
    # without the interceptor the fork's history is not what the workflow code does
    with pytest.raises(Exception, match=r"(?i)nondetermin"):
        await Replayer(
            workflows=[StepsWorkflow], data_converter=pydantic_data_converter
        ).replay_workflow(history)


async def test_ids_from_workflow_uuid4_in_the_prefix_fork_exactly(steps_lab: StepsLab) -> None:
    """The prefix draws ``workflow.uuid4()`` from the parent's seed: the inherited calls
    ask with the parent's ids (input drift from the workflow id: test_fork_drift_builds)."""
    wid = await steps_lab.start(steps=4, random_ids=True)
    parent = await steps_lab.client.get_workflow_handle(wid).result()
    exact = await steps_lab.lab.fork(ForkRequest(run=wid, at_step=2))
    assert await exact.handle.result() == parent
    approx = await steps_lab.lab.fork(
        ForkRequest(run=wid, at_step=2, boundary=BoundaryMode.approximate)
    )
    assert await approx.handle.result() == parent


async def test_a_timer_inside_the_prefix_is_inherited_not_started_again(
    steps_lab: StepsLab,
) -> None:
    wid = await steps_lab.start(steps=4, sleep_after=2)
    await steps_lab.client.get_workflow_handle(wid).result()
    fork = await steps_lab.lab.fork(ForkRequest(run=wid, at_step=3))
    assert fork.receipt.restorable and fork.receipt.approximations == []
    assert len(await fork.handle.result()) == 4
    events = (await fork.handle.fetch_history()).events
    assert not [e for e in events if e.HasField("timer_started_event_attributes")]
    # before the timer fired the fork starts it itself
    early = await steps_lab.lab.fork(ForkRequest(run=wid, at_step=2))
    assert len(await early.handle.result()) == 4
    events = (await early.handle.fetch_history()).events
    assert len([e for e in events if e.HasField("timer_started_event_attributes")]) == 1


async def test_fork_a_running_then_terminated_parent(steps_lab: StepsLab) -> None:
    wid = await steps_lab.start(steps=5, hold_at=4)
    parent = steps_lab.client.get_workflow_handle(wid)
    for _ in range(200):
        steps = await steps_lab.lab.steps(wid)
        if len(steps) == 4:
            break
        await asyncio.sleep(0.1)
    with pytest.raises(ForkError, match=r"step 4 .*never completed"):
        await steps_lab.lab.fork(ForkRequest(run=wid, at_step=4))
    before = list((await parent.fetch_history()).events)
    running = await steps_lab.lab.fork(ForkRequest(run=wid, at_step=3))
    assert list((await parent.fetch_history()).events) == before  # forking wrote nothing
    await parent.terminate("crash")
    crashed = await steps_lab.lab.fork(ForkRequest(run=wid, at_step=3))
    after = list((await parent.fetch_history()).events)
    assert after[: len(before)] == before and len(after) == len(before) + 1  # + terminated
    for fork in (running, crashed):  # both reach the parent's step 4 (held) live
        for _ in range(200):
            if len(await steps_lab.lab.steps(fork.handle.id)) == 4:
                break
            await asyncio.sleep(0.1)
        assert [s.origin for s in await steps_lab.lab.steps(fork.handle.id)] == [
            StepOrigin.inherited
        ] * 3 + [StepOrigin.own]
    await running.handle.terminate("test over")
    await crashed.handle.terminate("test over")


async def test_fork_across_continue_as_new_and_fork_of_fork(steps_lab: StepsLab) -> None:
    wid = await steps_lab.start(steps=9, can_every=3)
    expected = await steps_lab.client.get_workflow_handle(wid).result()
    steps = await steps_lab.lab.steps(wid)
    assert [s.index for s in steps] == list(range(1, 10))
    fork = await steps_lab.lab.fork(ForkRequest(run=wid, at_step=5))
    assert fork.receipt.base_step == 3 and fork.receipt.source_run_id != fork.receipt.parent_run_id
    # the second run has closed: a second fork inside it parses it from memory
    assert steps_lab.lab.runs.hits == 0
    again = await steps_lab.lab.fork(ForkRequest(run=wid, at_step=4))
    assert steps_lab.lab.runs.hits == 1
    assert again.receipt.source_run_id == fork.receipt.source_run_id
    assert len(await again.handle.result()) == len(expected)
    assert await fork.handle.result() == expected
    fork_steps = await steps_lab.lab.steps(fork.handle.id)
    assert [s.index for s in fork_steps][:3] == [4, 5, 6]
    grandchild = await steps_lab.lab.fork(ForkRequest(run=fork.handle.id, at_step=7))
    assert grandchild.receipt.lineage == [wid, fork.handle.id]
    assert await grandchild.handle.result() == expected


async def _scheduled(handle: WorkflowHandle[Any, Any]) -> list[tuple[str, str]]:
    """(activity type, summary) of every activity a run scheduled."""
    conv = pydantic_data_converter.payload_converter
    return [
        (
            e.activity_task_scheduled_event_attributes.activity_type.name,
            str(conv.from_payload(e.user_metadata.summary)),
        )
        for e in (await handle.fetch_history()).events
        if e.HasField("activity_task_scheduled_event_attributes")
    ]


async def test_exact_fork_inside_an_earlier_run_of_a_running_chain(steps_lab: StepsLab) -> None:
    """The parent continued-as-new twice and its third run is running (held at step 8);
    a fork at step 5 (inside the second run) is exact: steps 1..3 arrive through the second
    run's recorded input, 4..5 are served from its recorded history, none runs again. The
    fork's own later run keeps its numbering, lineage and tool policies."""
    wid = await steps_lab.start(steps=9, can_every=3, hold_at=8)
    parent = steps_lab.client.get_workflow_handle(wid)
    for _ in range(300):
        if len(await steps_lab.lab.steps(wid)) == 8:
            break
        await asyncio.sleep(0.1)
    chain = await steps_lab.lab.chain(wid)
    assert [r.status for r in chain] == ["continued_as_new"] * 2 + ["running"]
    runs = [steps_lab.client.get_workflow_handle(wid, run_id=r.run_id) for r in chain]
    before = [list((await h.fetch_history()).events) for h in runs]
    # the parent's later runs number their steps after the earlier runs'
    assert await _scheduled(runs[1]) == [("echo", f"step {i}: echo") for i in (4, 5, 6)]
    with pytest.raises(ForkError, match=r"step 8 .*never completed"):
        await steps_lab.lab.fork(ForkRequest(run=wid, at_step=8))
    policies = {"*": ToolPolicy.live, "hold": ToolPolicy.block}
    fork = await steps_lab.lab.fork(
        ForkRequest(run=wid, at_step=5, tool_policies=policies, intervention={"v": 2})
    )
    r = fork.receipt
    assert r.boundary is BoundaryMode.exact and r.restorable
    assert (r.requested_step, r.resolved_step, r.base_step) == (5, 5, 3)
    assert r.source_run_id == chain[1].run_id and r.parent_run_id == chain[2].run_id
    with pytest.raises(WorkflowFailureError) as failure:  # step 8 (hold) is blocked
        await fork.handle.result()
    blocked = blocked_error(failure.value.cause)
    assert blocked is not None and "step 8" in str(blocked)
    steps = await steps_lab.lab.steps(fork.handle.id)
    assert [(s.index, s.origin) for s in steps] == [
        (4, StepOrigin.inherited),
        (5, StepOrigin.inherited),
        (6, StepOrigin.own),
        (7, StepOrigin.own),
        (8, StepOrigin.blocked),
    ]
    fork_chain = await steps_lab.lab.chain(fork.handle.id)
    assert len(fork_chain) == 2  # the fork continued-as-new after its step 6, as the parent
    first, later = (
        steps_lab.client.get_workflow_handle(fork.handle.id, run_id=x.run_id) for x in fork_chain
    )
    assert await _scheduled(first) == [
        ("forklab.fetch_prefix", f"fork of {wid}: inherit steps 4..5"),
        ("echo", "step 6: echo"),
    ]
    assert [t for t, _ in await _scheduled(later)] == ["echo", "forklab.step_decision"]
    assert fork_chain[1].marker is not None and fork_chain[1].marker.intervention == {"v": 2}
    parent_first_run = (await steps_lab.lab.chain(wid))[0].run_id
    assert fork_chain[1].marker.lineage_root == f"{wid}@{parent_first_run}"
    # a fork of the fork, inside its later run, is exact too
    grandchild = await steps_lab.lab.fork(
        ForkRequest(run=fork.handle.id, at_step=7, tool_policies=policies)
    )
    assert grandchild.receipt.base_step == 6 and grandchild.receipt.lineage == [wid, fork.handle.id]
    with pytest.raises(WorkflowFailureError):
        await grandchild.handle.result()
    assert [s.origin for s in await steps_lab.lab.steps(grandchild.handle.id)] == [
        StepOrigin.inherited,
        StepOrigin.blocked,
    ]
    after = [list((await h.fetch_history()).events) for h in runs]
    assert after == before  # forking wrote nothing to any run of the parent
    await parent.terminate("test over")


async def test_a_run_ending_in_calls_in_parallel_is_read_from_its_end(
    steps_lab: StepsLab,
) -> None:
    """Step 6 ends the parent's second run, three calls in parallel: read from the end of
    that run (back to the scheduling of all three), not in full, and the fork starts from
    the next run's input, served nothing."""
    wid = await steps_lab.start(steps=9, can_every=3, parallel=3)
    expected = await steps_lab.client.get_workflow_handle(wid).result()
    located = await locate_step(steps_lab.client, wid, 6)
    assert located.tail_only and located.histories_read == 0
    assert [s.index for s in located.source.steps] == [4, 5, 6]
    live = await steps_lab.lab.fork(
        ForkRequest(run=wid, at_step=6, tool_policies={"*": ToolPolicy.live})
    )
    assert (live.receipt.base_step, live.receipt.prefix_sha256) == (6, prefix_sha256([]))
    assert await live.handle.result() == expected
    # inside the run, the whole run is read
    assert not (await locate_step(steps_lab.client, wid, 5)).tail_only


async def test_a_run_end_longer_than_a_page_is_read_page_by_page(
    steps_lab: StepsLab, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Step 16 ends the parent's second run, 8 calls in parallel, and a reverse page is
    made 2 batches (``TAIL_PAGE_BATCHES``; the scheduling of the 8, their completions and
    the last workflow task are at least 3): one page does not reach back to the
    scheduling, so the tail is read on, page by page — still not the whole run — and the
    fork starts from the next run's input, served nothing."""
    monkeypatch.setattr(history_reads, "TAIL_PAGE_BATCHES", 2)
    wid = await steps_lab.start(steps=24, can_every=8, parallel=8)
    expected = await steps_lab.client.get_workflow_handle(wid).result()
    second = (await steps_lab.lab.chain(wid))[1]
    page = await steps_lab.client.workflow_service.get_workflow_execution_history_reverse(
        GetWorkflowExecutionHistoryReverseRequest(
            namespace=steps_lab.client.namespace,
            execution=WorkflowExecution(workflow_id=wid, run_id=second.run_id),
            maximum_page_size=history_reads.TAIL_PAGE_BATCHES,
        )
    )
    scheduled = [
        e for e in page.history.events if e.HasField("activity_task_scheduled_event_attributes")
    ]
    assert len(scheduled) < 8 and page.next_page_token, "one page holds the whole tail"
    located = await locate_step(steps_lab.client, wid, 16)
    assert located.tail_only and located.histories_read == 0
    assert [s.index for s in located.source.steps] == list(range(9, 17))
    live = await steps_lab.lab.fork(
        ForkRequest(run=wid, at_step=16, tool_policies={"*": ToolPolicy.live})
    )
    assert (live.receipt.base_step, live.receipt.prefix_sha256) == (16, prefix_sha256([]))
    assert await live.handle.result() == expected


async def test_a_boundary_that_ends_a_run_starts_from_the_next_runs_input(
    steps_lab: StepsLab,
) -> None:
    """Step 6 is the last of the parent's second run: the third run's recorded input is the
    state after step 6, so the fork starts from it and is served nothing (and does not
    continue-as-new where the parent did)."""
    wid = await steps_lab.start(steps=9, can_every=3)
    expected = await steps_lab.client.get_workflow_handle(wid).result()
    chain = await steps_lab.lab.chain(wid)
    located = await locate_step(steps_lab.client, wid, 6)  # from the ends of runs 3 and 2
    assert located.tail_only and located.histories_read == 0 and located.starts_read == 2
    live = await steps_lab.lab.fork(
        ForkRequest(run=wid, at_step=6, tool_policies={"*": ToolPolicy.live})
    )
    r = live.receipt
    assert (r.requested_step, r.resolved_step, r.base_step) == (6, 6, 6) and r.restorable
    assert r.source_run_id == chain[2].run_id
    assert r.source_input_sha256 == digest_payloads(chain[2].input)
    assert r.prefix_sha256 == prefix_sha256([])  # served nothing: the input is the state
    assert await live.handle.result() == expected
    # the marker verified, no prefix read
    assert [t for t, _ in await _scheduled(live.handle)] == ["forklab.verify_fork"] + ["echo"] * 3
    assert [(s.index, s.origin) for s in await steps_lab.lab.steps(live.handle.id)] == [
        (7, StepOrigin.own),
        (8, StepOrigin.own),
        (9, StepOrigin.own),
    ]
    # lineage_only inherits nothing: it re-runs the run holding step 6 from its start
    lineage = await steps_lab.lab.fork(
        ForkRequest(run=wid, at_step=6, boundary=BoundaryMode.lineage_only)
    )
    assert (lineage.receipt.base_step, lineage.receipt.source_run_id) == (3, chain[1].run_id)
    assert await lineage.handle.result() == expected
    # auto: the parent's own calls after the boundary (its third run) are served
    auto = await steps_lab.lab.fork(ForkRequest(run=wid, at_step=6))
    assert await auto.handle.result() == expected
    assert [s.origin for s in await steps_lab.lab.steps(auto.handle.id)] == [
        StepOrigin.replayed
    ] * 3
    # a timer after the run's last step keeps the boundary inside its run
    timed = await steps_lab.start(steps=6, can_every=3, sleep_after=3)
    await steps_lab.client.get_workflow_handle(timed).result()
    assert not (await locate_step(steps_lab.client, timed, 3)).tail_only
    inside = await steps_lab.lab.fork(ForkRequest(run=timed, at_step=3))
    assert inside.receipt.base_step == 0 and inside.receipt.source_run_id == (
        (await steps_lab.lab.chain(timed))[0].run_id
    )


async def test_a_chain_without_step_counts_in_its_memo_is_located_by_counting(
    steps_lab: StepsLab,
) -> None:
    """A parent whose worker had no fork interceptor continued-as-new without recording
    its step counts: the run holding N is found by reading and counting the runs."""
    queue = f"plain-{uuid.uuid4().hex[:8]}"
    wid = f"plain-{uuid.uuid4().hex[:8]}"
    async with Worker(
        steps_lab.client, task_queue=queue, workflows=[StepsWorkflow], activities=[echo]
    ):
        expected = await steps_lab.client.execute_workflow(
            StepsWorkflow.run, StepsInput(steps=9, can_every=3), id=wid, task_queue=queue
        )
    async with Worker(
        steps_lab.client,
        task_queue=queue,
        workflows=[StepsWorkflow],
        activities=[echo],
        plugins=[ForkLabPlugin(steps_lab.lab.agent.run_log_path)],
    ):
        located = await locate_step(steps_lab.client, wid, 5)
        assert located.histories_read == 3 and not located.tail_only
        inside = await steps_lab.lab.fork(ForkRequest(run=wid, at_step=5))
        assert inside.receipt.base_step == 3 and await inside.handle.result() == expected
        at_end = await steps_lab.lab.fork(
            ForkRequest(run=wid, at_step=6, tool_policies={"*": ToolPolicy.live})
        )
        chain = await steps_lab.lab.chain(wid)
        assert at_end.receipt.base_step == 6 and at_end.receipt.source_run_id == chain[2].run_id
        assert await at_end.handle.result() == expected
