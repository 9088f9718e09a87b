"""Signals a run sent other workflows inside a fork's prefix are inherited, not sent again
(issue 33, point 4: real prefixes fork exactly).

A workflow that tells another of each reservation by a signal is recorded on a plain
worker and forked at every step on a worker with ``ForkLabPlugin``: each send the parent
made before the boundary (and its target acknowledged there) completes on the fork without
a command, so the receiver hears it once; the sends after the boundary are the fork's own,
live. A send that failed on the parent inside the prefix is refused before the fork
starts, exact or approximate: sent again, it would reach a workflow outside the fork. So is
a cancellation the parent asked of another workflow inside the prefix, which nothing can
hold back on a fork."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from agent_fixtures import Services, agent_settings
from sample_message_workflows import (
    CancelsAnotherWorkflow,
    GreetingActivities,
    GreetingSignalsWorkflow,
    NotifyInput,
    NotifyReservationsWorkflow,
)
from sample_workflows import Calls
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client
from temporalio.service import RPCError, RPCStatusCode
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Replayer, Worker

from forklab.cli.runfork.agent_lab import AgentLab, ForkError
from forklab.cli.runfork.fork_commands import render_steps
from forklab.contracts.fork_request import ForkRequest
from forklab.experiments.runfork.policy import ToolPolicy
from forklab.experiments.runfork.receipt import BoundaryMode
from forklab.experiments.runfork.steps import StepOrigin
from forklab.temporal import ForkLabPlugin, ensure_search_attributes
from forklab.workers.config import Settings
from forklab.workers.runfork.agent_config import AgentSettings
from forklab.workers.runfork.agent_worker import connect_agents

LIVE = {"*": ToolPolicy.live}
SENT = EventType.EVENT_TYPE_SIGNAL_EXTERNAL_WORKFLOW_EXECUTION_INITIATED


class SendLab:
    def __init__(self, client: Client, agent: AgentSettings) -> None:
        self.client = client
        self.agent = agent
        self.lab = AgentLab(client, agent)
        self.calls = Calls()
        self.queue = f"notify-{uuid.uuid4().hex[:8]}"

    def worker(self, plugin: bool) -> Worker:
        return Worker(
            self.client,
            task_queue=self.queue,
            workflows=[NotifyReservationsWorkflow, GreetingSignalsWorkflow, CancelsAnotherWorkflow],
            activities=GreetingActivities(self.calls).all(),
            plugins=[ForkLabPlugin(self.agent.run_log_path)] if plugin else [],
        )

    async def record(self, inp: NotifyInput) -> tuple[str, str]:
        """The sender run to its end on a plain worker: its id and result."""
        wid = f"notify-{uuid.uuid4().hex[:8]}"
        async with self.worker(plugin=False):
            result = await self.client.execute_workflow(
                NotifyReservationsWorkflow.run, inp, id=wid, task_queue=self.queue
            )
        return wid, result

    async def sent(self, wid: str) -> int:
        history = await self.client.get_workflow_handle(wid).fetch_history()
        return [e.event_type for e in history.events].count(SENT)


@pytest.fixture
async def send_lab(
    temporal_env: WorkflowEnvironment, services: Services, tmp_path: Path
) -> AsyncIterator[SendLab]:
    agent = agent_settings(services, tmp_path / "home")
    target = temporal_env.client.service_client.config.target_host
    settings = Settings.load({"address": target, "home": tmp_path / "home"}, env={})
    client = await connect_agents(settings, agent)
    # forks need ForkLab's search attributes, which a plugin worker would register: a
    # test that forks before any such worker ran on this server registers them itself
    await ensure_search_attributes(client)
    yield SendLab(client, agent)


async def test_a_signal_sent_inside_the_prefix_is_not_sent_again(send_lab: SendLab) -> None:
    lab = send_lab
    async with lab.worker(plugin=False):
        receiver = await lab.client.start_workflow(
            GreetingSignalsWorkflow.run, id=f"told-{uuid.uuid4().hex[:8]}", task_queue=lab.queue
        )
    wid, expected = await lab.record(NotifyInput(receiver=receiver.id, items=["a", "b"]))
    assert expected == "confirmed R-a,R-b"
    assert await lab.sent(wid) == 2
    timeline = await lab.lab.timeline(wid)
    assert [(e.kind, e.after_step) for e in timeline.events] == [
        ("signal sent", 1),
        ("signal sent", 2),
    ]
    # `forklab steps` says what reached which workflow, between the steps
    rows = [r.strip() for r in render_steps(timeline).splitlines()[1:]]
    sent_row = f"· signal 'submit_greeting' sent to {receiver.id}"
    assert [rows[1], rows[3]] == [sent_row, sent_row], rows
    async with lab.worker(plugin=True):
        for n in (1, 2, 3):
            fork = await lab.lab.fork(
                ForkRequest(run=wid, at_step=n, name=f"{wid}/at-{n}", tool_policies=LIVE)
            )
            assert fork.receipt.restorable and fork.receipt.approximations == [], n
            assert await asyncio.wait_for(fork.handle.result(), timeout=60) == expected, n
            steps = await lab.lab.steps(fork.handle.id)
            assert [s.origin for s in steps][:n] == [StepOrigin.inherited] * n, n
            assert lab.calls.of(fork.handle.id) == 3 - n, n
            # the sends before the boundary are inherited; the fork's own, after it, go out
            assert await lab.sent(fork.handle.id) == sum(after >= n for after in (1, 2)), n
        # a fork's history replays with the plugin: the inherited sends make no command
        history = await lab.client.get_workflow_handle(f"{wid}/at-3").fetch_history()
        await Replayer(
            workflows=[NotifyReservationsWorkflow],
            plugins=[ForkLabPlugin(lab.agent.run_log_path)],
            data_converter=lab.client.data_converter,
        ).replay_workflow(history)
        # a fork of that fork inherits the sends it inherited
        again = await lab.lab.fork(
            ForkRequest(run=f"{wid}/at-3", at_step=3, name=f"{wid}/at-3/at-3", tool_policies=LIVE)
        )
        assert again.receipt.restorable
        assert await asyncio.wait_for(again.handle.result(), timeout=60) == expected
        assert await lab.sent(again.handle.id) == 0 and lab.calls.of(again.handle.id) == 0
        await receiver.signal(GreetingSignalsWorkflow.exit)
        greetings = await asyncio.wait_for(receiver.result(), timeout=60)
    # the parent's two, then the live sends: both of the fork at step 1, the second item's
    # of the fork at step 2, none of the fork at step 3
    assert sorted(greetings) == sorted(
        ["Hello, R-a", "Hello, R-b", "Hello, R-a", "Hello, R-b", "Hello, R-b"]
    )


@pytest.mark.parametrize("boundary", [BoundaryMode.exact, BoundaryMode.approximate])
async def test_a_signal_that_failed_inside_the_prefix_is_refused_before_the_fork_starts(
    boundary: BoundaryMode, send_lab: SendLab
) -> None:
    lab = send_lab
    nobody = f"nobody-{uuid.uuid4().hex[:8]}"
    wid, expected = await lab.record(
        NotifyInput(receiver=nobody, items=["a"], tolerate_failure=True)
    )
    assert expected == "confirmed R-a,unsent"
    name = f"{wid}/at-2"
    with pytest.raises(ForkError) as refused:
        await lab.lab.fork(ForkRequest(run=wid, at_step=2, name=name, boundary=boundary))
    assert str(refused.value) == (
        f"cannot fork {'exactly' if boundary is BoundaryMode.exact else 'approximately'} "
        f"at step 2: signal 'submit_greeting' to {nobody}, sent after step 1, failed "
        "(external workflow execution not found), which a fork cannot be handed"
    )
    with pytest.raises(RPCError) as absent:
        await lab.client.get_workflow_handle(name).describe()
    assert absent.value.status is RPCStatusCode.NOT_FOUND
    # before the send, the fork inherits nothing of it: it starts
    fork = await lab.lab.fork(ForkRequest(run=wid, at_step=1, name=f"{wid}/at-1"))
    await fork.handle.terminate("test over")


@pytest.mark.parametrize("boundary", [BoundaryMode.exact, BoundaryMode.approximate])
async def test_a_cancel_request_inside_the_prefix_is_refused_before_the_fork_starts(
    boundary: BoundaryMode, send_lab: SendLab
) -> None:
    lab = send_lab
    async with lab.worker(plugin=False):
        receiver = await lab.client.start_workflow(
            GreetingSignalsWorkflow.run, id=f"told-{uuid.uuid4().hex[:8]}", task_queue=lab.queue
        )
        wid = f"cancels-{uuid.uuid4().hex[:8]}"
        assert (
            await lab.client.execute_workflow(
                CancelsAnotherWorkflow.run, receiver.id, id=wid, task_queue=lab.queue
            )
            == "confirmed R-a,R-b"
        )
    timeline = await lab.lab.timeline(wid)
    assert [(e.kind, e.after_step, e.child_id) for e in timeline.events] == [
        ("cancel request", 1, receiver.id)
    ]
    rows = [r.strip() for r in render_steps(timeline).splitlines()[1:]]
    assert rows[1] == f"· cancel requested of {receiver.id}", rows
    for n in (2, 3):
        name = f"{wid}/at-{n}"
        with pytest.raises(ForkError) as refused:
            await lab.lab.fork(ForkRequest(run=wid, at_step=n, name=name, boundary=boundary))
        assert str(refused.value).endswith(
            f"at step {n}: the run asked {receiver.id} to cancel after step 1, inside the "
            "prefix; a fork's code would ask it again (nothing holds such a request back): "
            "fork at step 1 or before"
        ), refused.value
        with pytest.raises(RPCError) as absent:
            await lab.client.get_workflow_handle(name).describe()
        assert absent.value.status is RPCStatusCode.NOT_FOUND
