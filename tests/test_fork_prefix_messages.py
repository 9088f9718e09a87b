"""Signals and updates inside a fork's prefix are redelivered at the same points (issue 33,
point 4).

Workflows shaped like samples-python's ``hello_signal`` and ``hello_update`` (with an
activity per message, so messages fall between steps) are recorded on a plain worker and
forked at every step, exact, on the same worker with ``ForkLabPlugin``: each fork
inherits the messages its parent received before the boundary, so only the messages
after it are sent to the fork (as a live sender would); its result is the parent's, no
inherited activity ran again, and the parent's history is byte-identical."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from agent_fixtures import Services, agent_settings
from sample_message_workflows import (
    GreetingActivities,
    GreetingSignalsWorkflow,
    OrderUpdatesBrokenAdd,
    OrderUpdatesWithoutAdd,
    OrderUpdatesWorkflow,
)
from sample_workflows import AwaitsApprovalWorkflow, Bank, Calls, TransferDetails
from temporalio.api.common.v1 import Payload
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowFailureError, WorkflowHandle
from temporalio.common import RawValue
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Replayer, Worker

from forklab.cli.runfork.agent_lab import AgentLab
from forklab.contracts.errors import ForkErrorType
from forklab.contracts.fork_request import ForkRequest
from forklab.experiments.runfork.policy import ToolPolicy
from forklab.experiments.runfork.steps import StepOrigin
from forklab.temporal import ForkLabPlugin
from forklab.workers.config import Settings
from forklab.workers.runfork.agent_config import AgentSettings
from forklab.workers.runfork.agent_worker import connect_agents

LIVE = {"*": ToolPolicy.live}
#: an argument no payload converter reads
_UNREADABLE = Payload(metadata={"encoding": b"binary/forklab-unknown"}, data=b"\x00")


@dataclass
class MsgLab:
    client: Client
    agent: AgentSettings
    lab: AgentLab
    calls: Calls
    queue: str = ""

    def plugin(self) -> ForkLabPlugin:
        return ForkLabPlugin(self.agent.run_log_path)

    def worker(self, workflow: Any, plugin: bool) -> Worker:
        return Worker(
            self.client,
            task_queue=self.queue,
            workflows=[workflow],
            activities=GreetingActivities(self.calls).all(),
            plugins=[self.plugin()] if plugin else [],
        )

    async def record(self, workflow: Any, script: Script, prefix: str) -> tuple[str, Any]:
        """Run ``workflow`` to its end on a plain worker (no ForkLab plugin), sending the
        ``script``'s messages at their points: the parent's id and its result."""
        wid = f"{prefix}-{uuid.uuid4().hex[:8]}"
        async with self.worker(workflow, plugin=False):
            handle = await self.client.start_workflow(workflow.run, id=wid, task_queue=self.queue)
            await _drive(self, handle, script, 0)
            return wid, await handle.result()

    async def assert_ends_as_parent(self, fork: WorkflowHandle[Any, Any], expected: Any) -> None:
        """The fork ends with its parent's result, having called no activity: all inherited."""
        assert await asyncio.wait_for(fork.result(), timeout=60) == expected
        assert self.calls.of(fork.id) == 0

    async def until_steps(self, wid: str, n: int) -> None:
        for _ in range(300):
            steps = await self.lab.steps(wid)
            if sum(s.status.value == "completed" for s in steps) >= n:
                return
            await asyncio.sleep(0.05)
        raise AssertionError(f"{wid} never reached {n} steps")


@pytest.fixture
async def msg_lab(
    temporal_env: WorkflowEnvironment, services: Services, tmp_path: Path
) -> AsyncIterator[MsgLab]:
    agent = agent_settings(services, tmp_path / "home")
    target = temporal_env.client.service_client.config.target_host
    settings = Settings.load({"address": target, "home": tmp_path / "home"}, env={})
    client = await connect_agents(settings, agent)
    lab = MsgLab(client, agent, AgentLab(client, agent), Calls())
    lab.queue = f"msg-{uuid.uuid4().hex[:8]}"
    yield lab


async def _history_bytes(lab: MsgLab, wid: str) -> bytes:
    history = await lab.client.get_workflow_handle(wid).fetch_history()
    return b"".join(e.SerializeToString() for e in history.events)


async def _event_types(lab: MsgLab, wid: str) -> list[int]:
    history = await lab.client.get_workflow_handle(wid).fetch_history()
    return [e.event_type for e in history.events]


#: what a sender does to the run after it reaches each number of completed steps
Script = list[tuple[int, Callable[[WorkflowHandle[Any, Any]], Awaitable[Any]]]]


