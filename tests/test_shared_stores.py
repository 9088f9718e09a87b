"""The shared state stores on real servers: the S3 artifact store on a moto server, the
PostgreSQL ledger on the machine's PostgreSQL (a database of its own), both keeping the
local backends' contract, riding out an outage, and refusing what they cannot use."""

from __future__ import annotations

import hashlib
import pickle
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
from stores_lab import S3_ENV, Proxy, make_bucket, moto_server, postgres_database

from forklab.activities.experiment.runner_bundle import bundle_files, code_digest
from forklab.activities.sandbox.local import LocalSandboxBackend
from forklab.activities.sandbox.shared_snapshots import SharedSnapshots
from forklab.activities.stores.artifacts import (
    ArtifactError,
    ArtifactStore,
    LocalArtifactStore,
    run_name,
)
from forklab.activities.stores.artifacts_s3 import S3ArtifactStore
from forklab.activities.stores.ledger import Ledger, SqliteLedger
from forklab.activities.stores.ledger_postgres import MIGRATIONS, PostgresLedger
from forklab.activities.stores.outages import StoreUnavailableError
from forklab.activities.stores.postgres import Migration, PostgresDatabase, SchemaError, redacted
from forklab.workers.config import ConfigError, Settings
from forklab.workers.stores import artifact_store, check_stores, ledger
from tests.helpers import ROOT
from tests.test_ledger import T0, experiment, world


@pytest.fixture(scope="module")
def s3_endpoint() -> Iterator[str]:
    with moto_server() as url:
        yield url


