"""The durable flow on the Daytona backend (real SDK, local Daytona-speaking server):
approval, prefixes, world batches, cleanup to zero, the same outcomes as the local
backend, and Braintrust child spans (real SDK, local Braintrust-speaking server) that name
the very sandboxes Daytona created; a worker on another host that runs every sandbox from
the bundle the planning host published to the artifact store (S3, moto); and a plan the
account cannot hold, refused before any sandbox exists."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from concurrent.futures import Executor
from pathlib import Path

import pytest
from fake_braintrust import API_KEY as BRAINTRUST_KEY
from fake_braintrust import FakeBraintrust, fake_braintrust
from fake_daytona import API_KEY, FakeDaytona, fake_daytona
from helpers import forklab_in_process as forklab
from orchestration_lab import Lab, cli_env, lab_settings, make_spec, signed
from stores_lab import S3_ENV, make_bucket, moto_server
from temporalio.testing import WorkflowEnvironment

from forklab.activities.sandbox.daytona import DaytonaOptions, DaytonaSandboxBackend
from forklab.cli.experiment.rehearsal import rehearse
from forklab.cli.experiment.specfile import load_spec
from forklab.workers.config import Settings
from forklab.workers.experiment.worker import build_worker, cpu_pool
from forklab.workers.stores import artifact_store
from forklab.workflows.experiment.messages import Stage, Status

ROOT = Path(__file__).resolve().parent.parent


def daytona_backend(fake: FakeDaytona, settings: Settings) -> DaytonaSandboxBackend:
    """The backend a worker with ``settings`` builds for the fake's ``forklab-runner``."""
    return DaytonaSandboxBackend(
        DaytonaOptions(
            api_key=API_KEY,
            api_url=fake.api_url,
            target="eu",
            snapshot="forklab-runner",
            delete_wait=2.0,
        ),
        settings.home / "daytona-bundles",
    )


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
        async with build_worker(
            temporal_env.client, settings, cpu, daytona_backend(fake, settings)
        ):
            yield Lab(client=temporal_env.client, settings=settings), fake, braintrust


async def test_durable_flow_on_daytona_matches_the_local_twin(
    daytona_lab: tuple[Lab, FakeDaytona, FakeBraintrust],
) -> None:
    lab, fake, braintrust = daytona_lab
    spec = load_spec(str(ROOT / "forklab" / "workloads" / "recovery-counter.yaml"))
    spec = spec.model_copy(update={"id": "daytona-recovery", "episodes": 40})
    handle, token = await lab.start(spec, batch_episodes=20, rehearsal_episodes=10)
    view = await lab.wait_for(handle, Stage.awaiting_approval)
    assert view.plan is not None and view.plan.capacity.ok, view.plan
    assert fake.created == []  # planning spent no compute
    assert view.plan.snapshot.backend == "daytona"
    fake.fail("create", 429)  # Daytona rate-limits one create: that unit runs again
    await lab.approve(handle, token)
    result = await handle.result()

    assert result.status is Status.completed, result.error
    assert fake.faults["create"] == []  # the 429 was answered, and ridden out
    assert result.analysis is not None
    assert result.analysis.outcomes_digest == rehearse(spec).outcomes_digest
    # every chunk's world group had a labelled, isolated, ephemeral sandbox (two chunks
    # fill the two slots: each chunk's worlds in one); the prefixes ran once, in the
    # rehearsal before approval, and were handed over (no prefix sandbox)
    assert view.plan.rehearsal.prefixes is not None
    chunks, group = 2, "+".join(w.name for w in spec.worlds)
    assert len(fake.created) == chunks
    seen = {(c["labels"]["forklab.world"], c["labels"]["forklab.batch"]) for c in fake.created}
    assert seen == {(group, str(i)) for i in range(chunks)}
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
    # order, and says that the checkpoints it inherited were made by the rehearsal
    assert result.evidence_log is not None and result.evidence_log.startswith("sent")
    [experiment] = braintrust.experiments.values()
    children = [s for s in braintrust.spans(experiment["name"]) if s.get("span_parents")]
    assert sorted(c["input"]["world"] for c in children) == sorted(w.name for w in spec.worlds)

    ids = {int(c["labels"]["forklab.batch"]): c["id"] for c in fake.created}
    for child in children:
        meta = child["metadata"]
        assert meta["sandbox_ids"] == [ids[i] for i in range(chunks)]
        assert meta["prefix_sandbox_ids"] == []
        assert meta["prefix_chunks_by_rehearsal"] == chunks
        assert len(meta["inherited_checkpoint_digests"]) == chunks
        assert meta["snapshot_id"] == view.plan.snapshot.snapshot_id


