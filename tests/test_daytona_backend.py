"""The Daytona backend through the real ``daytona`` SDK against a local server speaking the
API subset it calls (tests/fake_daytona.py), faults included: 401, 404 snapshot, 409,
429, 5xx, a create that times out after the sandbox exists, a sandbox that never deletes."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from fake_daytona import API_KEY, FakeDaytona, fake_daytona
from helpers import run_cli
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment, WorkflowEnvironment

from forklab.activities.experiment.runner_bundle import bundle_files, code_digest
from forklab.activities.experiment.world_batches import SandboxActivities
from forklab.activities.sandbox.base import (
    Limits,
    SandboxError,
    SandboxNotFoundError,
    SnapshotCorruptedError,
)
from forklab.activities.sandbox.daytona import DaytonaOptions, DaytonaSandboxBackend
from forklab.activities.sandbox.preflight import SandboxUnavailableError
from forklab.activities.sandbox.shared_snapshots import SharedSnapshots
from forklab.activities.stores.artifacts import ArtifactError, LocalArtifactStore
from forklab.contracts.experiment import CleanupInput, EpisodeChunk, PrefixInput, RunnerJob
from forklab.workers.config import ConfigError, Settings
from forklab.workers.experiment.providers import sandbox_backend

LABELS = {
    "forklab.experiment": "exp-1",
    "forklab.run": "forklab-exp-1/run-1",
    "forklab.world": "baseline",
    "forklab.batch": "0",
}


@pytest.fixture
def fake(tmp_path: Path) -> Iterator[FakeDaytona]:
    with fake_daytona(tmp_path / "daytona") as state:
        state.add_snapshot("forklab-runner", regions=("eu",), cpu=1, mem=1, disk=3)
        state.set_region("eu", cpu=8, mem=16, disk=30)
        yield state


def options(fake: FakeDaytona, **changes: object) -> DaytonaOptions:
    base = DaytonaOptions(
        api_key=API_KEY,
        api_url=fake.api_url,
        target="eu",
        snapshot="forklab-runner",
        create_timeout=2.0,
        delete_wait=1.0,
    )
    return base.model_copy(update=changes)


@pytest.fixture
def backend(fake: FakeDaytona, tmp_path: Path) -> DaytonaSandboxBackend:
    return DaytonaSandboxBackend(options(fake), tmp_path / "bundles")


def test_sandbox_lifecycle(fake: FakeDaytona, backend: DaytonaSandboxBackend) -> None:
    files = bundle_files("retry-cascade")
    info = backend.prepare_snapshot(files)
    snap = fake.snapshots["forklab-runner"]
    assert info.id.startswith(f"daytona:{snap['id']}:") and info.id.endswith(info.code_digest)
    assert backend.prepare_snapshot(files) == info  # idempotent

    sid = backend.create(info.id, LABELS, Limits(wall_seconds=90))
    sent = fake.created[-1]
    assert sent["snapshot"] == snap["id"]  # pinned by id: a name could be re-pointed
    assert sent["labels"] == {
        **LABELS,
        "forklab.managed": "true",
        "code-toolbox-language": "python",
    }
    assert sent["networkBlockAll"] is True
    assert sent["autoDeleteInterval"] == 0  # ephemeral: deleted as soon as it stops
    assert sent["autoStopInterval"] == 3 and sent["ttlMinutes"] == 60
    assert sent["target"] == "eu"
    # the runner bundle is in the sandbox, byte for byte
    for f in files:
        assert backend.download(sid, f.relpath) == f.source.read_bytes()

    backend.upload(sid, "data/in.txt", b"forty-two")
    ran = backend.exec(sid, ["python", "-c", "print(open('data/in.txt').read())"], 30)
    assert (ran.exit_code, ran.stdout.strip(), ran.timed_out) == (0, "forty-two", False)
    assert ran.network_isolated
    failed = backend.exec(sid, ["python", "-c", "raise SystemExit(3)"], 30)
    assert failed.exit_code == 3
    slow = backend.exec(sid, ["python", "-c", "import time; time.sleep(30)"], 1)
    assert slow.timed_out and slow.exit_code != 0
    with pytest.raises(SandboxError):
        backend.download(sid, "no-such-file")
    with pytest.raises(SandboxError, match="relative"):
        backend.upload(sid, "../escape", b"x")

    assert backend.list({"forklab.experiment": "exp-1"}) == [sid]
    assert backend.list({"forklab.experiment": "other"}) == []
    backend.delete(sid)
    backend.delete(sid)  # idempotent
    assert backend.list({"forklab.experiment": "exp-1"}) == [] and fake.live() == []


def test_a_bundle_prepared_on_one_host_is_restored_on_another(
    fake: FakeDaytona, tmp_path: Path
) -> None:
    """Host b never saw the bundle: it gets it from the artifact store, verified, and
    creates its sandboxes from the image host a pinned, though the snapshot's name now
    points at another image."""
    store = LocalArtifactStore(tmp_path / "shared")
    files = bundle_files("retry-cascade")
    host_a = DaytonaSandboxBackend(options(fake), tmp_path / "a" / "bundles")
    info = SharedSnapshots(host_a, store).prepare(files)
    pinned = fake.snapshots["forklab-runner"]
    fake.snapshots["old"] = pinned
    fake.add_snapshot("forklab-runner")  # the name is re-pointed to a new image
    host_b = DaytonaSandboxBackend(options(fake), tmp_path / "b" / "bundles")
    with pytest.raises(SandboxError, match="not on this worker and was not restored"):
        host_b.create(info.id, LABELS, Limits())
    SharedSnapshots(host_b, store).ensure(info.id)
    kept = tmp_path / "b" / "bundles" / info.code_digest
    assert sorted(str(p.relative_to(kept)) for p in kept.rglob("*.py")) == sorted(
        f.relpath for f in files
    )
    sid = host_b.create(info.id, LABELS, Limits())
    assert fake.created[-1]["snapshot"] == pinned["id"]
    for f in files:
        assert host_b.download(sid, f.relpath) == f.source.read_bytes()
    host_b.delete(sid)


def test_a_damaged_or_substituted_bundle_never_reaches_a_sandbox(
    fake: FakeDaytona, tmp_path: Path
) -> None:
    store = LocalArtifactStore(tmp_path / "shared")
    files = bundle_files("retry-cascade")
    info = SharedSnapshots(DaytonaSandboxBackend(options(fake), tmp_path / "a"), store).prepare(
        files
    )
    host_b = DaytonaSandboxBackend(options(fake), tmp_path / "b")
    # a file damaged in the store: the store's own hash check refuses it
    victim = store.put_bytes(files[-1].source.read_bytes())
    store.path(victim).write_bytes(b"import os; os.system('steal the keys')\n")
    with pytest.raises(ArtifactError, match="is corrupt"):
        SharedSnapshots(host_b, store).ensure(info.id)
    # an intact manifest of other files: they are not the bundle the id names
    other = bundle_files("counter-recovery")
    assert code_digest(other) != info.code_digest
    with pytest.raises(SandboxError, match="artifact store is inconsistent"):
        host_b.restore_snapshot(info.id, other)
    assert not (tmp_path / "b" / info.code_digest).exists()
    # a kept bundle modified on the host: the run stops, the next restore repairs it
    store.put_bytes(files[-1].source.read_bytes())
    SharedSnapshots(host_b, store).ensure(info.id)
    kept = tmp_path / "b" / info.code_digest / files[-1].relpath
    kept.write_bytes(b"tampered")
    with pytest.raises(SnapshotCorruptedError, match="was modified"):
        host_b.create(info.id, LABELS, Limits())
    SharedSnapshots(host_b, store).ensure(info.id)
    assert kept.read_bytes() == files[-1].source.read_bytes()
    assert fake.created == []


@pytest.mark.parametrize(
    ("snapshot", "region", "peak", "reason"),
    [
        ({}, {}, 4, None),
        ({"state": "inactive"}, {}, 4, "is inactive, not active"),
        ({"state": "building"}, {}, 4, "is building, not active"),
        ({"regions": ("us",)}, {}, 4, "available in us but the target region is eu"),
        ({"disk": 10}, {}, 4, "snapshot disk 10 GiB × 4 concurrent sandboxes = 40 GiB"),
        ({}, {"disk": 30, "used_disk": 25}, 2, "region eu has 5 of 30 GiB free"),
        ({"cpu": 4}, {}, 4, "snapshot CPU 4 vCPU × 4 concurrent sandboxes = 16 vCPU"),
    ],
)
def test_preflight(
    fake: FakeDaytona,
    backend: DaytonaSandboxBackend,
    snapshot: dict[str, object],
    region: dict[str, int],
    peak: int,
    reason: str | None,
) -> None:
    info = backend.prepare_snapshot(bundle_files("retry-cascade"))
    snap = fake.snapshots["forklab-runner"]
    snap.update({("regionIds" if k == "regions" else k): v for k, v in snapshot.items()})
    if "regions" in snapshot:
        snap["regionIds"] = list(snapshot["regions"])  # type: ignore[call-overload]
    if region:
        fake.set_region("eu", **{"cpu": 8, "mem": 16, **region})
    problems = backend.preflight(info.id, peak)
    if reason is None:
        assert problems == []
    else:
        assert any(reason in p for p in problems), problems
    assert fake.created == []  # no compute


def test_preflight_no_quota_in_region(fake: FakeDaytona, backend: DaytonaSandboxBackend) -> None:
    info = backend.prepare_snapshot(bundle_files("retry-cascade"))
    fake.regions = []
    assert backend.preflight(info.id, 1) == ["Daytona: the account has no quota in eu"]


def test_wrong_key_is_permanent(fake: FakeDaytona, tmp_path: Path) -> None:
    bad = DaytonaSandboxBackend(options(fake, api_key="wrong"), tmp_path / "b")
    with pytest.raises(SandboxError, match=r"HTTP 401.*DAYTONA_API_KEY") as err:
        bad.prepare_snapshot(bundle_files("retry-cascade"))
    assert not isinstance(err.value, SandboxUnavailableError)


def test_missing_snapshot(fake: FakeDaytona, backend: DaytonaSandboxBackend) -> None:
    info = backend.prepare_snapshot(bundle_files("retry-cascade"))
    fake.snapshots.clear()
    assert "no longer exists" in backend.preflight(info.id, 1)[0]
    with pytest.raises(SandboxNotFoundError, match="404"):
        backend.prepare_snapshot(bundle_files("retry-cascade"))


@pytest.mark.parametrize(("route", "status"), [("create", 409), ("create", 429), ("create", 500)])
def test_transient_create_failures(
    fake: FakeDaytona, backend: DaytonaSandboxBackend, route: str, status: int
) -> None:
    info = backend.prepare_snapshot(bundle_files("retry-cascade"))
    fake.fail(route, status)
    with pytest.raises(SandboxUnavailableError, match=f"HTTP {status}"):
        backend.create(info.id, LABELS, Limits())
    assert backend.create(info.id, LABELS, Limits())  # it passes: a retry succeeds


def test_server_errors_on_list_and_usage(fake: FakeDaytona, backend: DaytonaSandboxBackend) -> None:
    info = backend.prepare_snapshot(bundle_files("retry-cascade"))
    fake.fail("list", 503)
    with pytest.raises(SandboxUnavailableError, match="503"):
        backend.list({})
    fake.fail("usage", 502)
    with pytest.raises(SandboxUnavailableError):
        backend.preflight(info.id, 1)


def test_create_timeout_deletes_the_half_created_sandbox(
    fake: FakeDaytona, backend: DaytonaSandboxBackend
) -> None:
    info = backend.prepare_snapshot(bundle_files("retry-cascade"))
    fake.hang_create = True
    with pytest.raises(SandboxUnavailableError, match="deleted the half-created sandbox sbx-"):
        backend.create(info.id, LABELS, Limits())
    assert len(fake.created) == 1 and fake.live() == []


async def test_cleanup_reports_a_sandbox_that_never_deletes(
    fake: FakeDaytona, backend: DaytonaSandboxBackend, tmp_path: Path
) -> None:
    info = backend.prepare_snapshot(bundle_files("retry-cascade"))
    stuck = backend.create(info.id, {**LABELS, "forklab.world": "stuck"}, Limits())
    backend.create(info.id, LABELS, Limits())
    fake.undeletable.add("stuck")
    store = LocalArtifactStore(tmp_path / "artifacts")
    acts = SandboxActivities(backend, store, SharedSnapshots(backend, store))
    result = await ActivityEnvironment().run(
        acts.cleanup_sandboxes, CleanupInput(experiment_id="exp-1", run_key="forklab-exp-1/run-1")
    )
    assert (result.found, result.removed, result.left) == (2, 1, 1)
    assert fake.live() == [stuck]


async def test_an_attempt_that_fails_in_daytona_names_its_sandbox(
    fake: FakeDaytona, backend: DaytonaSandboxBackend, tmp_path: Path
) -> None:
    """A 5xx from the toolbox fails the attempt (retryable); its failure's details name the
    sandbox Daytona created, so the unit's outcome can too when no attempt succeeds."""
    store = LocalArtifactStore(tmp_path / "artifacts")
    snapshots = SharedSnapshots(backend, store)
    info = snapshots.prepare(bundle_files("retry-cascade"))
    acts = SandboxActivities(backend, store, snapshots)
    fake.fail("exec", 500)
    inp = PrefixInput(
        experiment_id="exp-1",
        run_key="forklab-exp-1/run-1",
        job=RunnerJob(workload="retry-cascade", params={}, seed=1),
        snapshot_id=info.id,
        chunk=EpisodeChunk(index=0, first=0, stop=4),
        reservation_seconds=60,
    )
    with pytest.raises(ApplicationError) as err:
        await ActivityEnvironment().run(acts.run_prefixes, inp)
    assert not err.value.non_retryable and "HTTP 500" in str(err.value)
    [created] = fake.created
    assert err.value.details[0]["sandbox_id"] == created["id"]
    assert fake.live() == []  # the failed attempt deleted its sandbox all the same


