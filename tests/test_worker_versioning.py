"""Rolling upgrades: with a deployment name, each experiment or agent run stays on the
build of the workers it started on, while new runs go to the newest build.

On the real dev server: real ``forklab worker`` processes of three builds share one task
queue and the operator uses the real CLI; agent-run workers of two builds run in-process.
"""

from __future__ import annotations

import asyncio
import os
import uuid
from pathlib import Path
from subprocess import Popen
from typing import Any

import pytest
from agent_fixtures import AgentTestLab, Services, agent_settings
from helpers import forklab_in_process as forklab
from orchestration_lab import Lab, WorkerProcesses, cli_env, lab_settings, make_spec
from temporalio import activity
from temporalio.api.workflowservice.v1 import DescribeWorkerDeploymentRequest
from temporalio.client import Client, WorkflowFailureError, WorkflowHandle
from temporalio.common import WorkerDeploymentVersion
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from forklab.cli.runfork.agent_lab import AgentLab
from forklab.contracts.fork_request import ForkRequest
from forklab.temporal import ensure_search_attributes
from forklab.workers.config import ConfigError, Settings
from forklab.workers.runfork.agent_worker import (
    agents_plugin,
    build_agent_worker,
)
from forklab.workers.versioning import (
    AGENTS,
    code_build_id,
    deployment_config,
    promote_if_newest,
    worker_version,
)
from forklab.workflows.experiment.messages import ExperimentResult, Stage, Status, workflow_id


def test_the_build_id_is_a_digest_of_the_code(tmp_path: Path) -> None:
    root = tmp_path / "workflows"
    (root / "sub").mkdir(parents=True)
    (root / "a.py").write_text("A = 1\n")
    (root / "sub" / "b.py").write_text("B = 2\n")
    first = code_build_id([root])
    assert first.startswith("fl-") and len(first) == 3 + 16
    assert code_build_id([root]) == first
    (root / "notes.txt").write_text("not code")
    assert code_build_id([root]) == first  # only the source counts
    (root / "sub" / "b.py").write_text("B = 3\n")
    changed = code_build_id([root])
    assert changed != first
    (root / "sub" / "b.py").rename(root / "b.py")
    assert code_build_id([root]) != changed  # a moved module is another build
    assert code_build_id() == code_build_id()  # ForkLab's own packages
    assert code_build_id() != code_build_id([root])


def test_bad_deployment_settings_are_refused_by_name(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="FORKLAB_DEPLOYMENT"):
        Settings.load(env={"FORKLAB_DEPLOYMENT": "for.klab"})
    with pytest.raises(ConfigError, match="FORKLAB_BUILD_ID"):
        Settings.load(env={"FORKLAB_DEPLOYMENT": "forklab", "FORKLAB_BUILD_ID": "a/b"})
    with pytest.raises(ConfigError, match="needs a deployment name"):
        Settings.load(env={"FORKLAB_BUILD_ID": "1.4.0"})
    with pytest.raises(ConfigError, match="FORKLAB_PROMOTE"):
        Settings.load(env={"FORKLAB_DEPLOYMENT": "forklab", "FORKLAB_PROMOTE": "maybe"})
    ok = Settings.load(env={"FORKLAB_DEPLOYMENT": "forklab", "FORKLAB_BUILD_ID": "1.4.0+abc"})
    assert (ok.deployment, ok.build_id, ok.promote) == ("forklab", "1.4.0+abc", True)
    env = {**os.environ, "FORKLAB_HOME": str(tmp_path / "home")}
    bad = forklab(env, "worker", "--deployment", "has space")
    assert bad.returncode == 2
    assert "setting deployment (flag --deployment or FORKLAB_DEPLOYMENT)" in bad.stderr
    assert not (tmp_path / "home" / "sandboxes").exists()  # refused before it built anything
    # the worker's other flag goes through the same checks
    bad = forklab(env, "worker", "--max-sandboxes", "0")
    assert bad.returncode == 2
    assert "setting max_sandboxes (flag --max-sandboxes or FORKLAB_MAX_SANDBOXES)" in bad.stderr


async def _current(client: Client, deployment: str) -> str:
    described = await client.workflow_service.describe_worker_deployment(
        DescribeWorkerDeploymentRequest(namespace=client.namespace, deployment_name=deployment)
    )
    return described.worker_deployment_info.routing_config.current_deployment_version.build_id