@pytest.fixture
def s3_settings(s3_endpoint: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Settings:
    for key, value in S3_ENV.items():
        monkeypatch.setenv(key, value)
    bucket = f"forklab-{uuid.uuid4().hex[:8]}"
    make_bucket(s3_endpoint, bucket)
    return Settings.load(
        {"home": tmp_path / "home"},
        env={
            "FORKLAB_ARTIFACTS": f"s3://{bucket}/runs/a",
            "FORKLAB_S3_ENDPOINT": s3_endpoint,
            "FORKLAB_STORE_RETRY_SECONDS": "20",
        },
    )


@pytest.fixture
def database() -> Iterator[str]:
    with postgres_database() as url:
        yield url


def _in_thread(fn: Callable[[], Any]) -> tuple[threading.Thread, list[Any]]:
    box: list[Any] = []

    def run() -> None:
        try:
            box.append(fn())
        except BaseException as exc:
            box.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    return thread, box


# --- the S3 artifact store ------------------------------------------------------------------
def test_s3_store_keeps_the_local_contract(s3_settings: Settings, tmp_path: Path) -> None:
    store = artifact_store(s3_settings)
    assert isinstance(store, S3ArtifactStore)
    local = LocalArtifactStore(tmp_path / "local")
    data = b"checkpoint\x00bytes" * 1000
    digest = store.put_bytes(data)
    assert digest == hashlib.sha256(data).hexdigest() == local.put_bytes(data)
    assert store.key(digest) == f"runs/a/{digest[:2]}/{digest[2:]}"
    assert store.get_bytes(digest) == data
    assert store.put_bytes(data) == digest  # idempotent
    # the analysis gets the store in a process pool: it travels without its client
    assert pickle.loads(pickle.dumps(store)).get_bytes(digest) == data
    value = {"b": [1, 2], "a": "x"}
    assert store.put_json(value) == local.put_json(value)
    assert store.get_json(store.put_json(value)) == value
    absent = hashlib.sha256(b"never stored").hexdigest()
    with pytest.raises(ArtifactError, match=r"missing from s3://.*/runs/a"):
        store.get_bytes(absent)
    with pytest.raises(ArtifactError, match="not a sha256 hex digest"):
        store.get_bytes("../../etc/passwd")


def test_s3_end_marks_are_empty_objects_named_by_the_run_hash(s3_settings: Settings) -> None:
    store = artifact_store(s3_settings)
    assert isinstance(store, S3ArtifactStore)
    name = run_name("wf/run-1")
    assert store.ended([name]) == set()
    store.mark_ended("wf/run-1")
    assert store.mark_key(name) == f"runs/a/ended/{name}"
    body = store._client.get_object(Bucket=store.bucket, Key=store.mark_key(name))["Body"]
    assert body.read() == b""
    assert store.ended([name, run_name("wf/run-2"), "../" + name]) == {name}


def test_s3_store_reports_a_damaged_object_and_a_put_repairs_it(s3_settings: Settings) -> None:
    store = artifact_store(s3_settings)
    assert isinstance(store, S3ArtifactStore)
    digest = store.put_bytes(b"the real outcomes")
    store._client.put_object(Bucket=store.bucket, Key=store.key(digest), Body=b"tampered")
    with pytest.raises(ArtifactError, match="is corrupt"):
        store.get_bytes(digest)
    store.put_bytes(b"the real outcomes")
    assert store.get_bytes(digest) == b"the real outcomes"


def test_s3_store_waits_out_an_outage_and_gives_up_after_its_window(
    s3_endpoint: str, s3_settings: Settings
) -> None:
    host, _, port = s3_endpoint.removeprefix("http://").partition(":")
    proxy = Proxy(host, int(port))
    via_proxy = s3_settings.model_copy(update={"s3_endpoint": f"http://{proxy.address}"})
    store = artifact_store(via_proxy)
    proxy.down()
    thread, box = _in_thread(lambda: store.put_bytes(b"written during the outage"))
    time.sleep(2.0)
    assert thread.is_alive() and not box  # still waiting, not failed
    proxy.up()
    thread.join(timeout=30)
    assert box == [hashlib.sha256(b"written during the outage").hexdigest()]
    assert artifact_store(s3_settings).get_bytes(box[0]) == b"written during the outage"

    short = artifact_store(via_proxy.model_copy(update={"store_retry_seconds": 1.0}))
    proxy.down()
    with pytest.raises(StoreUnavailableError, match=r"object store s3://.* is unreachable"):
        short.get_bytes(box[0])
    proxy.down()


def test_a_worker_refuses_a_missing_bucket_with_the_fix(s3_settings: Settings) -> None:
    missing = s3_settings.model_copy(update={"artifacts": "s3://no-such-bucket/x"})
    with pytest.raises(ConfigError, match="create the bucket"):
        check_stores(missing)


def test_store_settings_are_checked() -> None:
    with pytest.raises(ConfigError, match=r"FORKLAB_ARTIFACTS.*s3://bucket/prefix"):
        Settings.load(env={"FORKLAB_ARTIFACTS": "gs://bucket/x"})
    with pytest.raises(ConfigError, match=r"FORKLAB_ARTIFACTS.*bucket name"):
        Settings.load(env={"FORKLAB_ARTIFACTS": "s3:///x"})
    with pytest.raises(ConfigError, match=r"FORKLAB_LEDGER.*postgresql://"):
        Settings.load(env={"FORKLAB_LEDGER": "mysql://db/x"})
    with pytest.raises(ConfigError, match=r"FORKLAB_S3_ENDPOINT.*http"):
        Settings.load(env={"FORKLAB_S3_ENDPOINT": "minio:9000"})
    shared = Settings.load(env={"FORKLAB_LEDGER": "postgresql://u:secret@db:5432/forklab"})
    assert shared.shared_ledger and not shared.shared_artifacts
    assert redacted(shared.ledger) == "postgresql://u:***@db:5432/forklab"


# --- the ledger: one contract, two backends ---------------------------------------------------
@pytest.fixture(params=["sqlite", "postgresql"])
def any_ledger(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Ledger]:
    if request.param == "sqlite":
        yield SqliteLedger(tmp_path / "ledger.sqlite")
        return
    with postgres_database() as url:
        yield ledger(Settings.load(env={"FORKLAB_LEDGER": url}))


def test_both_ledgers_round_trip_and_upsert_alike(any_ledger: Ledger) -> None:
    assert any_ledger.experiment("recovery-counter") is None
    assert any_ledger.worlds("recovery-counter") == []
    root = experiment(report_digest="c" * 64)
    any_ledger.record_experiment(root)
    any_ledger.record_world(world("refresh"))
    any_ledger.record_world(world("baseline", role="baseline"))
    assert any_ledger.experiment("recovery-counter") == root
    assert [w.world for w in any_ledger.worlds("recovery-counter")] == ["baseline", "refresh"]
    assert any_ledger.worlds("recovery-counter")[1] == world("refresh")
    # a retried write rewrites its row and keeps the first creation time
    done = experiment(
        status="completed",
        report_digest="d" * 64,
        created_at=T0 + timedelta(minutes=5),
        updated_at=T0 + timedelta(minutes=9),
    )
    any_ledger.record_experiment(done)
    any_ledger.record_experiment(done)
    for _ in range(3):
        any_ledger.record_world(world("refresh", failures=100, created_at=T0 + timedelta(hours=1)))
    assert any_ledger.experiment("recovery-counter") == done.model_copy(update={"created_at": T0})
    refresh = [w for w in any_ledger.worlds("recovery-counter") if w.world == "refresh"]
    assert [(w.failures, w.created_at) for w in refresh] == [(100, T0)]
    # runs are kept apart; the latest is the default
    later = experiment("run-2", created_at=T0 + timedelta(days=1), updated_at=T0)
    any_ledger.record_experiment(later)
    any_ledger.record_world(world("refresh", "run-2", created_at=T0 + timedelta(days=1)))
    assert any_ledger.experiment("recovery-counter") == later
    assert any_ledger.experiment("recovery-counter", "run-1") == done.model_copy(
        update={"created_at": T0}
    )
    assert [w.run_id for w in any_ledger.worlds("recovery-counter", "run-2")] == ["run-2"]
    assert len(any_ledger.worlds("recovery-counter")) == 3


def test_postgres_schema_is_migrated_once_and_a_newer_one_refused(database: str) -> None:
    db = PostgresDatabase(database)
    known = MIGRATIONS[-1].version
    assert db.migrate("ledger", MIGRATIONS) == known
    assert db.migrate("ledger", MIGRATIONS) == known  # a no-op the second time
    extra = Migration(
        version=known + 1, name="an index", sql="CREATE INDEX w_status ON ledger_worlds (status)"
    )
    assert db.migrate("ledger", [*MIGRATIONS, extra]) == known + 1
    with psycopg.connect(database) as conn:
        rows = conn.execute("SELECT component, version, name FROM forklab_schema").fetchall()
    assert rows == [("ledger", m.version, m.name) for m in [*MIGRATIONS, extra]]
    assert [r[2] for r in rows[:3]] == [
        "experiments and worlds",
        "workload bundle digest",
        "forks of experiments over cohorts",
    ]
    with pytest.raises(
        SchemaError, match=f"schema version {known + 1} but this ForkLab knows version {known}"
    ):
        PostgresLedger(db).experiment("x")
    with pytest.raises(ValueError, match=r"numbered 1\.\.n"):
        db.migrate("effects", [extra])


MIGRATOR = """
import sys
from forklab.activities.stores.ledger_postgres import PostgresLedger
from forklab.activities.stores.postgres import PostgresDatabase
PostgresLedger(PostgresDatabase(sys.argv[1])).record_world(__import__("tests.test_ledger",
    fromlist=["world"]).world(sys.argv[2]))
"""


def test_workers_starting_together_migrate_once(database: str) -> None:
    procs = [
        subprocess.Popen([sys.executable, "-c", MIGRATOR, database, f"w{i}"], cwd=ROOT)
        for i in range(6)
    ]
    assert [p.wait(timeout=120) for p in procs] == [0] * 6
    with psycopg.connect(database) as conn:
        assert conn.execute("SELECT count(*) FROM forklab_schema").fetchone() == (len(MIGRATIONS),)
        assert conn.execute("SELECT count(*) FROM ledger_worlds").fetchone() == (6,)


def test_postgres_ledger_waits_out_an_outage(database: str) -> None:
    proxy = Proxy("127.0.0.1", 5432)
    url = database.replace("127.0.0.1:5432", proxy.address)
    records = PostgresLedger(PostgresDatabase(url, retry_seconds=30))
    records.record_experiment(experiment())  # migrates while the server is up
    proxy.down()
    thread, box = _in_thread(lambda: records.record_world(world("refresh")))
    time.sleep(2.0)
    assert thread.is_alive() and not box
    proxy.up()
    thread.join(timeout=30)
    assert box == [None]
    assert [w.world for w in records.worlds("recovery-counter")] == ["refresh"]
    proxy.down()
    short = PostgresLedger(PostgresDatabase(url, retry_seconds=1.0))
    with pytest.raises(StoreUnavailableError, match=r"PostgreSQL .* is unreachable"):
        short.experiment("recovery-counter")


# --- snapshots travel through the store --------------------------------------------------------
@pytest.mark.parametrize("backend", ["local", "s3"])
def test_a_snapshot_prepared_on_one_host_is_rebuilt_on_another(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    store: ArtifactStore = (
        LocalArtifactStore(tmp_path / "shared")
        if backend == "local"
        else artifact_store(request.getfixturevalue("s3_settings"))
    )
    files = bundle_files("retry-cascade")
    host_a = LocalSandboxBackend(tmp_path / "a")
    info = SharedSnapshots(host_a, store).prepare(files)
    assert info.id == "local:" + code_digest(files)
    host_b = LocalSandboxBackend(tmp_path / "b")
    SharedSnapshots(host_b, store).ensure(info.id)
    folder = tmp_path / "b" / "snapshots" / info.code_digest
    assert sorted(str(p.relative_to(folder)) for p in folder.rglob("*.py")) == sorted(
        f.relpath for f in files
    )


def test_a_tampered_bundle_file_never_becomes_a_snapshot(tmp_path: Path) -> None:
    store = LocalArtifactStore(tmp_path / "shared")
    files = bundle_files("retry-cascade")
    info = SharedSnapshots(LocalSandboxBackend(tmp_path / "a"), store).prepare(files)
    victim = hashlib.sha256(files[-1].source.read_bytes()).hexdigest()
    store.path(victim).write_bytes(b"import os; os.system('steal the keys')\n")
    host_b = LocalSandboxBackend(tmp_path / "b")
    with pytest.raises(ArtifactError, match="is corrupt"):
        SharedSnapshots(host_b, store).ensure(info.id)
    assert not (tmp_path / "b" / "snapshots" / info.code_digest).exists()
