"""``forklab doctor --delete`` deletes only sandboxes of no open run (a reviewer saw it kill a
running experiment's worlds: the run then failed its baseline with exit code -9). Real
Temporal dev server, real local sandboxes labelled as the worlds stage labels them."""

from __future__ import annotations

import asyncio
import json
import uuid
from pathlib import Path

import pytest
from helpers import run_cli
from temporalio import workflow
from temporalio.client import WorkflowHandle
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import UnsandboxedWorkflowRunner, Worker

from forklab.activities.experiment.runner_bundle import bundle_files
from forklab.activities.experiment.world_batches import EXPERIMENT_LABEL, RUN_LABEL, WORLD_LABEL
from forklab.activities.sandbox.base import Limits
from forklab.activities.sandbox.local import LocalSandboxBackend
from forklab.workers.config import Settings


@workflow.defn(sandboxed=False)
class ContinuedOnce:
    """Continues as new once, then stays open (as an experiment does past its history
    budget): its sandboxes are labelled with the chain's first run, not the current one."""

    @workflow.run
    async def run(self, fresh: bool) -> None:
        if fresh:
            workflow.continue_as_new(False)
        await workflow.wait_condition(lambda: False)


async def _open_run(
    env: WorkflowEnvironment, name: str
) -> tuple[WorkflowHandle[object, object], str]:
    """A workflow that stays running (no worker polls its queue) and its run key."""
    wid = f"forklab-{name}-{uuid.uuid4().hex[:8]}"
    handle = await env.client.start_workflow(
        "ExperimentWorkflow", id=wid, task_queue=f"doctor-{uuid.uuid4().hex[:8]}"
    )
    return handle, f"{wid}/{handle.first_execution_run_id}"


async def test_delete_keeps_the_sandboxes_of_a_running_run(
    temporal_env: WorkflowEnvironment,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    home = tmp_path / "home"
    address = temporal_env.client.service_client.config.target_host
    backend = LocalSandboxBackend(Settings.load({"home": home}, env={}).sandboxes_dir)
    snapshot = backend.prepare_snapshot(bundle_files("retry-cascade")).id
    running, running_key = await _open_run(temporal_env, "running")
    closed, closed_key = await _open_run(temporal_env, "closed")
    await closed.terminate("ended before the doctor looks")

    def box(key: str, world: str) -> str:
        labels = {EXPERIMENT_LABEL: "exp", RUN_LABEL: key, WORLD_LABEL: world}
        return backend.create(snapshot, labels, Limits())

    live = [box(running_key, "baseline"), box(running_key, "boost")]
    dead = box(closed_key, "baseline")
    stray = "lsb-" + "0" * 16  # a folder whose registry entry is gone: nobody's
    (home / "sandboxes" / "boxes" / stray).mkdir()
    assert set(backend.list({})) == {*live, dead, stray}

    monkeypatch.delenv("FORKLAB_SANDBOX", raising=False)
    argv = ["doctor", "--delete", "--home", str(home), "--address", address]
    code, out, err = await asyncio.to_thread(run_cli, capsys, *argv)  # it runs its own loop
    assert (code, err) == (0, ""), out
    assert f"kept 2 sandbox(es) of run {running_key}: it is still running\n" in out
    assert f"1 sandbox(es) without a readable {RUN_LABEL} label" in out
    assert out.endswith("removed 2, left 0\n"), out
    assert backend.list({}) == sorted(live)  # the running run's worlds are untouched
    code, out, err = await asyncio.to_thread(
        run_cli, capsys, "doctor", "--home", str(home), "--address", address, "--json"
    )
    assert (code, err) == (1, "") and json.loads(out) == {"backend": "local", "found": sorted(live)}

    # once the run has ended its sandboxes are leftovers like any other
    await running.terminate("done")
    code, out, err = await asyncio.to_thread(run_cli, capsys, *argv)
    assert (code, err) == (0, "") and "kept" not in out and out.endswith("removed 2, left 0\n")
    assert backend.list({}) == []


async def test_delete_keeps_the_sandboxes_of_a_run_that_continued_as_new(
    temporal_env: WorkflowEnvironment,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    home = tmp_path / "home"
    address = temporal_env.client.service_client.config.target_host
    backend = LocalSandboxBackend(Settings.load({"home": home}, env={}).sandboxes_dir)
    snapshot = backend.prepare_snapshot(bundle_files("retry-cascade")).id
    queue = f"doctor-{uuid.uuid4().hex[:8]}"
    async with Worker(
        temporal_env.client,
        task_queue=queue,
        workflows=[ContinuedOnce],
        workflow_runner=UnsandboxedWorkflowRunner(),
    ):
        handle = await temporal_env.client.start_workflow(
            ContinuedOnce.run, True, id=f"forklab-chain-{uuid.uuid4().hex[:8]}", task_queue=queue
        )
        first = handle.first_execution_run_id
        for _ in range(100):  # until the second run of the chain is the latest
            if (await handle.describe()).run_id != first:
                break
            await asyncio.sleep(0.1)
        assert (await handle.describe()).run_id != first
        key = f"{handle.id}/{first}"
        live = backend.create(snapshot, {RUN_LABEL: key}, Limits())
        monkeypatch.delenv("FORKLAB_SANDBOX", raising=False)
        argv = ["doctor", "--delete", "--home", str(home), "--address", address]
        code, out, err = await asyncio.to_thread(run_cli, capsys, *argv)
        assert (code, err) == (0, ""), out
        assert f"kept 1 sandbox(es) of run {key}: it is still running\n" in out
        assert backend.list({}) == [live]
        await handle.terminate("done")


def test_delete_without_temporal_deletes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    home = tmp_path / "home"
    backend = LocalSandboxBackend(Settings.load({"home": home}, env={}).sandboxes_dir)
    snapshot = backend.prepare_snapshot(bundle_files("retry-cascade")).id
    left = backend.create(snapshot, {RUN_LABEL: "forklab-x/run-1"}, Limits())
    monkeypatch.delenv("FORKLAB_SANDBOX", raising=False)
    argv = ["doctor", "--delete", "--home", str(home), "--address", "127.0.0.1:1"]
    code, out, err = run_cli(capsys, *argv)
    assert code == 1 and left in out and "removed" not in out
    assert err.startswith("forklab: error: nothing deleted: --delete keeps the sandboxes of ")
    assert "at 127.0.0.1:1 which are running (" in err and "`forklab up`" in err
    assert err.count("\n") == 1
    assert backend.list({}) == [left]
