"""Input drift and changed builds, seen before any live step (issue 33, points 4 and 7).

An exact fork whose inherited call asks with another input than the parent's (a value
derived from the workflow id) fails before any live step, and ``forklab fork`` says so with
one sentence and a non-zero exit; an approximate one is served the parent's result and
says, approximately, which calls drifted. The receipt names the build that recorded the
parent; a fork on another build whose replayed prefix notices the change fails naming both
builds, unless ``--allow-build-change``."""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from agent_fixtures import Services, agent_settings
from helpers import forklab_in_process as forklab
from sample_message_workflows import (
    GreetingActivities,
    IdDerivedWorkflow,
    ReserveTwiceChanged,
    ReserveTwiceWorkflow,
)
from sample_workflows import Calls
from temporalio.client import Client
from temporalio.service import RPCError
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from forklab.activities.runfork.fork_builds import polling_builds
from forklab.activities.runfork.fork_start import ForkError
from forklab.cli.runfork.agent_lab import AgentLab
from forklab.cli.runfork.fork_commands import render_trail
from forklab.contracts.fork_request import ForkRequest
from forklab.experiments.runfork.approximations import ApproximationKind
from forklab.experiments.runfork.policy import ToolPolicy
from forklab.experiments.runfork.receipt import INPUT_DRIFT, BoundaryMode
from forklab.temporal import ForkLabPlugin
from forklab.workers.config import ENV, Settings
from forklab.workers.runfork.agent_config import AgentSettings
from forklab.workers.runfork.agent_worker import connect_agents

LIVE = {"*": ToolPolicy.live}


class DriftLab:
    def __init__(self, client: Client, agent: AgentSettings) -> None:
        self.client = client
        self.agent = agent
        self.lab = AgentLab(client, agent)
        self.calls = Calls()
        self.queue = f"drift-{uuid.uuid4().hex[:8]}"

    def worker(self, workflow: Any, plugin: bool, build_id: str) -> Worker:
        return Worker(
            self.client,
            task_queue=self.queue,
            workflows=[workflow],
            activities=GreetingActivities(self.calls).all(),
            plugins=[ForkLabPlugin(self.agent.run_log_path)] if plugin else [],
            build_id=build_id,
        )

    async def record(self, workflow: Any) -> tuple[str, Any]:
        wid = f"drift-{uuid.uuid4().hex[:8]}"
        async with self.worker(workflow, plugin=False, build_id="build-1"):
            result = await self.client.execute_workflow(workflow.run, id=wid, task_queue=self.queue)
        return wid, result

    def env(self) -> dict[str, str]:
        a = self.agent
        return {
            **os.environ,
            ENV["address"]: self.client.service_client.config.target_host,
            ENV["home"]: str(a.home),
            "FORKLAB_MODEL_BASE_URL": a.model_base_url,
            "FORKLAB_EFFECTS_URL": a.effects_url,
            "FORKLAB_AGENT_TASK_QUEUE": a.agent_task_queue,
        }


@pytest.fixture
async def drift_lab(
    temporal_env: WorkflowEnvironment, services: Services, tmp_path: Path
) -> AsyncIterator[DriftLab]:
    agent = agent_settings(services, tmp_path / "home")
    target = temporal_env.client.service_client.config.target_host
    settings = Settings.load({"address": target, "home": tmp_path / "home"}, env={})
    yield DriftLab(await connect_agents(settings, agent), agent)


