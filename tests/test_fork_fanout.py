"""Fan-out forks exactly (issue 33, point 3).

Calls in parallel are scheduled in code order and complete in another. Steps are numbered
in completion order; a fork at step N inherits the first N calls to complete, recognised
by what they are (type, input digest, k-th such call), gets their results in the
parent's completion order, and runs live the calls the parent still had in flight. Each
workflow here is recorded on a plain worker and forked at every step on the same worker
with ``ForkLabPlugin``; an execution counter per workflow id proves no inherited call ran
again."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from agent_fixtures import Services, agent_settings
from sample_workflows import (
    ArrivalOrderWorkflow,
    BotActivities,
    Calls,
    DslActivities,
    DSLWorkflow,
    FanOutActivities,
    FanOutChangedWorkflow,
    FanOutInput,
    FanOutSkippingWorkflow,
    FanOutWorkflow,
    ResearchBotInput,
    ResearchBotWorkflow,
    dsl_parallel,
)
from temporalio.client import Client, WorkflowFailureError
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


@dataclass
class FanLab:
    client: Client
    agent: AgentSettings
    lab: AgentLab
    calls: Calls

    def plugin(self) -> ForkLabPlugin:
        return ForkLabPlugin(self.agent.run_log_path)

    async def record(self, workflow: Any, arg: Any, activities: list[object]) -> tuple[str, Any]:
        """Run ``workflow`` on a worker without the plugin; its id and result."""
        queue, wid = f"fan-{uuid.uuid4().hex[:8]}", f"fan-{uuid.uuid4().hex[:8]}"
        async with Worker(
            self.client, task_queue=queue, workflows=[workflow], activities=activities
        ):
            result = await self.client.execute_workflow(workflow.run, arg, id=wid, task_queue=queue)
        self.queue = queue
        return wid, result

    def forking_worker(self, workflow: Any, activities: list[object]) -> Worker:
        return Worker(
            self.client,
            task_queue=self.queue,
            workflows=[workflow],
            activities=activities,
            plugins=[self.plugin()],
        )

    queue: str = ""


@pytest.fixture
async def fan_lab(
    temporal_env: WorkflowEnvironment, services: Services, tmp_path: Path
) -> AsyncIterator[FanLab]:
    agent = agent_settings(services, tmp_path / "home")
    target = temporal_env.client.service_client.config.target_host
    settings = Settings.load({"address": target, "home": tmp_path / "home"}, env={})
    client = await connect_agents(settings, agent)
    yield FanLab(client, agent, AgentLab(client, agent), Calls())


async def _out_of_order(lab: FanLab, wid: str) -> int:
    """How many of the run's steps completed in another place than they were scheduled
    (the test is about fan-out only if some did)."""
    return sum(s.call != s.index for s in await lab.lab.steps(wid))


async def _fork_at_every_step(lab: FanLab, wid: str, expected: Any, first: int = 1) -> None:
    """Fork ``wid`` at each step from ``first`` on, every later call live: the result is
    the parent's, steps 1..N are inherited (none ran again) and each of the others ran
    once."""
    total = len(await lab.lab.steps(wid))
    for n in range(first, total + 1):
        fork = await lab.lab.fork(
            ForkRequest(run=wid, at_step=n, name=f"{wid}/at-{n}", tool_policies=LIVE)
        )
        assert await asyncio.wait_for(fork.handle.result(), timeout=90) == expected, n
        assert fork.receipt.restorable and fork.receipt.resolved_step == n
        steps = await lab.lab.steps(fork.handle.id)
        assert [s.origin for s in steps] == [StepOrigin.inherited] * n + [StepOrigin.own] * (
            total - n
        ), n
        assert lab.calls.of(fork.handle.id) == total - n, n


async def test_a_research_bot_forks_exactly_at_every_step(fan_lab: FanLab) -> None:
    acts = BotActivities(fan_lab.calls).all()
    wid, expected = await fan_lab.record(ResearchBotWorkflow, ResearchBotInput(query="q"), acts)
    assert len(await fan_lab.lab.steps(wid)) == 7
    assert await _out_of_order(fan_lab, wid) > 0
    async with fan_lab.forking_worker(ResearchBotWorkflow, acts):
        await _fork_at_every_step(fan_lab, wid, expected)
    assert fan_lab.calls.of(wid) == 7


async def test_inherited_results_arrive_in_the_parent_s_order(fan_lab: FanLab) -> None:
    """A workflow that keeps its findings in arrival order: a fork given the inherited
    results in any other order would write another report. Forked where at most one
    search runs live (its place among the others then does not depend on timing)."""
    acts = BotActivities(fan_lab.calls).all()
    wid, expected = await fan_lab.record(ArrivalOrderWorkflow, ResearchBotInput(query="q"), acts)
    assert expected.startswith("found: q aspect 5 | found: q aspect 4")
    async with fan_lab.forking_worker(ArrivalOrderWorkflow, acts):
        await _fork_at_every_step(fan_lab, wid, expected, first=5)


async def test_identical_sibling_calls_are_told_apart_by_their_order(fan_lab: FanLab) -> None:
    """The same search twice in one level: the k-th identical call matches the parent's
    k-th, so each fork still inherits exactly the calls completed by its step."""
    acts = BotActivities(fan_lab.calls).all()
    inp = ResearchBotInput(query="q", searches=3, repeat_first=True)
    wid, expected = await fan_lab.record(ResearchBotWorkflow, inp, acts)
    steps = await fan_lab.lab.steps(wid)
    assert len({(s.activity_type, s.input_sha256) for s in steps}) == len(steps) - 1
    async with fan_lab.forking_worker(ResearchBotWorkflow, acts):
        await _fork_at_every_step(fan_lab, wid, expected)


async def test_a_dsl_with_parallel_branches_forks_at_every_step(fan_lab: FanLab) -> None:
    """The sample's ``workflow2.yaml``: what a branch calls next depends on which of its
    calls completed, so the fork must see the inherited results in the parent's order."""
    acts = DslActivities(fan_lab.calls, delays={"activity2": 0.4, "activity4": 0.05}).all()
    wid, expected = await fan_lab.record(DSLWorkflow, dsl_parallel(), acts)
    assert await _out_of_order(fan_lab, wid) > 0
    async with fan_lab.forking_worker(DSLWorkflow, acts):
        await _fork_at_every_step(fan_lab, wid, expected)
        # a fork's history replays with the plugin
        history = await fan_lab.client.get_workflow_handle(f"{wid}/at-3").fetch_history()
        await Replayer(
            workflows=[DSLWorkflow],
            plugins=[fan_lab.plugin()],
            data_converter=fan_lab.client.data_converter,
        ).replay_workflow(history)


