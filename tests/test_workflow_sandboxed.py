"""Hostile workload code on the durable path: the rehearsal and every world run in boxes.

The attacks are measured through the workflow itself: what the workload reports it could
reach, what the server recorded, and what is on disk afterwards.
"""

from __future__ import annotations

import asyncio

import pytest
from orchestration_lab import Lab, make_spec
from temporalio.client import WorkflowFailureError

from forklab.cli.experiment.specfile import load_spec
from forklab.workflows.experiment.messages import Stage, Status
from tests.helpers import ROOT


async def test_hostile_rehearsal_reaches_no_token_no_server_no_home(lab: Lab) -> None:
    """Issue 7's self-approval: the rehearsal read the token file and ran ``approve``.
    In a box it finds no token, cannot reach Temporal, cannot write the home and sees none
    of the worker's environment or packages."""
    home = lab.settings.home
    port = lab.settings.port
    spec = make_spec(
        workload={"name": "orchestration_workloads:Hostile", "params": {}},
    )
    spec = spec.model_copy(
        update={
            "workload": spec.workload.model_copy(
                update={"params": {"home": str(home), "port": port}}
            )
        }
    )
    (home / "tokens").mkdir(parents=True, exist_ok=True)
    (home / "tokens" / "other-run.token").write_text("victim-token-0123\n")
    keys = home / "approval-keys" / "forklab-other" / "run"
    keys.mkdir(parents=True)
    (keys / "approver.key").write_text("PRIVATE KEY\n")
    handle, _ = await lab.start(spec)
    with pytest.raises(WorkflowFailureError):  # failed before approval: restartable
        await asyncio.wait_for(handle.result(), timeout=120)
    result = await lab.status(handle)
    assert result.status is Status.failed
    assert result.error is not None and "hostile report:" in result.error, result.error
    assert "victim-token" not in result.error and "PRIVATE" not in result.error
    assert "secrets=[]" in result.error
    assert "net=refused" in result.error
    assert "home=denied" in result.error and not (home / "pwned").exists()
    assert "temporalio=missing" in result.error and "env=[]" in result.error
    assert result.approval.attempts == [] and result.approval.status.value == "pending"
    assert lab.sandboxes(spec.id) == []


async def test_a_snapshot_poisoned_mid_run_fails_the_run_and_never_validates(lab: Lab) -> None:
    spec = make_spec(params={"sandbox_sleep": 0.1}, episodes=36)
    handle, token = await lab.start(spec, batch_episodes=6, rehearsal_episodes=4)
    await lab.approve(handle, token)
    await lab.wait_for(handle, Stage.running_worlds, timeout=120)
    view = await lab.status(handle)
    assert view.plan is not None
    digest = view.plan.snapshot.code_digest
    runner = lab.settings.sandboxes_dir / "snapshots" / digest / "forklab/runtime/runner.py"
    runner.chmod(0o644)
    runner.write_text(runner.read_text() + "\n# poisoned\n")
    result = await asyncio.wait_for(handle.result(), timeout=180)
    assert result.status is Status.failed, result
    assert result.error is not None and "modified after it was made" in result.error
    assert result.analysis is None  # no report, so never `valid: true`
    assert lab.sandboxes(spec.id) == []


async def test_a_workspace_layer_tampered_mid_run_fails_the_run_and_never_validates(
    lab: Lab,
) -> None:
    """The coding-fix workload keeps its package as files: each prefix chunk's workspace
    is frozen into a sealed layer that every world attaches. A layer changed after it was
    sealed (one source file of one episode) is refused before any world runs on it."""
    spec = load_spec(str(ROOT / "forklab" / "workloads" / "coding-fix.yaml"))
    spec = spec.model_copy(update={"id": "tampered-layer", "episodes": 40})
    handle, token = await lab.start(spec, batch_episodes=5, rehearsal_episodes=5)
    await lab.approve(handle, token)
    view = await lab.wait_for(handle, Stage.running_worlds, timeout=180)
    # a workload with files: the rehearsal only checks its prefixes, and the prefix
    # sandboxes run them into the layers the worlds attach
    assert view.plan is not None and view.plan.rehearsal.prefixes is None
    layers = lab.settings.sandboxes_dir / "layers"
    tampered = 0
    for arith in layers.glob("*/t/*/calc/arith.py"):
        arith.write_text(arith.read_text().replace("a - b", "a + b"))  # a silent "fix"
        tampered += 1
    assert tampered > 0
    result = await asyncio.wait_for(handle.result(), timeout=180)
    assert result.status is Status.failed, result
    assert result.error is not None and "modified after sealing" in result.error, result.error
    assert result.analysis is None  # no report, so never `valid: true`
    assert lab.sandboxes(spec.id) == []
    assert lab.backend.workspaces.live_layers() == set()  # the run released its layers