async def test_input_drift_fails_an_exact_fork_at_once_and_is_recorded_approximately(
    drift_lab: DriftLab,
) -> None:
    wid, expected = await drift_lab.record(IdDerivedWorkflow)
    async with drift_lab.worker(IdDerivedWorkflow, plugin=True, build_id="build-1"):
        out = await asyncio.to_thread(
            forklab, drift_lab.env(), "fork", wid, "--at-step", "1", "--name", f"{wid}/exact"
        )
        assert out.returncode == 2, (out.stdout, out.stderr)
        said = out.stderr.strip().splitlines()
        assert len(said) == 1, said
        # refused before it starts, naming the step
        assert said[0].startswith(
            f"forklab: error: cannot fork exactly at step 1: step 1: reserve asks with the "
            f"parent's workflow id {wid!r} in its input"
        ), said
        assert "--boundary approximate" in said[0]
        with pytest.raises(RPCError):  # no workflow was started
            await drift_lab.client.get_workflow_handle(f"{wid}/exact").describe()
        assert drift_lab.calls.of(f"{wid}/exact") == 0  # nothing ran live

        fork = await drift_lab.lab.fork(
            ForkRequest(
                run=wid,
                at_step=1,
                name=f"{wid}/approx",
                boundary=BoundaryMode.approximate,
                tool_policies=LIVE,
            )
        )
        parent_step = (await drift_lab.lab.steps(wid))[0]
        assert not fork.receipt.restorable and INPUT_DRIFT in fork.receipt.why
        [approx] = fork.receipt.approximations
        assert (approx.kind, approx.step) == (ApproximationKind.input_drift, 1)
        assert approx.parent_input_sha256 == parent_step.input_sha256
        assert approx.fork_input_sha256 not in (None, parent_step.input_sha256)
        point = await drift_lab.lab.fork_point(fork)
        assert point is not None and point.reached
        assert point.drift == [
            "step 1 (reserve) was served the parent's result although the fork's input "
            "differs from the parent's"
        ]
        assert await fork.handle.result() == expected
        assert drift_lab.calls.of(fork.handle.id) == 1  # only the confirmation ran
        # the fork recorded the drift in its own history as it ran: both digests, the
        # fork's as predicted before it started; the receipt is unchanged
        trail = await drift_lab.lab.trail(fork.handle.id)
        assert trail["drift"] == [
            {
                "kind": "input_drift",
                "step": 1,
                "detail": "reserve was served the parent's result although the fork's input "
                "differs from the parent's",
                "parent_input_sha256": parent_step.input_sha256,
                "fork_input_sha256": approx.fork_input_sha256,
            }
        ]
        assert trail["receipts"][-1] == fork.receipt.model_dump(mode="json")
        assert trail["build_ran"] == "build-1"
        shown = render_trail(trail)
        assert f"approximately: step 1: reserve asks with the parent's workflow id {wid!r}" in shown
        assert "input drift the fork recorded as it ran:" in shown
        assert "step 1: reserve was served the parent's result" in shown
        assert "build: predicted build-1, ran build-1" in shown

        out = await asyncio.to_thread(
            forklab, drift_lab.env(), "fork", wid, "--at-step", "1", "--name", f"{wid}/cli",
            "--boundary", "approximate",
        )  # fmt: skip
        assert out.returncode == 0, out.stderr
        assert "approximately: step 1 (reserve) was served the parent's result" in out.stderr
        # what was known before it started, from the receipt
        assert (
            f"approximately: step 1: reserve asks with the parent's workflow id {wid!r}"
            in out.stderr
        )
        assert "recorded by build-1; the fork runs on build-1" in out.stderr
    # approximate messages say so
    with pytest.raises(ForkError, match="cannot fork approximately at step 9"):
        await drift_lab.lab.fork(ForkRequest(run=wid, at_step=9, boundary=BoundaryMode.approximate))


async def test_a_changed_build_the_prefix_notices_fails_unless_allowed(
    drift_lab: DriftLab,
) -> None:
    wid, expected = await drift_lab.record(ReserveTwiceWorkflow)
    # another build with the same code: the prefix notices nothing
    async with drift_lab.worker(ReserveTwiceWorkflow, plugin=True, build_id="build-2"):
        for _ in range(100):  # the server lists a poller once its first poll arrives
            if await polling_builds(drift_lab.client, f"{drift_lab.queue}@forklab"):
                break
            await asyncio.sleep(0.05)
        same = await drift_lab.lab.fork(
            ForkRequest(run=wid, at_step=2, name=f"{wid}/same", tool_policies=LIVE)
        )
        assert same.receipt.parent_build == "build-1" and not same.receipt.allow_build_change
        assert same.receipt.fork_build == "build-2"  # the workers polling the fork queue
        point = await drift_lab.lab.fork_point(same)
        assert point is not None and point.build == "build-2" and point.drift == []
        assert await same.handle.result() == expected
    async with drift_lab.worker(ReserveTwiceChanged, plugin=True, build_id="build-2"):
        changed = await drift_lab.lab.fork(
            ForkRequest(run=wid, at_step=2, name=f"{wid}/changed", tool_policies=LIVE)
        )
        with pytest.raises(ForkError) as refused:
            await drift_lab.lab.fork_point(changed)
        text = str(refused.value)
        assert "at step 1 (reserve) the fork's input differs from the parent's" in text
        assert "the fork runs build build-2 and the parent's prefix was recorded by build-1" in text
        assert "--allow-build-change" in text
        assert drift_lab.calls.of(changed.handle.id) == 0
        allowed = await drift_lab.lab.fork(
            ForkRequest(
                run=wid,
                at_step=2,
                name=f"{wid}/allowed",
                tool_policies=LIVE,
                allow_build_change=True,
            )
        )
        assert allowed.receipt.allow_build_change
        point = await drift_lab.lab.fork_point(allowed)
        assert point is not None and point.drift == [
            "step 1 (reserve) was served the parent's result although the fork's input "
            "differs from the parent's"
        ]
        assert await allowed.handle.result() == expected
        assert drift_lab.calls.of(allowed.handle.id) == 1
    # build-2 has stopped (the server still lists it polling): a fork started now expects
    # build-2, and build-3 picks it up (a rolling deploy); the receipt keeps its
    # prediction, the trail says which build ran it
    late = await drift_lab.lab.fork(
        ForkRequest(run=wid, at_step=2, name=f"{wid}/late", tool_policies=LIVE)
    )
    assert late.receipt.fork_build == "build-2"
    async with drift_lab.worker(ReserveTwiceWorkflow, plugin=True, build_id="build-3"):
        await drift_lab.lab.fork_point(late)
        trail = await drift_lab.lab.trail(late.handle.id)
        assert trail["build_ran"] == "build-3"
        assert trail["receipts"][-1]["fork_build"] == "build-2"
        assert await late.handle.result() == expected