async def _drive(lab: MsgLab, handle: WorkflowHandle[Any, Any], script: Script, done: int) -> None:
    """Sends the script's messages whose point comes after ``done`` completed steps."""
    for after, send in script:
        if after < done:
            continue
        await lab.until_steps(handle.id, after)
        await send(handle)


async def _fork_at_every_step(lab: MsgLab, wid: str, script: Script, expected: Any) -> None:
    """Forks ``wid`` at each step; the messages the parent received after the boundary are
    sent to the fork (those inside it are redelivered)."""
    parent_before = await _history_bytes(lab, wid)
    parent_steps = await lab.lab.steps(wid)
    total = len(parent_steps)
    # where each message really reached the parent: a sender's point is only when it sent,
    # and on a loaded machine a message sent after step k may land after step k + 1
    recorded = [e for e in (await lab.lab.timeline(wid)).events if e.kind in ("signal", "update")]
    assert len(recorded) == len(script), [e.kind for e in recorded]
    script = [(e.after_step, send) for e, (_, send) in zip(recorded, script, strict=True)]
    for n in range(1, total + 1):
        fork = await lab.lab.fork(
            ForkRequest(run=wid, at_step=n, name=f"{wid}/at-{n}", tool_policies=LIVE)
        )
        assert fork.receipt.restorable and fork.receipt.approximations == [], n
        # the messages the parent got before step n's result reached it are inherited
        inherited = sum(e.after_step < n for e in recorded)
        live = [(after, send) for after, send in script if after >= n]
        driver = asyncio.create_task(_drive(lab, fork.handle, live, n))
        assert await asyncio.wait_for(fork.handle.result(), timeout=60) == expected, n
        await driver
        steps = await lab.lab.steps(fork.handle.id)
        assert [s.origin for s in steps][:n] == [StepOrigin.inherited] * n, n
        assert lab.calls.of(fork.handle.id) == total - n, n
        types = await _event_types(lab, fork.handle.id)
        sent = types.count(EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED) + types.count(
            EventType.EVENT_TYPE_WORKFLOW_EXECUTION_UPDATE_ACCEPTED
        )
        assert sent == len(recorded) - inherited, n  # nothing inherited was sent again
        assert inherited > 0 or n == 1, n
    assert await _history_bytes(lab, wid) == parent_before


async def test_hello_signal_forks_exactly_at_every_step(msg_lab: MsgLab) -> None:
    async def greet(name: str) -> Callable[[WorkflowHandle[Any, Any]], Awaitable[Any]]:
        return lambda h: h.signal(GreetingSignalsWorkflow.submit_greeting, name)

    script: Script = [
        (0, await greet("ana")),
        (1, await greet("bo")),
        (1, await greet("cy")),
        (3, lambda h: h.signal(GreetingSignalsWorkflow.exit)),
    ]
    wid, expected = await msg_lab.record(GreetingSignalsWorkflow, script, "greet")
    assert expected == ["Hello, ana", "Hello, bo", "Hello, cy"]
    steps = await msg_lab.lab.steps(wid)
    assert len(steps) == 3
    async with msg_lab.worker(GreetingSignalsWorkflow, plugin=True):
        await _fork_at_every_step(msg_lab, wid, script, expected)
        # a fork's history replays with the plugin, redelivering at the same points
        history = await msg_lab.client.get_workflow_handle(f"{wid}/at-3").fetch_history()
        await Replayer(
            workflows=[GreetingSignalsWorkflow],
            plugins=[msg_lab.plugin()],
            data_converter=msg_lab.client.data_converter,
        ).replay_workflow(history)
        # a fork of a fork inherits the messages its parent was redelivered
        again = await msg_lab.lab.fork(
            ForkRequest(run=f"{wid}/at-3", at_step=3, name=f"{wid}/at-3/at-3", tool_policies=LIVE)
        )
        await again.handle.signal(GreetingSignalsWorkflow.exit)
        await msg_lab.assert_ends_as_parent(again.handle, expected)
    assert msg_lab.calls.of(wid) == 3


async def test_hello_update_forks_exactly_at_every_step(msg_lab: MsgLab) -> None:
    """The handler itself calls an activity: on a fork the redelivered handler is served
    its inherited call; the callers got their answers from the parent."""
    script: Script = [
        (0, lambda h: h.execute_update(OrderUpdatesWorkflow.add_item, "a")),
        (1, lambda h: h.execute_update(OrderUpdatesWorkflow.add_item, "b")),
        (2, lambda h: h.execute_update(OrderUpdatesWorkflow.close)),
    ]
    wid, expected = await msg_lab.record(OrderUpdatesWorkflow, script, "order")
    assert expected == "confirmed R-a,R-b"
    async with msg_lab.worker(OrderUpdatesWorkflow, plugin=True):
        await _fork_at_every_step(msg_lab, wid, script, expected)