async def test_a_fan_out_of_eight_per_level_forks_at_every_step(fan_lab: FanLab) -> None:
    acts = FanOutActivities(fan_lab.calls).all()
    wid, expected = await fan_lab.record(FanOutWorkflow, FanOutInput(levels=3, width=8), acts)
    assert len(await fan_lab.lab.steps(wid)) == 27
    assert await _out_of_order(fan_lab, wid) > 0
    async with fan_lab.forking_worker(FanOutWorkflow, acts):
        await _fork_at_every_step(fan_lab, wid, expected)
        # a fork of a fork inside a level: inherits its parent's record, runs the rest
        first = f"{wid}/at-5"
        again = await fan_lab.lab.fork(
            ForkRequest(run=first, at_step=14, name=f"{first}/at-14", tool_policies=LIVE)
        )
        assert await asyncio.wait_for(again.handle.result(), timeout=90) == expected
        assert fan_lab.calls.of(again.handle.id) == 27 - 14
    assert fan_lab.calls.of(wid) == 27


async def test_ten_levels_of_eight_fork_exactly_at_every_level(fan_lab: FanLab) -> None:
    """Issue 33's fan-out shape: 8 calls in parallel per level, 10 levels (90 steps),
    forked once in each level, inside it (after half its branches) on odd levels and at
    its end (its merge) on even ones: every fork exact, its result the parent's, nothing
    inherited executed again."""
    acts = FanOutActivities(fan_lab.calls).all()
    wid, expected = await fan_lab.record(FanOutWorkflow, FanOutInput(levels=10, width=8), acts)
    steps = await fan_lab.lab.steps(wid)
    assert len(steps) == 90 and await _out_of_order(fan_lab, wid) > 0
    async with fan_lab.forking_worker(FanOutWorkflow, acts):
        for level in range(1, 11):
            n = 9 * level - (5 if level % 2 else 0)
            fork = await fan_lab.lab.fork(
                ForkRequest(run=wid, at_step=n, name=f"{wid}/at-{n}", tool_policies=LIVE)
            )
            assert await asyncio.wait_for(fork.handle.result(), timeout=90) == expected, n
            assert fork.receipt.restorable and fork.receipt.boundary.value == "exact"
            origins = [s.origin for s in await fan_lab.lab.steps(fork.handle.id)]
            assert origins == [StepOrigin.inherited] * n + [StepOrigin.own] * (90 - n), n
            assert fan_lab.calls.of(fork.handle.id) == 90 - n, n
    assert fan_lab.calls.of(wid) == 90


