"""Rolling upgrades: with a deployment name, each experiment stays on the build of the
workers it started on, while new experiments go to the newest build.

Real ``forklab worker`` processes of two builds share one task queue on the real dev
server; the operator uses the real CLI.
"""

from __future__ import annotations

import asyncio
import os
import uuid
from pathlib import Path
from subprocess import Popen

import pytest
from orchestration_lab import Lab, WorkerProcesses, cli_env, forklab, lab_settings, make_spec
from temporalio.api.workflowservice.v1 import DescribeWorkerDeploymentRequest
from temporalio.client import Client, WorkflowHandle
from temporalio.testing import WorkflowEnvironment

from workers.config import ConfigError, Settings
from workers.versioning import code_build_id
from workflows.messages import ExperimentResult, Stage, Status, workflow_id


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


async def _pinned_build(handle: WorkflowHandle[object, object]) -> str:
    info = (await handle.describe()).raw_description.workflow_execution_info
    return info.versioning_info.deployment_version.build_id


async def _task_pids(handle: WorkflowHandle[object, object]) -> set[int]:
    """The processes that started the run's workflow and activity tasks (a worker's
    identity is ``pid@host``)."""
    pids = set()
    for event in (await handle.fetch_history()).events:
        for field in (
            "workflow_task_started_event_attributes",
            "activity_task_started_event_attributes",
        ):
            if event.HasField(field):
                pids.add(int(getattr(event, field).identity.split("@")[0]))
    return pids


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

    async def start(name: str) -> tuple[str, WorkflowHandle[object, object]]:
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
    await _log_says(logs["v1"], "was current before")
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
    assert await _task_pids(old) <= {p.pid for p in v1}
    assert await _task_pids(new) == {v2.pid}
    assert await _pinned_build(old) == "v1"

    # with the old build's workers gone, the operator is told which build the run needs
    for worker in v1:
        if worker.poll() is None:
            worker_processes.kill(worker)
    status = await asyncio.to_thread(forklab, env, "status", old_id)
    assert status.returncode == 1
    assert f"FORKLAB_DEPLOYMENT={deployment} FORKLAB_BUILD_ID=v1 forklab worker" in status.stderr
    assert (await asyncio.to_thread(forklab, env, "status", new_id)).returncode == 0
