"""Timers and child workflows inside a fork's prefix are inherited, not run again (issue
33, point 4).

Workflows shaped like samples-python's ``sleep_for_days`` (a sleep between mails, in the
three shapes a workflow waits: ``workflow.sleep``, ``asyncio.sleep``, a timed-out
``wait_condition``) and ``hello_child_workflow`` (one child completes, one fails) are
recorded on a plain worker and forked at every step, exact: no inherited timer is started
again (the fork's history has a ``TimerStarted`` only for the parent's timers after the
boundary), no inherited child is started again, no inherited activity runs again, the
result is the parent's, the parent's history is byte-identical. A child still running at
the boundary is refused before the fork starts, naming it."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from agent_fixtures import Services, agent_settings
from sample_message_workflows import (
    ComposeGreetingChild,
    GreetingActivities,
    GreetingParentWorkflow,
    SideEffectsWorkflow,
    SleepForDaysWorkflow,
    SleepInput,
    SlowChildParentWorkflow,
)
from sample_workflows import Calls
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client
from temporalio.service import RPCError
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Replayer, Worker

from forklab.activities.runfork.fork_start import ForkError
from forklab.cli.runfork.agent_lab import AgentLab
from forklab.contracts.fork_request import ForkRequest
from forklab.experiments.runfork.policy import ToolPolicy
from forklab.experiments.runfork.steps import StepOrigin
from forklab.temporal import ForkLabPlugin
from forklab.workers.config import Settings
from forklab.workers.runfork.agent_config import AgentSettings
from forklab.workers.runfork.agent_worker import connect_agents

LIVE = {"*": ToolPolicy.live}
WORKFLOWS = [
    SleepForDaysWorkflow,
    ComposeGreetingChild,
    GreetingParentWorkflow,
    SlowChildParentWorkflow,
    SideEffectsWorkflow,
]


class WaitLab:
    def __init__(self, client: Client, agent: AgentSettings) -> None:
        self.client = client
        self.agent = agent
        self.lab = AgentLab(client, agent)
        self.calls = Calls()
        self.queue = f"wait-{uuid.uuid4().hex[:8]}"

    def worker(self, plugin: bool) -> Worker:
        return Worker(
            self.client,
            task_queue=self.queue,
            workflows=WORKFLOWS,
            activities=GreetingActivities(self.calls).all(),
            plugins=[ForkLabPlugin(self.agent.run_log_path)] if plugin else [],
        )

    async def history(self, wid: str) -> Any:
        return await self.client.get_workflow_handle(wid).fetch_history()

    async def count(self, wid: str, event: int) -> int:
        return sum(e.event_type == event for e in (await self.history(wid)).events)


@pytest.fixture
async def wait_lab(
    temporal_env: WorkflowEnvironment, services: Services, tmp_path: Path
) -> AsyncIterator[WaitLab]:
    agent = agent_settings(services, tmp_path / "home")
    target = temporal_env.client.service_client.config.target_host
    settings = Settings.load({"address": target, "home": tmp_path / "home"}, env={})
    yield WaitLab(await connect_agents(settings, agent), agent)


TIMER_STARTED = EventType.EVENT_TYPE_TIMER_STARTED
CHILD_STARTED = EventType.EVENT_TYPE_START_CHILD_WORKFLOW_EXECUTION_INITIATED


async def _record(wl: WaitLab, workflow: Any, arg: Any) -> tuple[str, Any]:
    wid = f"{workflow.__name__[:12].lower()}-{uuid.uuid4().hex[:8]}"
    async with wl.worker(plugin=False):
        args = [] if arg is None else [arg]
        result = await wl.client.execute_workflow(
            workflow.run, args=args, id=wid, task_queue=wl.queue
        )
    return wid, result


async def test_timers_in_the_prefix_are_inherited_in_every_shape(wait_lab: WaitLab) -> None:
    wid, expected = await _record(wait_lab, SleepForDaysWorkflow, SleepInput(rounds=4))
    assert expected == [
        "Hello, mail 0",
        "Hello, mail 1",
        "Hello, mail 2",
        "timed out",
        "Hello, mail 3",
    ]
    parent = await wait_lab.history(wid)
    timers = await wait_lab.count(wid, TIMER_STARTED)
    assert timers == 4
    async with wait_lab.worker(plugin=True):
        for n in range(1, 5):
            fork = await wait_lab.lab.fork(
                ForkRequest(run=wid, at_step=n, name=f"{wid}/at-{n}", tool_policies=LIVE)
            )
            assert fork.receipt.restorable and fork.receipt.approximations == [], n
            assert await asyncio.wait_for(fork.handle.result(), timeout=60) == expected, n
            # the timers that fired after steps 1..n-1 are inherited; the rest run
            assert await wait_lab.count(fork.handle.id, TIMER_STARTED) == timers - (n - 1), n
            assert wait_lab.calls.of(fork.handle.id) == 4 - n, n
            steps = await wait_lab.lab.steps(fork.handle.id)
            assert [s.origin for s in steps][:n] == [StepOrigin.inherited] * n
        await Replayer(
            workflows=WORKFLOWS,
            plugins=[ForkLabPlugin(wait_lab.agent.run_log_path)],
            data_converter=wait_lab.client.data_converter,
        ).replay_workflow(await wait_lab.history(f"{wid}/at-4"))
        # a fork of a fork inherits the timers its parent was served
        again = await wait_lab.lab.fork(
            ForkRequest(run=f"{wid}/at-4", at_step=4, name=f"{wid}/again", tool_policies=LIVE)
        )
        assert await asyncio.wait_for(again.handle.result(), timeout=60) == expected
        assert await wait_lab.count(again.handle.id, TIMER_STARTED) == 1
    assert (await wait_lab.history(wid)).events == parent.events


async def test_children_in_the_prefix_are_inherited_with_their_outcome(wait_lab: WaitLab) -> None:
    wid, expected = await _record(wait_lab, GreetingParentWorkflow, "ana")
    assert expected[:3] == ["R-ana", "Hello, ana", "R-Hello, ana"]
    assert expected[3] == "child failed: ChildRefused: the child refused"
    parent = await wait_lab.history(wid)
    steps = await wait_lab.lab.steps(wid)
    assert len(steps) == 3  # the children's own activity is theirs
    async with wait_lab.worker(plugin=True):
        for n, children in ((1, 2), (2, 1), (3, 0)):
            fork = await wait_lab.lab.fork(
                ForkRequest(run=wid, at_step=n, name=f"{wid}/at-{n}", tool_policies=LIVE)
            )
            assert fork.receipt.restorable, n
            assert await asyncio.wait_for(fork.handle.result(), timeout=60) == expected, n
            assert await wait_lab.count(fork.handle.id, CHILD_STARTED) == children, n
            assert wait_lab.calls.of(fork.handle.id) == 3 - n, n
            # the inherited child ran nothing: no activity under the fork's child id
            assert wait_lab.calls.of(f"{fork.handle.id}-child-1") == (1 if n == 1 else 0), n
        await Replayer(
            workflows=WORKFLOWS,
            plugins=[ForkLabPlugin(wait_lab.agent.run_log_path)],
            data_converter=wait_lab.client.data_converter,
        ).replay_workflow(await wait_lab.history(f"{wid}/at-3"))
        # a fork inside a child is a fork of the child's own run (its own workflow id)
        child = await wait_lab.lab.fork(
            ForkRequest(run=f"{wid}-child-1", at_step=1, name=f"{wid}/child-at-1")
        )
        assert await asyncio.wait_for(child.handle.result(), timeout=60) == "Hello, ana"
        assert wait_lab.calls.of(child.handle.id) == 0
    assert (await wait_lab.history(wid)).events == parent.events


async def test_a_child_running_at_the_boundary_is_refused_before_the_fork_starts(
    wait_lab: WaitLab,
) -> None:
    wid, _ = await _record(wait_lab, SlowChildParentWorkflow, "ana")
    with pytest.raises(ForkError) as refused:
        await wait_lab.lab.fork(ForkRequest(run=wid, at_step=2, name=f"{wid}/at-2"))
    text = str(refused.value)
    assert "cannot fork exactly at step 2" in text
    child = f"child workflow SleepForDays ({wid}-slow)"
    assert f"{child}, started after step 1, is still running at step 2" in text
    with pytest.raises(RPCError):  # nothing started under the fork's name
        await wait_lab.client.get_workflow_handle(f"{wid}/at-2").describe()


async def test_uuid4_random_and_now_in_the_prefix_resolve_as_the_parent_s(
    wait_lab: WaitLab,
) -> None:
    """Each step's input is an id, a random number or the time: an exact fork at every
    step asks each inherited call with the parent's input (else it would diverge), and
    the id drawn after the boundary continues the parent's random stream."""
    wid, expected = await _record(wait_lab, SideEffectsWorkflow, None)
    async with wait_lab.worker(plugin=True):
        for n in (1, 2, 3):
            fork = await wait_lab.lab.fork(
                ForkRequest(run=wid, at_step=n, name=f"{wid}/at-{n}", tool_policies=LIVE)
            )
            assert await asyncio.wait_for(fork.handle.result(), timeout=60) == expected, n
            assert wait_lab.calls.of(fork.handle.id) == 3 - n, n
        await Replayer(
            workflows=WORKFLOWS,
            plugins=[ForkLabPlugin(wait_lab.agent.run_log_path)],
            data_converter=wait_lab.client.data_converter,
        ).replay_workflow(await wait_lab.history(f"{wid}/at-3"))
        # a fork of a fork draws the first parent's stream too
        again = await wait_lab.lab.fork(
            ForkRequest(run=f"{wid}/at-2", at_step=3, name=f"{wid}/again", tool_policies=LIVE)
        )
        assert await asyncio.wait_for(again.handle.result(), timeout=60) == expected
