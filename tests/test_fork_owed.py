"""A fork that never takes what its prefix owes it fails, naming it, instead of waiting
for ever (issue 33, point 4).

The parent reserved, slept, ran a child, got a signal, reserved again. Forks at step 2
(the second reservation) whose intervention leaves one of those out, as a changed build
or another code path would: each fails promptly as ``fork_prefix_diverged``, naming what
it owed (the timer, the child, the signal, the call) and the step it came after, and
runs nothing live: no activity, no child, no timer."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from agent_fixtures import Services, agent_settings
from owed_workflows import OtherChild, OwesWithoutSleepWorkflow, OwesWorkflow
from sample_message_workflows import ComposeGreetingChild, GreetingActivities
from sample_workflows import Calls
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowFailureError
from temporalio.exceptions import ApplicationError
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from forklab.activities.runfork.fork_builds import polling_builds
from forklab.cli.runfork.agent_lab import AgentLab
from forklab.contracts.errors import ForkErrorType
from forklab.contracts.fork_request import ForkRequest
from forklab.experiments.runfork.policy import ToolPolicy
from forklab.experiments.runfork.receipt import BoundaryMode
from forklab.temporal import ForkLabPlugin
from forklab.workers.config import Settings
from forklab.workers.runfork.agent_worker import connect_agents

LIVE = {"*": ToolPolicy.live}
#: what a fork that runs something of its own would have in its history
LIVE_EVENTS = {
    EventType.EVENT_TYPE_TIMER_STARTED,
    EventType.EVENT_TYPE_START_CHILD_WORKFLOW_EXECUTION_INITIATED,
}


class OwedLab:
    def __init__(self, client: Client, agent: object) -> None:
        self.client = client
        self.lab = AgentLab(client, agent)  # type: ignore[arg-type]
        self.run_log = agent.run_log_path  # type: ignore[attr-defined]
        self.calls = Calls()
        self.queue = f"owed-{uuid.uuid4().hex[:8]}"

    def worker(self, plugin: bool, owes: Any = OwesWorkflow, build_id: str = "build-1") -> Worker:
        return Worker(
            self.client,
            task_queue=self.queue,
            workflows=[owes, ComposeGreetingChild, OtherChild],
            activities=GreetingActivities(self.calls).all(),
            plugins=[ForkLabPlugin(self.run_log)] if plugin else [],
            build_id=build_id,
        )


@pytest.fixture
async def owed_lab(
    temporal_env: WorkflowEnvironment, services: Services, tmp_path: Path
) -> AsyncIterator[OwedLab]:
    agent = agent_settings(services, tmp_path / "home")
    target = temporal_env.client.service_client.config.target_host
    settings = Settings.load({"address": target, "home": tmp_path / "home"}, env={})
    yield OwedLab(await connect_agents(settings, agent), agent)


async def _record(ol: OwedLab) -> tuple[str, str]:
    """The parent, on a plain worker; ``approve`` is sent once its child has closed."""
    wid = f"owes-{uuid.uuid4().hex[:8]}"
    async with ol.worker(plugin=False):
        handle = await ol.client.start_workflow(OwesWorkflow.run, id=wid, task_queue=ol.queue)
        closed = EventType.EVENT_TYPE_CHILD_WORKFLOW_EXECUTION_COMPLETED
        for _ in range(600):
            if any(e.event_type == closed for e in (await handle.fetch_history()).events):
                break
            await asyncio.sleep(0.05)
        await handle.signal(OwesWorkflow.approve)
        return wid, await handle.result()


async def _fails(
    ol: OwedLab, wid: str, skip: str, boundary: BoundaryMode, allow_build_change: bool = False
) -> str:
    fork = await ol.lab.fork(
        ForkRequest(
            run=wid,
            at_step=2,
            name=f"{wid}/skip-{skip}",
            boundary=boundary,
            intervention={"skip": skip},
            tool_policies=LIVE,
            allow_build_change=allow_build_change,
        )
    )
    with pytest.raises(WorkflowFailureError) as failed:
        await asyncio.wait_for(fork.handle.result(), timeout=60)
    cause = failed.value.cause
    assert isinstance(cause, ApplicationError), cause
    assert cause.type == ForkErrorType.prefix_diverged, cause
    assert ol.calls.of(fork.handle.id) == 0, skip  # no inherited call ran live
    events = (await fork.handle.fetch_history()).events
    assert not [e for e in events if e.event_type in LIVE_EVENTS], skip
    return cause.message


async def test_a_fork_that_never_takes_what_it_owes_fails_naming_it(owed_lab: OwedLab) -> None:
    wid, expected = await _record(owed_lab)
    assert expected == "confirmed R-a,R-b,Hello, kid"
    exact = BoundaryMode.exact
    async with owed_lab.worker(plugin=True):
        # the same fork taking everything it owes reaches the parent's result
        same = await owed_lab.lab.fork(
            ForkRequest(run=wid, at_step=2, name=f"{wid}/same", tool_policies=LIVE)
        )
        assert await asyncio.wait_for(same.handle.result(), timeout=60) == expected
        assert await _fails(owed_lab, wid, "timer", exact) == (
            "after step 1 the parent's timer of 0.2s fired, and the fork started no timer of "
            "that duration and has nothing left to wait for without it: its code took "
            "another path before the fork point"
        )
        assert await _fails(owed_lab, wid, "child", exact) == (
            f"after step 1 the parent's child workflow ComposeGreetingChild ({wid}-kid) closed, "
            "and the fork did not start its child #1 of that type and has nothing left to "
            "wait for without it: its code took another path before the fork point"
        )
        # another child in its place is not started at all: it would run live
        assert await _fails(owed_lab, wid, "other-child", exact) == (
            f"the fork starts child workflow OtherChild ({wid}/skip-other-child-other), which "
            "the parent had not started by then: its code took another path before the fork "
            "point"
        )
        assert await _fails(owed_lab, wid, "signal", exact) == (
            "the fork ended before the parent's signal 'approve' (after step 1) was handed "
            "over to it: its code took another path before the fork point"
        )
        # approximate boundaries are watched too: before, this fork waited for ever
        assert await _fails(owed_lab, wid, "call", BoundaryMode.approximate) == (
            "at step 2 (reserve) the parent had made this call by now and the fork has "
            "nothing left to wait for without it: its code took another path before the "
            "fork point"
        )


async def test_a_changed_build_that_no_longer_starts_an_inherited_timer_fails(
    owed_lab: OwedLab,
) -> None:
    """``--allow-build-change`` lets a fork on another build match its calls by type; a
    build that no longer sleeps owes the parent's timer fire, and fails naming it and the
    builds instead of waiting."""
    wid, _ = await _record(owed_lab)
    async with owed_lab.worker(plugin=True, owes=OwesWithoutSleepWorkflow, build_id="build-2"):
        for _ in range(100):  # the server lists a poller once its first poll arrives
            if await polling_builds(owed_lab.client, f"{owed_lab.queue}@forklab"):
                break
            await asyncio.sleep(0.05)
        said = await _fails(owed_lab, wid, "nothing", BoundaryMode.exact, allow_build_change=True)
    assert said == (
        "after step 1 the parent's timer of 0.2s fired, and the fork started no timer of that "
        "duration and has nothing left to wait for without it: its code took another path "
        "before the fork point; the fork runs build build-2 and the parent's prefix was "
        "recorded by build-1: its workflow code changed"
    )
