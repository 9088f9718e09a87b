"""The durable flow on the Daytona backend (real SDK, local Daytona-speaking server):
approval, prefixes, world batches, cleanup to zero, the same outcomes as the local
backend, and Braintrust child spans (real SDK, local Braintrust-speaking server) that name
the very sandboxes Daytona created; and a plan the account cannot hold, refused before
any sandbox exists."""

from __future__ import annotations

from collections.abc import AsyncIterator
from concurrent.futures import Executor
from pathlib import Path

import pytest
from fake_braintrust import API_KEY as BRAINTRUST_KEY
from fake_braintrust import FakeBraintrust, fake_braintrust
from fake_daytona import API_KEY, FakeDaytona, fake_daytona
from orchestration_lab import Lab, lab_settings, make_spec
from temporalio.testing import WorkflowEnvironment

from activities.sandbox.daytona import DaytonaOptions, DaytonaSandboxBackend
from experiments.plan import rehearse
from forklab.specfile import load_spec
from workers.worker import build_worker
from workflows.messages import Stage, Status

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
async def daytona_lab(
    temporal_env: WorkflowEnvironment,
    cpu: Executor,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> AsyncIterator[tuple[Lab, FakeDaytona, FakeBraintrust]]:
    with fake_daytona(tmp_path / "daytona") as fake, fake_braintrust() as braintrust:
        monkeypatch.setenv("BRAINTRUST_API_KEY", BRAINTRUST_KEY)
        monkeypatch.setenv("BRAINTRUST_APP_URL", braintrust.url)
        fake.add_snapshot("forklab-runner", regions=("eu",), cpu=1, mem=1, disk=3)
        fake.set_region("eu", cpu=8, mem=16, disk=30)
        settings = lab_settings(temporal_env, tmp_path / "home")
        backend = DaytonaSandboxBackend(
            DaytonaOptions(
                api_key=API_KEY,
                api_url=fake.api_url,
                target="eu",
                snapshot="forklab-runner",
                delete_wait=2.0,
            ),
            settings.home / "daytona-bundles",
        )
        async with build_worker(temporal_env.client, settings, cpu, backend):
            yield Lab(client=temporal_env.client, settings=settings), fake, braintrust


async def test_durable_flow_on_daytona_matches_the_local_twin(
    daytona_lab: tuple[Lab, FakeDaytona, FakeBraintrust],
) -> None:
    lab, fake, braintrust = daytona_lab
    spec = load_spec(str(ROOT / "experiments" / "recovery-counter.yaml"))
    spec = spec.model_copy(update={"id": "daytona-recovery", "episodes": 40})
    handle, token = await lab.start(spec, batch_episodes=20, rehearsal_episodes=10)
    view = await lab.wait_for(handle, Stage.awaiting_approval)
    assert view.plan is not None and view.plan.capacity.ok, view.plan
    assert fake.created == []  # planning spent no compute
    assert view.plan.snapshot.backend == "daytona"
    await lab.approve(handle, token)
    result = await handle.result()

    assert result.status is Status.completed, result.error
    assert result.analysis is not None
    assert result.analysis.outcomes_digest == rehearse(spec).outcomes_digest
    # every prefix chunk and world batch had a labelled, isolated, ephemeral sandbox
    chunks, worlds = 2, len(spec.worlds)
    assert len(fake.created) == chunks * (1 + worlds)
    seen = {(c["labels"]["forklab.world"], c["labels"]["forklab.batch"]) for c in fake.created}
    assert seen == {
        (w, str(i)) for i in range(chunks) for w in ["prefix", *(w.name for w in spec.worlds)]
    }
    assert all(c["labels"]["forklab.experiment"] == spec.id for c in fake.created)
    assert all(c["networkBlockAll"] and c["autoDeleteInterval"] == 0 for c in fake.created)
    # cleanup reconciled against the account: nothing left
    assert result.cleanup is not None and result.cleanup.left == 0
    assert fake.live() == []
    markdown = lab.store.get_bytes(result.analysis.markdown_digest).decode()
    snap_id = fake.snapshots["forklab-runner"]["id"]
    assert "common_snapshot" in markdown and snap_id in markdown
    assert "not a live ancestor" in markdown

    # Braintrust: each world's span names the Daytona sandboxes its batches ran in, in chunk
    # order, and the prefix sandboxes that made the checkpoints it inherited
    assert result.evidence_log is not None and result.evidence_log.startswith("sent")
    [experiment] = braintrust.experiments.values()
    children = [s for s in braintrust.spans(experiment["name"]) if s.get("span_parents")]
    assert sorted(c["input"]["world"] for c in children) == sorted(w.name for w in spec.worlds)

    def created(world: str) -> list[str]:
        ids = {int(c["labels"]["forklab.batch"]): c["id"] for c in fake.created
               if c["labels"]["forklab.world"] == world}  # fmt: skip
        return [ids[i] for i in range(chunks)]

    for child in children:
        meta = child["metadata"]
        assert meta["sandbox_ids"] == created(child["input"]["world"])
        assert meta["prefix_sandbox_ids"] == created("prefix")
        assert len(meta["inherited_checkpoint_digests"]) == chunks
        assert meta["snapshot_id"] == view.plan.snapshot.snapshot_id


async def test_quota_infeasible_plan_is_refused_before_any_sandbox(
    daytona_lab: tuple[Lab, FakeDaytona, FakeBraintrust],
) -> None:
    lab, fake, _ = daytona_lab
    fake.set_region("eu", cpu=8, mem=16, disk=30, used_disk=28)
    spec = make_spec()
    handle, _ = await lab.start(spec)
    result = await handle.result()
    assert result.status is Status.refused
    assert result.error is not None and "region eu has 2 of 30 GiB free" in result.error
    view = await lab.status(handle)
    assert view.error == result.error
    assert fake.created == [] and fake.live() == []