async def _log_says(log: Path, text: str) -> None:
    for _ in range(400):
        if log.exists() and text in log.read_text():
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"{log.name} never said {text!r}:\n{log.read_text()}")


async def _pinned_build(handle: WorkflowHandle[Any, Any]) -> str:
    info = (await handle.describe()).raw_description.workflow_execution_info
    return info.versioning_info.deployment_version.build_id


async def _task_identities(handle: WorkflowHandle[Any, Any]) -> set[str]:
    """The identities of the workers that started the run's workflow and activity tasks."""
    who = set()
    for event in (await handle.fetch_history()).events:
        for field in (
            "workflow_task_started_event_attributes",
            "activity_task_started_event_attributes",
        ):
            if event.HasField(field):
                who.add(getattr(event, field).identity)
    return who


async def _task_pids(handle: WorkflowHandle[Any, Any]) -> set[int]:
    """The processes that ran the run's tasks (a worker's default identity is ``pid@host``)."""
    return {int(identity.split("@")[0]) for identity in await _task_identities(handle)}


async def test_each_run_stays_on_its_build_while_new_runs_take_the_newest(
    temporal_env: WorkflowEnvironment, tmp_path: Path, worker_processes: WorkerProcesses
) -> None:
    settings = lab_settings(temporal_env, tmp_path / "home")
    client = temporal_env.client
    lab = Lab(client=client, settings=settings)
    env = cli_env(settings)
    deployment = f"forklab-test-{uuid.uuid4().hex[:8]}"

    def build(build_id: str, **extra: str) -> dict[str, str]:
        return {**env, "FORKLAB_DEPLOYMENT": deployment, "FORKLAB_BUILD_ID": build_id, **extra}

    async def start(name: str) -> tuple[str, WorkflowHandle[Any, Any]]:
        spec = make_spec(params={"sandbox_sleep": 0.05})
        spec_file = tmp_path / f"{name}.json"
        spec_file.write_text(spec.model_dump_json())
        started = await asyncio.to_thread(
            forklab, env, "start", str(spec_file), "--batch-episodes", "12"
        )
        assert started.returncode == 0, started.stderr
        handle = client.get_workflow_handle(workflow_id(spec.id), result_type=ExperimentResult)
        await lab.wait_for(handle, Stage.awaiting_approval)
        return spec.id, handle

    logs = {b: tmp_path / f"worker-{b}.log" for b in ("v1", "v2", "v3")}
    v1: list[Popen[bytes]] = [worker_processes.start(build("v1"), logs["v1"])]
    await _log_says(logs["v1"], f"version {deployment}:v1 is now current")
    old_id, old = await start("old")  # started while v1 is current

    v2 = worker_processes.start(build("v2"), logs["v2"])  # the upgrade, beside v1
    await _log_says(logs["v2"], f"version {deployment}:v2 is now current (was {deployment}:v1)")
    new_id, new = await start("new")
    assert await _pinned_build(old) == "v1" and await _pinned_build(new) == "v2"

    # a restarted worker of the old build does not take new experiments back, and a
    # build started with promotion off does not take them at all
    worker_processes.kill(v1[0])
    v1.append(worker_processes.start(build("v1"), logs["v1"]))
    await _log_says(logs["v1"], "was current or ramping before")
    worker_processes.start(build("v3", FORKLAB_PROMOTE="false"), logs["v3"])
    await _log_says(logs["v3"], f"worker deployment version {deployment}:v3")
    assert await _current(client, deployment) == "v2"
    assert "now current" not in logs["v3"].read_text()

    for experiment in (old_id, new_id):
        approved = await asyncio.to_thread(forklab, env, "approve", experiment, "--approver", "kim")
        assert approved.returncode == 0, approved.stderr
    for handle in (old, new):
        result = await asyncio.wait_for(handle.result(), timeout=180)
        assert isinstance(result, ExperimentResult)
        assert result.status is Status.completed, result.error
    # every task of each run, before and after the upgrade, ran on its own build's workers
    old_pids = await _task_pids(old)
    assert old_pids and old_pids <= {p.pid for p in v1}
    assert await _task_pids(new) == {v2.pid}
    assert await _pinned_build(old) == "v1"

    # with the old build's workers gone, the operator is told which build the run needs
    for worker in v1:
        if worker.poll() is None:
            worker_processes.kill(worker)
    status = await asyncio.to_thread(forklab, env, "status", old_id)
    assert status.returncode == 1
    assert f"FORKLAB_DEPLOYMENT={deployment} FORKLAB_BUILD_ID=v1 forklab worker" in status.stderr
    status = await asyncio.to_thread(forklab, env, "status", new_id)
    assert status.returncode == 0, status.stderr
    assert f"  runs on build {deployment}:v2 (pinned: its workers only)\n" in status.stdout


