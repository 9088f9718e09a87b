"""Fail closed (issue 35, point 5): on a worker without a working bubblewrap, workload
code on the durable path does not run unless the worker's own policy accepts the
confined-process fallback. Bubblewrap is hidden from the worker by PATH (the probe is
cached, so the cache is cleared around each test): with the default policy the
experiment fails before approval with one sentence saying how to install it and no
rehearsal box runs; with ``allow_unconfined_workloads`` the run goes ahead and records
the fallback."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from concurrent.futures import Executor
from pathlib import Path

import pytest
from orchestration_lab import Lab, lab_settings, make_spec
from temporalio.testing import WorkflowEnvironment

from forklab.activities.sandbox.jail import (
    ALLOW_UNCONFINED,
    UnconfinedRefused,
    bubblewrap,
    require_confinement,
)
from forklab.cli.experiment.plan_commands import UNCONFINED_WARNING
from forklab.workers.config import Settings
from forklab.workers.experiment.worker import build_worker
from forklab.workflows.experiment.messages import Stage, Status
from tests.helpers import ROOT, run_cli


@pytest.fixture
def no_bwrap(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[None]:
    """This process sees no ``bwrap`` on its PATH."""
    empty = tmp_path / "bin-without-bwrap"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    bubblewrap.cache_clear()
    yield
    monkeypatch.undo()
    bubblewrap.cache_clear()


async def _lab(
    env: WorkflowEnvironment, cpu: Executor, tmp_path: Path, allow: bool
) -> AsyncIterator[Lab]:
    base = lab_settings(env, tmp_path / "home")
    settings = Settings.model_validate({**base.model_dump(), "allow_unconfined_workloads": allow})
    async with build_worker(env.client, settings, cpu):
        yield Lab(client=env.client, settings=settings)


def test_the_default_policy_refuses_a_host_without_bwrap(no_bwrap: None) -> None:
    with pytest.raises(UnconfinedRefused) as refused:
        require_confinement(False)
    message = str(refused.value)
    assert "apt-get install bubblewrap" in message and ALLOW_UNCONFINED in message
    assert "\n" not in message
    require_confinement(True)  # the fallback, when the worker's policy says so


def test_the_setting_reads_its_named_variable(tmp_path: Path) -> None:
    assert not Settings.load({"home": tmp_path}, env={}).allow_unconfined_workloads
    allowed = Settings.load({"home": tmp_path}, env={ALLOW_UNCONFINED: "1"})
    assert allowed.allow_unconfined_workloads


async def test_without_bwrap_the_experiment_fails_before_approval(
    no_bwrap: None, temporal_env: WorkflowEnvironment, cpu: Executor, tmp_path: Path
) -> None:
    async for lab in _lab(temporal_env, cpu, tmp_path, allow=False):
        spec = make_spec(id="fail-closed")
        handle, _ = await lab.start(spec)
        view = await lab.wait_for(handle, Stage.done)
        assert view.status is Status.failed and view.plan is None
        assert view.approval.decided_by is None
        assert view.error is not None and "apt-get install bubblewrap" in view.error
        assert ALLOW_UNCONFINED in view.error
        # nothing ran: no rehearsal box folder, no sandbox
        calls = lab.settings.sandboxes_dir / "calls"
        assert not calls.exists() or not any(calls.iterdir())
        assert lab.sandboxes(spec.id) == []


async def test_with_the_fallback_allowed_the_plan_is_made_and_says_so(
    no_bwrap: None, temporal_env: WorkflowEnvironment, cpu: Executor, tmp_path: Path
) -> None:
    async for lab in _lab(temporal_env, cpu, tmp_path, allow=True):
        handle, _ = await lab.start(make_spec(id="fail-open-by-policy"))
        view = await lab.wait_for(handle, Stage.awaiting_approval)
        assert view.stage is Stage.awaiting_approval, view.error
        assert view.plan is not None and view.plan.rehearsal.confinement == "process"
        await handle.cancel()


def test_plan_says_first_and_loudly_that_it_runs_workload_code_unconfined(
    capsys: pytest.CaptureFixture[str],
) -> None:
    spec = str(ROOT / "forklab" / "workloads" / "recovery-counter.yaml")
    code, out, _ = run_cli(capsys, "plan", spec)
    assert code == 0 and out.splitlines()[0] == UNCONFINED_WARNING
    assert "unconfined" in UNCONFINED_WARNING and "bubblewrap" in UNCONFINED_WARNING
    code, out, err = run_cli(capsys, "plan", spec, "--json")
    assert code == 0 and err == UNCONFINED_WARNING + "\n"
    assert json.loads(out)["valid"] in (True, False)  # stdout stays the report