async def test_stray_and_malformed_signals_are_handled_as_the_parent_handled_them(
    msg_lab: MsgLab,
) -> None:
    """Anyone may signal a run: a signal no handler takes (buffered by the SDK) and one
    whose argument does not decode (dropped by the SDK) inside the prefix reach the fork
    the same way; the fork completes as its parent did, and the worker goes on."""
    script: Script = [
        (0, lambda h: h.signal("no_such_handler", {"x": 1})),
        (0, lambda h: h.signal(GreetingSignalsWorkflow.submit_greeting, "ana")),
        (1, lambda h: h.signal("submit_greeting", RawValue(_UNREADABLE))),
        (1, lambda h: h.signal(GreetingSignalsWorkflow.submit_greeting, "bo")),
        (2, lambda h: h.signal(GreetingSignalsWorkflow.exit)),
    ]
    wid, expected = await msg_lab.record(GreetingSignalsWorkflow, script, "stray")
    assert expected == ["Hello, ana", "Hello, bo"]
    async with msg_lab.worker(GreetingSignalsWorkflow, plugin=True):
        fork = await msg_lab.lab.fork(
            ForkRequest(run=wid, at_step=2, name=f"{wid}/at-2", tool_policies=LIVE)
        )
        await fork.handle.signal(GreetingSignalsWorkflow.exit)
        await msg_lab.assert_ends_as_parent(fork.handle, expected)


@pytest.mark.parametrize(
    ("changed", "says"),
    [
        (OrderUpdatesWithoutAdd, "no update handler of that name"),
        (OrderUpdatesBrokenAdd, "its handler raised RuntimeError"),
    ],
)
async def test_an_update_the_fork_cannot_hand_over_fails_the_fork(
    msg_lab: MsgLab, changed: Any, says: str
) -> None:
    """The parent accepted ``add_item``; a fork whose code lost that handler, or whose
    handler raises something that is no workflow failure, fails at once, naming the update
    and the step, instead of failing its workflow task for ever."""
    script: Script = [
        (0, lambda h: h.execute_update(OrderUpdatesWorkflow.add_item, "a")),
        (0, lambda h: h.execute_update(OrderUpdatesWorkflow.close)),
    ]
    wid, _ = await msg_lab.record(OrderUpdatesWorkflow, script, "order")
    async with msg_lab.worker(changed, plugin=True):
        fork = await msg_lab.lab.fork(
            ForkRequest(run=wid, at_step=2, name=f"{wid}/changed", tool_policies=LIVE)
        )
        with pytest.raises(WorkflowFailureError) as failed:
            await asyncio.wait_for(fork.handle.result(), timeout=60)
    cause = str(failed.value.cause)
    assert "update 'add_item' (after step 0) cannot be redelivered" in cause, cause
    assert says in cause
    assert failed.value.cause.type == ForkErrorType.prefix_diverged  # type: ignore[attr-defined]
    assert msg_lab.calls.of(fork.handle.id) == 0


async def test_a_transfer_approved_inside_the_prefix_forks_exactly(msg_lab: MsgLab) -> None:
    """The money-transfer shape that waits for an ``approve`` signal between its withdrawal
    and its deposit: a fork at the deposit inherits the approval, and nothing runs again."""
    details = TransferDetails(source="a", target="b", amount=5, reference="t1")
    wid = f"approve-{uuid.uuid4().hex[:8]}"
    bank = Bank(msg_lab.calls)
    worker = dict(
        task_queue=msg_lab.queue,
        workflows=[AwaitsApprovalWorkflow],
        activities=[bank.withdraw, bank.deposit, bank.refund],
    )
    async with Worker(msg_lab.client, **worker):  # type: ignore[arg-type]
        handle = await msg_lab.client.start_workflow(
            AwaitsApprovalWorkflow.run, details, id=wid, task_queue=msg_lab.queue
        )
        await msg_lab.until_steps(wid, 1)
        await handle.signal(AwaitsApprovalWorkflow.approve)
        expected = await handle.result()
    plugin = [msg_lab.plugin()]
    async with Worker(msg_lab.client, **worker, plugins=plugin):  # type: ignore[arg-type]
        fork = await msg_lab.lab.fork(ForkRequest(run=wid, at_step=2, name=f"{wid}/at-2"))
        assert fork.receipt.restorable
        await msg_lab.assert_ends_as_parent(fork.handle, expected)