async def test_an_agent_run_stays_on_its_build_and_its_fork_takes_the_newest(
    temporal_env: WorkflowEnvironment, services: Services, tmp_path: Path
) -> None:
    """Agent-run workers of builds v1 and v2 in one task queue (deployment
    ``<name>-agents``): the run started under v1 is pinned there; after v2 became current,
    a fork of it (its prefix read from v1's recorded history) runs only on v2's worker."""
    agent = agent_settings(services, tmp_path / "home")
    target = temporal_env.client.service_client.config.target_host
    deployment = f"forklab-test-{uuid.uuid4().hex[:8]}"

    def build(build_id: str) -> Settings:
        flags = {"address": target, "deployment": deployment, "build_id": build_id}
        return Settings.load(flags, env={})

    async def worker_client(build_id: str) -> Client:
        return await Client.connect(
            target, plugins=[agents_plugin(agent)], identity=f"agent-worker-{build_id}"
        )

    v1_client, v2_client = await worker_client("v1"), await worker_client("v2")
    await ensure_search_attributes(v1_client)
    v1 = worker_version(build("v1"), AGENTS)
    v2 = worker_version(build("v2"), AGENTS)
    assert v1 is not None and v2 is not None and v1.deployment_name == f"{deployment}-agents"
    async with build_agent_worker(v1_client, agent, version=v1):
        assert "is now current" in await promote_if_newest(v1_client, v1, "test")
        lab = AgentTestLab(
            lab=AgentLab(v1_client, agent), client=v1_client, agent=agent, services=services
        )
        parent = await lab.start_research(model="fast")
        with pytest.raises(WorkflowFailureError):
            await parent.result()  # the fast model's report is too thin
        async with build_agent_worker(v2_client, agent, version=v2):
            said = await promote_if_newest(v2_client, v2, "test")
            assert (
                said
                == f"version {deployment}-agents:v2 is now current (was {deployment}-agents:v1)"
            )
            fork = await lab.lab.fork(
                ForkRequest(run=parent.id, at_step=3, model="slow", requested_by="tester")
            )
            state = await asyncio.wait_for(fork.handle.result(), timeout=60)
            assert state["status"] == "ok"
    assert await _pinned_build(parent) == "v1" and await _pinned_build(fork.handle) == "v2"
    assert await _task_identities(parent) == {"agent-worker-v1"}
    assert await _task_identities(fork.handle) == {"agent-worker-v2"}


@activity.defn
async def _noop() -> None:
    """Something for a bare worker to serve while it only polls."""


async def test_workers_of_a_new_build_that_start_together_promote_it_once(
    temporal_env: WorkflowEnvironment,
) -> None:
    """Replicas of a new image start at the same moment: each tries to make the build
    current, from the same description of the deployment; both end without error, and
    the build is current."""
    client = temporal_env.client
    deployment = f"forklab-test-{uuid.uuid4().hex[:8]}"
    queue = f"versions-{uuid.uuid4().hex[:8]}"
    settings = Settings.load({"deployment": deployment, "build_id": "v1"}, env={})
    v1 = worker_version(settings)
    v2 = worker_version(settings.model_copy(update={"build_id": "v2"}))
    assert v1 is not None and v2 is not None

    def bare(version: WorkerDeploymentVersion) -> Worker:
        return Worker(
            client,
            task_queue=queue,
            activities=[_noop],
            deployment_config=deployment_config(version),
        )

    async with bare(v1):
        assert await promote_if_newest(client, v1, "a") == f"version {deployment}:v1 is now current"
        async with bare(v2):  # one poller is enough to register the version
            said = await asyncio.gather(*(promote_if_newest(client, v2, w) for w in "bc"))
    assert f"version {deployment}:v2 is now current (was {deployment}:v1)" in said
    assert set(said) <= {
        f"version {deployment}:v2 is now current (was {deployment}:v1)",
        f"version {deployment}:v2 is current",
    }
    assert await _current(client, deployment) == "v2"
