"""A worker killed with SIGKILL mid-world or mid-prefix: the experiment still completes,
exactly once.

The worker is a real ``forklab worker`` process and the operator uses the real CLI.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from subprocess import Popen

from helpers import forklab_in_process as forklab
from orchestration_lab import Lab, WorkerProcesses, cli_env, lab_settings, make_spec
from temporalio.testing import WorkflowEnvironment

from forklab.activities.experiment.approval_keys import key_path
from forklab.activities.experiment.world_batches import PREFIX_WORLD
from forklab.cli.experiment.rehearsal import rehearse
from forklab.workflows.experiment.messages import ExperimentResult, Stage, Status, workflow_id


async def _kill_once_a_box_runs(
    lab: Lab, experiment: str, world: str, processes: WorkerProcesses, worker: Popen[bytes]
) -> None:
    """SIGKILL ``worker`` while a sandbox of ``world`` (``prefix``: a prefix chunk; else a
    group's worlds joined by +) runs."""
    labels = {"forklab.experiment": experiment, "forklab.world": world}
    for _ in range(600):
        if lab.backend.list(labels):
            break
        await asyncio.sleep(0.05)
    assert lab.backend.list(labels), f"a sandbox of {world} should be running"
    processes.kill(worker)


async def test_sigkilled_worker_is_replaced_and_nothing_counts_twice(
    temporal_env: WorkflowEnvironment, tmp_path: Path, worker_processes: WorkerProcesses
) -> None:
    settings = lab_settings(temporal_env, tmp_path / "home")
    env = cli_env(settings)
    lab = Lab(client=temporal_env.client, settings=settings)
    # about 2 s per world batch (a group of three shares a sandbox); the rehearsal sees
    # the same pace, so a retried group still fits in its reservation
    spec = make_spec(params={"sandbox_sleep": 0.15, "twin_sleep": 0.15})
    spec_file = tmp_path / "spec.json"
    spec_file.write_text(spec.model_dump_json())
    log = tmp_path / "worker.log"
    first = worker_processes.start(env, log)

    started = await asyncio.to_thread(
        forklab,
        env,
        "start",
        str(spec_file),
        "--batch-episodes",
        "12",
        "--rehearsal-episodes",
        "4",
    )
    assert started.returncode == 0, started.stderr
    assert f"started experiment {spec.id}" in started.stdout
    handle = temporal_env.client.get_workflow_handle(
        workflow_id(spec.id), result_type=ExperimentResult
    )
    view = await lab.wait_for(handle, Stage.awaiting_approval)
    key_file = key_path(settings.home, handle.id, view.approval.run_id)
    assert key_file.stat().st_mode & 0o777 == 0o600
    assert f"approver key (private, readable only by you): {key_file}" in started.stdout
    approved = await asyncio.to_thread(forklab, env, "approve", spec.id, "--approver", "kim")
    assert approved.returncode == 0, approved.stderr
    assert approved.stdout.startswith(f"approved: experiment {spec.id}")

    # mid-world: two chunks fill the two slots, so each chunk's worlds share one sandbox
    group = "baseline+boost+placebo"
    await _kill_once_a_box_runs(lab, spec.id, group, worker_processes, first)
    worker_processes.start(env, log)

    result = await asyncio.wait_for(handle.result(), timeout=120)
    assert result.status is Status.completed, result.error
    # 2 chunks, plus the killed group's new attempt (the workflow starts each)
    assert (await lab.activity_types(handle)).count("run_world_group") >= 3

    status = await asyncio.to_thread(forklab, env, "status", spec.id)
    assert status.returncode == 0 and "completed" in status.stdout
    assert [(w.name, w.status, w.episodes) for w in result.worlds] == [
        (name, "completed", 24) for name in ("baseline", "boost", "placebo")
    ]  # every world complete, none counted twice
    report = await asyncio.to_thread(forklab, env, "report", spec.id, "--json")
    assert report.returncode == 0, report.stderr
    twin = rehearse(make_spec(id=spec.id, params={}))  # the same worlds, without the pauses
    assert json.loads(report.stdout)["outcomes_digest"] == twin.outcomes_digest
    folder = settings.home / "reports" / spec.id  # the default folder
    assert f"wrote report.md, report.json and report.html to {folder}\n" in report.stderr
    assert (folder / "report.json").read_text() == report.stdout
    assert sorted(r.world for r in lab.ledger.worlds(spec.id)) == ["baseline", "boost", "placebo"]
    assert lab.sandboxes(spec.id) == [] and lab.sandbox_folders() == []


async def test_cli_errors_are_one_sentence(
    temporal_env: WorkflowEnvironment, tmp_path: Path
) -> None:
    env = cli_env(lab_settings(temporal_env, tmp_path / "home"))
    missing = await asyncio.to_thread(forklab, env, "status", "no-such-experiment")
    assert missing.returncode == 1
    assert missing.stderr.startswith("forklab: error: no experiment 'no-such-experiment'")
    assert len(missing.stderr.strip().splitlines()) == 1
    env["FORKLAB_ADDRESS"] = "127.0.0.1:1"
    down = await asyncio.to_thread(forklab, env, "report", "x")
    assert down.returncode == 1 and "cannot reach Temporal at 127.0.0.1:1" in down.stderr
    env["FORKLAB_ADDRESS"] = "nonsense"
    bad = await asyncio.to_thread(forklab, env, "status", "x")
    assert bad.returncode == 2 and "FORKLAB_ADDRESS" in bad.stderr


async def test_worker_killed_in_a_prefix_sandbox_leaves_no_layer_and_no_box(
    temporal_env: WorkflowEnvironment, tmp_path: Path, worker_processes: WorkerProcesses
) -> None:
    """A workload with files runs its prefixes in prefix sandboxes (the rehearsal cannot
    hand them over): the worker is killed while one runs. The chunk's next attempt runs
    it again, the run completes with the twin's outcomes, and neither the killed box nor
    the workspace layers of either attempt outlive the run."""
    settings = lab_settings(temporal_env, tmp_path / "home")
    env = cli_env(settings)
    lab = Lab(client=temporal_env.client, settings=settings)
    workload = {"name": "orchestration_workloads:ToyFiles", "params": {"prefix_sleep": 3.0}}
    spec = make_spec(workload=workload)
    spec_file = tmp_path / "spec.json"
    spec_file.write_text(spec.model_dump_json())
    log = tmp_path / "worker.log"
    first = worker_processes.start(env, log)
    started = await asyncio.to_thread(
        forklab, env, "start", str(spec_file), "--batch-episodes", "12", "--rehearsal-episodes", "4"
    )
    assert started.returncode == 0, started.stderr
    handle = temporal_env.client.get_workflow_handle(
        workflow_id(spec.id), result_type=ExperimentResult
    )
    view = await lab.wait_for(handle, Stage.awaiting_approval)
    assert view.plan is not None and view.plan.rehearsal.prefixes is None  # not handed over
    approved = await asyncio.to_thread(forklab, env, "approve", spec.id, "--approver", "kim")
    assert approved.returncode == 0, approved.stderr

    # its prefix box sleeps 3 s before it writes a checkpoint
    await _kill_once_a_box_runs(lab, spec.id, PREFIX_WORLD, worker_processes, first)
    worker_processes.start(env, log)

    result = await asyncio.wait_for(handle.result(), timeout=180)
    assert result.status is Status.completed, result.error
    # 2 chunks, plus the killed chunk's new attempt
    assert (await lab.activity_types(handle)).count("run_prefixes") >= 3
    assert [(w.name, w.status, w.episodes) for w in result.worlds] == [
        (name, "completed", 24) for name in ("baseline", "boost", "placebo")
    ]
    twin = rehearse(make_spec(id=spec.id, workload={**workload, "params": {}}))
    assert result.analysis is not None
    assert result.analysis.outcomes_digest == twin.outcomes_digest
    assert result.cleanup is not None and result.cleanup.left == 0
    assert lab.sandboxes(spec.id) == [] and lab.sandbox_folders() == []
    assert lab.backend.workspaces.live_layers() == set()  # both attempts' layers released