def test_doctor_reports_and_deletes_leftovers(
    temporal_env: WorkflowEnvironment,
    fake: FakeDaytona,
    backend: DaytonaSandboxBackend,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    info = backend.prepare_snapshot(bundle_files("retry-cascade"))
    left = backend.create(info.id, LABELS, Limits())
    fake.boxes["sbx-not-ours"] = fake.boxes[left].__class__(
        dto={**fake.boxes[left].dto, "id": "sbx-not-ours", "labels": {"team": "x"}},
        root=tmp_path,
    )
    for var, value in {
        "FORKLAB_SANDBOX": "daytona",
        "DAYTONA_API_KEY": API_KEY,
        "DAYTONA_API_URL": fake.api_url,
        "DAYTONA_TARGET": "eu",
        "FORKLAB_DAYTONA_SNAPSHOT": "forklab-runner",
    }.items():
        monkeypatch.setenv(var, value)
    home = str(tmp_path / "home")
    code, out, _ = run_cli(capsys, "doctor", "--home", home)
    assert code == 1 and left in out and "sbx-not-ours" not in out
    address = temporal_env.client.service_client.config.target_host
    code, out, _ = run_cli(capsys, "doctor", "--home", home, "--address", address, "--delete")
    assert code == 0 and "removed 1, left 0" in out  # its run is not running in Temporal
    assert fake.live() == ["sbx-not-ours"]  # only ForkLab's own sandboxes are touched


def test_backend_settings(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    settings = Settings.load({"home": tmp_path}, env={})
    assert sandbox_backend(settings, {}).name == "local"
    with pytest.raises(ConfigError, match="DAYTONA_API_KEY"):
        sandbox_backend(settings, {"FORKLAB_SANDBOX": "daytona"})
    with pytest.raises(ConfigError, match="FORKLAB_DAYTONA_SNAPSHOT"):
        sandbox_backend(
            settings,
            {"FORKLAB_SANDBOX": "daytona", "DAYTONA_API_KEY": "k", "DAYTONA_TARGET": "eu"},
        )
    with pytest.raises(ConfigError, match="use local or daytona"):
        sandbox_backend(settings, {"FORKLAB_SANDBOX": "docker"})
