"""Fork points by meaning on the command line, and ``forklab steps`` showing every event
kind that matters with the forkable steps marked (issue 33, point 5)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from agent_fixtures import AgentTestLab, Services, agent_settings
from fork_workloads import StepsInput, StepsWorkflow, echo, hold
from orchestration_lab import forklab
from sample_workflows import (
    AwaitsApprovalWorkflow,
    Bank,
    Calls,
    MoneyTransferWorkflow,
    TransferDetails,
)
from temporalio.client import Client, WorkflowFailureError
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Replayer, Worker

from forklab.activities.runfork.overrides import make_override
from forklab.cli.runfork.agent_lab import AgentLab, ForkError
from forklab.cli.runfork.fork_commands import render_steps
from forklab.contracts.fork_request import ForkRequest
from forklab.experiments.runfork.overrides import ForkSignal
from forklab.experiments.runfork.policy import ToolPolicy
from forklab.temporal import ForkLabPlugin
from forklab.workers.config import ENV, Settings
from forklab.workers.runfork.agent_worker import connect_agents


def _env(agent_lab: AgentTestLab) -> dict[str, str]:
    a = agent_lab.agent
    return {
        **os.environ,
        ENV["address"]: agent_lab.client.service_client.config.target_host,
        ENV["home"]: str(a.home),
        "FORKLAB_MODEL_BASE_URL": a.model_base_url,
        "FORKLAB_EFFECTS_URL": a.effects_url,
        "FORKLAB_AGENT_TASK_QUEUE": a.agent_task_queue,
    }


async def test_fork_at_a_tool_call_and_bad_points_on_the_cli(agent_lab: AgentTestLab) -> None:
    parent = await agent_lab.start_research(model="fast")
    with pytest.raises(WorkflowFailureError):
        await parent.result()
    env = _env(agent_lab)
    out = forklab(env, "steps", parent.id)
    assert out.returncode == 0, out.stderr
    header, *rows = out.stdout.splitlines()
    assert header.split()[-2:] == ["fork", "call"]
    assert all(" yes " in row for row in rows)  # nothing but activities: every step forks
    # the step before the (last) charge is the boundary; the charge is re-decided live
    out = await asyncio.to_thread(  # it waits for the fork, which the worker here runs
        forklab, env, "fork", parent.id, "--at", "tool:charge_customer", "--json",
        "--tool-policy", "charge_customer=block",
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    receipt = json.loads(out.stdout)
    assert receipt["requested_step"] == 3 and receipt["resolved_step"] == 3
    assert receipt["requested_point"] == "tool:charge_customer#1"
    fork = agent_lab.client.get_workflow_handle(receipt["fork_workflow_id"])
    with contextlib.suppress(WorkflowFailureError):  # the model is still `fast`
        await asyncio.wait_for(fork.result(), timeout=60)
    steps = await agent_lab.lab.steps(fork.id)
    assert steps[3].activity_type == "charge_customer" and steps[3].origin == "blocked"
    for at, says in {
        "failed": "--at failed: the run has no failed step",
        "tool:charge_customer#2": "calls tool 'charge_customer' only 1 time, not #2",
        "tool:nothing": "calls tool 'nothing' never",
        "maybe": "is no fork point; write failed, tool:NAME",
    }.items():
        out = forklab(env, "fork", parent.id, "--at", at)
        assert out.returncode == 2, (at, out.stdout)
        assert says in out.stderr and len(out.stderr.strip().splitlines()) == 1, out.stderr
    out = forklab(env, "fork", parent.id, "--at", "failed", "--at-step", "2")
    assert out.returncode == 2 and "not allowed with" in out.stderr
    for args, says in {
        ("--override-result", "x"): "is not N=JSON",
        ("--override-result", "3={oops"): "--override-result's value: not valid JSON",
        ("--override-result", "3=1", "--at-step", "2"): "names step 3 but the fork is at step 2",
        ("--live-after",): "give --at-step N, --at POINT, --override-result N=JSON",
        ("--override-input", "4=[1", "--at-step", "3"): "--override-input's value: not valid",
        ("--at-step", "3", "--signal", "bad name"): "--signal 'bad name': give NAME or NAME=JSON",
    }.items():
        out = forklab(env, "fork", parent.id, *args)
        assert out.returncode == 2 and says in out.stderr, (args, out.stderr)
    # --live-after: the default policy of the fork is live (in the receipt)
    out = await asyncio.to_thread(
        forklab, env, "fork", parent.id, "--at-step", "5", "--live-after", "--json"
    )
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["tool_policies"] == {"*": "live"}


@pytest.fixture
async def plain_lab(
    temporal_env: WorkflowEnvironment, services: Services, tmp_path: Path
) -> AsyncIterator[tuple[AgentLab, Client, str, Calls]]:
    agent = agent_settings(services, tmp_path / "home")
    target = temporal_env.client.service_client.config.target_host
    settings = Settings.load({"address": target, "home": tmp_path / "home"}, env={})
    client = await connect_agents(settings, agent)
    calls = Calls()
    bank = Bank(calls)
    queue = f"at-{uuid.uuid4().hex[:8]}"
    async with Worker(
        client,
        task_queue=queue,
        workflows=[StepsWorkflow, MoneyTransferWorkflow, AwaitsApprovalWorkflow],
        activities=[echo, hold, bank.withdraw, bank.deposit, bank.refund],
        plugins=[ForkLabPlugin(agent.run_log_path)],
    ):
        yield AgentLab(client, agent), client, queue, calls


async def test_fork_at_the_failed_step_re_runs_it_live(
    plain_lab: tuple[AgentLab, Client, str, Calls],
) -> None:
    """The saga's deposit failed (a closed account): ``--at failed`` inherits the
    withdrawal and runs the deposit again, live."""
    lab, client, queue, calls = plain_lab
    wid = f"transfer-{uuid.uuid4().hex[:8]}"
    details = TransferDetails(source="a", target="closed-b", amount=3, reference="f1")
    result = await client.execute_workflow(
        MoneyTransferWorkflow.run, details, id=wid, task_queue=queue
    )
    assert result == "refunded: W-f1 R-f1"
    assert [s.status for s in await lab.steps(wid)] == ["completed", "failed", "completed"]
    assert await lab.resolve_at(wid, "failed") == ("failed", 1)
    point, at = await lab.resolve_at(wid, "tool:refund")
    assert (point, at) == ("tool:refund#1", 2)
    with pytest.raises(ForkError, match="no model call precedes the failed step 2"):
        await lab.resolve_at(wid, "last_model_call_before_failure")
    fork = await lab.fork(
        ForkRequest(run=wid, at_step=1, point="failed", tool_policies={"*": ToolPolicy.live})
    )
    assert await asyncio.wait_for(fork.handle.result(), timeout=60) == result
    assert fork.receipt.requested_point == "failed"
    assert calls.counts[(fork.handle.id, "withdraw")] == 0
    assert calls.counts[(fork.handle.id, "deposit")] == 1


async def test_a_fork_that_fails_live_after_its_prefix_got_past_it(
    plain_lab: tuple[AgentLab, Client, str, Calls],
) -> None:
    """A fork that fails after its fork point (every tool blocked: the deposit, then the
    saga's refund) did get past its prefix: asked once it has closed, as a loaded machine
    may first ask, ``fork_point`` answers with the point instead of calling it a prefix
    failure (``forklab fork`` exits 0)."""
    lab, client, queue, _ = plain_lab
    wid = f"transfer-{uuid.uuid4().hex[:8]}"
    details = TransferDetails(source="a", target="b", amount=3, reference="f9")
    await client.execute_workflow(MoneyTransferWorkflow.run, details, id=wid, task_queue=queue)
    fork = await lab.fork(ForkRequest(run=wid, at_step=1, tool_policies={"*": ToolPolicy.block}))
    with pytest.raises(WorkflowFailureError):
        await asyncio.wait_for(fork.handle.result(), timeout=60)
    point = await lab.fork_point(fork, timeout=30)
    assert point is not None and point.reached


async def test_steps_show_timers_and_mark_where_a_fork_is_exact(
    plain_lab: tuple[AgentLab, Client, str, Calls],
) -> None:
    lab, client, queue, _ = plain_lab
    wid = f"steps-{uuid.uuid4().hex[:8]}"
    await client.execute_workflow(
        StepsWorkflow.run, StepsInput(steps=4, sleep_after=2), id=wid, task_queue=queue
    )
    timeline = await lab.timeline(wid)
    assert [(e.kind, e.after_step) for e in timeline.events] == [("timer", 2)]
    # a fired timer inside the prefix is inherited: every step forks exactly
    assert [timeline.not_forkable[i] is None for i in (1, 2, 3, 4)] == [True] * 4
    rows = render_steps(timeline).splitlines()[1:]
    assert [r.split()[0] for r in rows] == ["1", "2", "·", "3", "4"]
    assert rows[2].split() == ["·", "timer"]
    assert [r.split()[-2] for r in rows if r.split()[0] != "·"] == ["yes"] * 4


async def test_override_result_what_if_the_deposit_had_gone_through(
    plain_lab: tuple[AgentLab, Client, str, Calls],
) -> None:
    """The parent's deposit failed; a fork told it returned ``D-f2`` inherits the
    withdrawal, takes the transfer's success path, and runs neither deposit nor refund."""
    lab, client, queue, calls = plain_lab
    wid = f"transfer-{uuid.uuid4().hex[:8]}"
    details = TransferDetails(source="a", target="closed-b", amount=3, reference="f2")
    assert (
        await client.execute_workflow(MoneyTransferWorkflow.run, details, id=wid, task_queue=queue)
        == "refunded: W-f2 R-f2"
    )
    fork = await lab.fork(ForkRequest(run=wid, at_step=2, result_override=make_override(2, "D-f2")))
    assert await asyncio.wait_for(fork.handle.result(), timeout=60) == "transferred: W-f2 D-f2"
    assert calls.of(fork.handle.id) == 0
    assert [s.origin for s in await lab.steps(fork.handle.id)] == ["inherited", "overridden"]
    receipt = fork.receipt
    assert receipt.result_override is not None and receipt.result_override.value == "D-f2"
    assert receipt.restorable and receipt.resolved_step == 2
    trail = await lab.trail(fork.handle.id)
    assert trail["receipts"][0]["result_override"]["value"] == "D-f2"
    # a fork of the fork inherits the overridden result like any step
    again = await lab.fork(
        ForkRequest(run=fork.handle.id, at_step=2, tool_policies={"*": ToolPolicy.live})
    )
    assert await asyncio.wait_for(again.handle.result(), timeout=60) == "transferred: W-f2 D-f2"
    assert calls.of(again.handle.id) == 0
    with pytest.raises(ForkError, match="the run has no step 7"):
        await lab.fork(ForkRequest(run=wid, at_step=7, result_override=make_override(7, "x")))


async def test_override_input_what_if_the_deposit_had_gone_to_an_open_account(
    plain_lab: tuple[AgentLab, Client, str, Calls],
) -> None:
    """The parent deposited into a closed account and refunded; a fork that asks the
    deposit for an open account runs it live with that input and transfers."""
    lab, client, queue, calls = plain_lab
    wid = f"transfer-{uuid.uuid4().hex[:8]}"
    details = TransferDetails(source="a", target="closed-b", amount=3, reference="f3")
    await client.execute_workflow(MoneyTransferWorkflow.run, details, id=wid, task_queue=queue)
    fixed = details.model_copy(update={"target": "open-b"}).model_dump()
    fork = await lab.fork(ForkRequest(run=wid, at_step=1, input_override=(2, fixed)))
    assert await asyncio.wait_for(fork.handle.result(), timeout=60) == "transferred: W-f3 D-f3"
    assert calls.counts[(fork.handle.id, "withdraw")] == 0
    assert calls.counts[(fork.handle.id, "deposit")] == 1
    assert calls.counts[(fork.handle.id, "refund")] == 0
    assert fork.receipt.input_override is not None
    assert fork.receipt.input_override.value["target"] == "open-b"
    with pytest.raises(ForkError, match="names step 3 but the fork is at step 1"):
        await lab.fork(ForkRequest(run=wid, at_step=1, input_override=(3, fixed)))


async def test_a_signal_is_delivered_at_the_fork_point(
    plain_lab: tuple[AgentLab, Client, str, Calls],
) -> None:
    """The parent waits for an approval nobody gave; a fork at step 1 with ``--signal
    approve`` gets it right after the inherited withdrawal, and finishes."""
    lab, client, queue, calls = plain_lab
    wid = f"pending-{uuid.uuid4().hex[:8]}"
    details = TransferDetails(source="a", target="b", amount=3, reference="s1")
    parent = await client.start_workflow(
        AwaitsApprovalWorkflow.run, details, id=wid, task_queue=queue
    )
    for _ in range(200):
        steps = await lab.steps(wid)
        if steps and steps[0].status == "completed":
            break
        await asyncio.sleep(0.1)
    fork = await lab.fork(ForkRequest(run=wid, at_step=1, signals=[ForkSignal(name="approve")]))
    assert await asyncio.wait_for(fork.handle.result(), timeout=60) == "W-s1 D-s1"
    assert calls.of(fork.handle.id) == 1  # the deposit, after the approval
    assert [g.name for g in fork.receipt.signals] == ["approve"]
    history = await fork.handle.fetch_history()
    await Replayer(
        workflows=[AwaitsApprovalWorkflow],
        plugins=[ForkLabPlugin(lab.agent.run_log_path)],
        data_converter=client.data_converter,
    ).replay_workflow(history)
    # a fork of the fork past that point would not get the signal again: refused exactly
    with pytest.raises(ForkError, match=r"a signal \(given at the fork point\) reached"):
        await lab.fork(ForkRequest(run=fork.handle.id, at_step=2))
    wrong = await lab.fork(
        ForkRequest(run=wid, at_step=1, signals=[ForkSignal(name="approve_all")])
    )
    with pytest.raises(WorkflowFailureError) as failed:
        await asyncio.wait_for(wrong.handle.result(), timeout=60)
    assert "no signal 'approve_all'" in str(failed.value.cause)
    await parent.terminate("test over")