async def test_a_worker_on_another_host_runs_the_bundle_the_planner_published(
    temporal_env: WorkflowEnvironment, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Host a plans (resolves the Daytona snapshot, keeps and publishes the runner bundle)
    and goes away; host b, with a home of its own, runs every world: it gets the bundle
    from the shared artifact store, verified against the snapshot id, and creates every
    sandbox from the image host a pinned, though the snapshot's name has been re-pointed
    to another image since. The prefixes host a's rehearsal kept reach host b's worlds
    through the shared store too."""
    bucket = f"forklab-{uuid.uuid4().hex[:8]}"
    for var, value in S3_ENV.items():
        monkeypatch.setenv(var, value)
    # a pool of its own, started with the S3 credentials (the analysis reads the store)
    with moto_server() as s3, fake_daytona(tmp_path / "daytona") as fake, cpu_pool() as cpu:
        make_bucket(s3, bucket)
        fake.add_snapshot("forklab-runner", regions=("eu",), cpu=1, mem=1, disk=3)
        fake.set_region("eu", cpu=8, mem=16, disk=30)
        queue = lab_settings(temporal_env, tmp_path / "operator")
        shared = {"artifacts": f"s3://{bucket}/forklab", "s3_endpoint": s3}
        host_a, host_b = (
            queue.model_copy(update={"home": tmp_path / f"host-{n}", **shared}) for n in "ab"
        )
        spec = make_spec(episodes=24)
        lab = Lab(client=temporal_env.client, settings=host_a)
        async with build_worker(temporal_env.client, host_a, cpu, daytona_backend(fake, host_a)):
            handle, key = await lab.start(spec, batch_episodes=12)
            view = await lab.wait_for(handle, Stage.awaiting_approval)
        assert view.plan is not None and view.plan.capacity.ok, view
        snapshot_id = view.plan.snapshot.snapshot_id
        digest = view.plan.snapshot.code_digest
        assert (host_a.home / "daytona-bundles" / digest).is_dir()
        assert not (host_b.home / "daytona-bundles").exists()
        pinned = fake.snapshots["forklab-runner"]
        fake.snapshots["pinned"] = pinned
        fake.add_snapshot("forklab-runner")  # the name now points at another image

        async with build_worker(temporal_env.client, host_b, cpu, daytona_backend(fake, host_b)):
            attempt = await lab.send(handle, "approve", signed(view, key))
            assert attempt.accepted, attempt
            result = await handle.result()
        assert result.status is Status.completed, result.error
        assert result.analysis is not None
        markdown = artifact_store(host_b).get_bytes(result.analysis.markdown_digest).decode()

    assert result.analysis.outcomes_digest == rehearse(spec).outcomes_digest
    assert (host_b.home / "daytona-bundles" / digest).is_dir()  # restored from the store
    assert view.plan.rehearsal.prefixes is not None  # no prefix sandbox: host a kept them
    assert len(fake.created) == 2  # a sandbox per chunk, its worlds in it
    assert {c["snapshot"] for c in fake.created} == {pinned["id"]}
    assert snapshot_id == f"daytona:{pinned['id']}:{digest}"
    assert result.cleanup is not None and result.cleanup.left == 0 and fake.live() == []
    assert f"common_snapshot: every sandbox created from Daytona snapshot {pinned['id']}" in (
        markdown
    )


async def test_a_workload_with_files_is_refused_before_approval_on_daytona(
    daytona_lab: tuple[Lab, FakeDaytona, FakeBraintrust],
) -> None:
    """Daytona sandboxes have no copy-on-write workspaces: a workload that keeps files
    (coding-fix) is refused by the capacity check, before approval and any sandbox, not
    by its first prefix after compute is spent."""
    lab, fake, _ = daytona_lab
    spec = load_spec(str(ROOT / "forklab" / "workloads" / "coding-fix.yaml")).model_copy(
        update={"id": f"files-{uuid.uuid4().hex[:8]}", "episodes": 10}
    )
    handle, _ = await lab.start(spec)
    result = await asyncio.wait_for(handle.result(), timeout=120)  # no approval is given
    assert result.status is Status.refused, result.error
    assert result.error is not None and "keeps files" in result.error
    assert result.approval.decided_by is None
    assert fake.created == [] and fake.live() == []


async def test_quota_infeasible_plan_is_refused_before_any_sandbox(
    daytona_lab: tuple[Lab, FakeDaytona, FakeBraintrust],
) -> None:
    lab, fake, braintrust = daytona_lab
    fake.set_region("eu", cpu=8, mem=16, disk=30, used_disk=28)
    spec = make_spec()
    handle, _ = await lab.start(spec)
    result = await handle.result()
    assert result.status is Status.refused
    reason = "region eu has 2 of 30 GiB free"
    assert result.error is not None and reason in result.error
    view = await lab.status(handle)
    assert view.error == result.error
    assert fake.created == [] and fake.live() == []
    # the reason is on record: the ledger row, `forklab report`, the Braintrust root span
    row = lab.ledger.experiment(spec.id)
    assert row is not None and row.status == "refused" and reason in (row.error or "")
    report = await asyncio.to_thread(forklab, cli_env(lab.settings), "report", spec.id)
    assert report.returncode == 1 and "ended refused without a report" in report.stderr
    assert reason in report.stderr
    [experiment] = braintrust.experiments.values()
    [root] = braintrust.spans(experiment["name"])
    assert root["output"]["status"] == "refused" and reason in root["output"]["error"]