async def test_a_fork_whose_code_calls_something_else_inside_a_level_is_refused(
    fan_lab: FanLab,
) -> None:
    """A fork that makes, while inherited calls are still owed, a call the parent never
    had in flight fails as ``fork_prefix_diverged`` instead of running it live."""
    acts = FanOutActivities(fan_lab.calls).all()
    wid, _ = await fan_lab.record(FanOutWorkflow, FanOutInput(levels=2, width=4), acts)
    async with fan_lab.forking_worker(FanOutChangedWorkflow, acts):
        fork = await fan_lab.lab.fork(
            ForkRequest(run=wid, at_step=3, name=f"{wid}/changed", tool_policies=LIVE)
        )
        with pytest.raises(WorkflowFailureError) as failed:
            await asyncio.wait_for(fork.handle.result(), timeout=60)
    cause = str(failed.value.cause)
    assert ForkErrorType.prefix_diverged.value in cause or "input differs" in cause
    assert "the fork's input differs from the parent's" in cause
    assert fan_lab.calls.of(fork.handle.id) == 0


async def test_a_fork_that_never_asks_for_an_inherited_call_fails_instead_of_waiting(
    fan_lab: FanLab,
) -> None:
    """An intervention makes the fork leave out the branch that completed first on the
    parent: the other branches' inherited results would wait for it for ever. The fork
    fails at once, naming that step, and runs nothing."""
    acts = FanOutActivities(fan_lab.calls, width=4).all()
    wid, _ = await fan_lab.record(FanOutWorkflow, FanOutInput(levels=2, width=4), acts)
    first = (await fan_lab.lab.steps(wid))[0]
    assert first.call == 4  # branch 3 completed first
    async with fan_lab.forking_worker(FanOutSkippingWorkflow, acts):
        fork = await fan_lab.lab.fork(
            ForkRequest(
                run=wid,
                at_step=5,
                name=f"{wid}/skips",
                intervention={"skip_branch": 3},
                tool_policies=LIVE,
            )
        )
        with pytest.raises(WorkflowFailureError) as failed:
            await asyncio.wait_for(fork.handle.result(), timeout=60)
        # the same fork without the intervention asks for every call, and is not stopped
        same = await fan_lab.lab.fork(
            ForkRequest(run=wid, at_step=4, name=f"{wid}/same", tool_policies=LIVE)
        )
        assert await asyncio.wait_for(same.handle.result(), timeout=60) == ",".join(
            f"L1.{i}<0>" for i in range(4)
        )
    cause = str(failed.value.cause)
    assert "at step 1 (branch) the parent had made this call by now" in cause
    assert "took another path before the fork point" in cause
    assert fan_lab.calls.of(fork.handle.id) == 0


async def test_the_run_log_numbers_steps_as_forklab_steps_does(fan_lab: FanLab) -> None:
    """A worker logs a call by its place in the scheduling order (all it knows when the
    call starts); ``forklab watch`` shows the step number ``forklab steps`` gives it,
    which for calls in parallel is their place in the completion order."""
    fan_lab.queue = f"fan-{uuid.uuid4().hex[:8]}"
    wid = f"fan-{uuid.uuid4().hex[:8]}"
    acts = FanOutActivities(fan_lab.calls).all()
    async with fan_lab.forking_worker(FanOutWorkflow, acts):
        await fan_lab.client.execute_workflow(
            FanOutWorkflow.run, FanOutInput(levels=2, width=4), id=wid, task_queue=fan_lab.queue
        )
    steps = await fan_lab.lab.steps(wid)
    assert await _out_of_order(fan_lab, wid) > 0
    log = fan_lab.lab.watch(await fan_lab.lab.run_stream(wid))
    done = [e for e in await fan_lab.lab.numbered(wid, log) if e["kind"] == "step_completed"]
    assert sorted((e["step"], e["call"], e["activity"]) for e in done) == [
        (s.index, s.call, s.activity_type) for s in steps
    ]
