"""The SQLite ledger: round trips, upserts that never duplicate, schema versioning, and
two processes writing at once without corrupting the file."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
from contextlib import closing
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from pydantic import ValidationError

from forklab.activities.stores.ledger import (
    ExperimentRecord,
    LedgerError,
    SqliteLedger,
    WorldRecord,
)
from tests.helpers import ROOT

T0 = datetime(2026, 11, 29, 15, 0, tzinfo=UTC)


def experiment(run_id: str = "run-1", **changes: object) -> ExperimentRecord:
    record = ExperimentRecord(
        experiment_id="recovery-counter",
        run_id=run_id,
        status="running",
        hypothesis="refresh rescues stuck sensors",
        plan_fingerprint="f" * 64,
        spec_json='{"id": "recovery-counter"}',
        budget_json='{"max_world_seconds": 600}',
        approval_json='{"approver": "ada", "non_interactive": false}',
        created_at=T0,
        updated_at=T0,
    )
    return record.model_copy(update=changes)


def world(name: str, run_id: str = "run-1", **changes: object) -> WorldRecord:
    record = WorldRecord(
        experiment_id="recovery-counter",
        run_id=run_id,
        world=name,
        role="treatment",
        status="completed",
        snapshot_id="local:" + "a" * 64,
        code_digest="a" * 64,
        world_seconds=1.25,
        episodes=300,
        failures=120,
        outcomes_digest="b" * 64,
        checks_json='[{"name": "completion", "passed": true}]',
        created_at=T0,
    )
    return record.model_copy(update=changes)


@pytest.fixture
def ledger(tmp_path: Path) -> SqliteLedger:
    return SqliteLedger(tmp_path / "home" / "ledger.sqlite")


def test_records_round_trip(ledger: SqliteLedger) -> None:
    assert ledger.experiment("recovery-counter") is None
    assert ledger.worlds("recovery-counter") == []
    root = experiment(report_digest="c" * 64)
    ledger.record_experiment(root)
    ledger.record_world(world("refresh"))
    ledger.record_world(world("baseline", role="baseline", error=None))
    assert ledger.experiment("recovery-counter") == root
    assert [w.world for w in ledger.worlds("recovery-counter")] == ["baseline", "refresh"]
    assert ledger.worlds("recovery-counter")[1] == world("refresh")
    mode = sqlite3.connect(ledger.path).execute("PRAGMA journal_mode").fetchone()[0]
    assert mode == "wal"


def test_upserts_never_duplicate_and_keep_the_first_creation_time(ledger: SqliteLedger) -> None:
    ledger.record_experiment(experiment())
    done = experiment(
        status="completed",
        report_digest="d" * 64,
        created_at=T0 + timedelta(minutes=5),
        updated_at=T0 + timedelta(minutes=9),
    )
    ledger.record_experiment(done)  # e.g. the same activity retried after a crash
    ledger.record_experiment(done)
    ledger.record_world(world("refresh"))
    for _ in range(3):
        ledger.record_world(world("refresh", failures=100, created_at=T0 + timedelta(hours=1)))
    stored = ledger.experiment("recovery-counter")
    assert stored == done.model_copy(update={"created_at": T0})
    worlds = ledger.worlds("recovery-counter")
    assert len(worlds) == 1
    assert (worlds[0].failures, worlds[0].created_at) == (100, T0)
    with sqlite3.connect(ledger.path) as conn:
        assert conn.execute("SELECT count(*) FROM experiments").fetchone()[0] == 1
        assert conn.execute("SELECT count(*) FROM worlds").fetchone()[0] == 1


def test_runs_are_kept_apart(ledger: SqliteLedger) -> None:
    ledger.record_experiment(experiment("run-1"))
    later = experiment("run-2", created_at=T0 + timedelta(days=1), updated_at=T0)
    ledger.record_experiment(later)
    ledger.record_world(world("refresh", "run-1"))
    ledger.record_world(world("refresh", "run-2", created_at=T0 + timedelta(days=1)))
    assert ledger.experiment("recovery-counter") == later
    assert ledger.experiment("recovery-counter", "run-1") == experiment("run-1")
    assert [w.run_id for w in ledger.worlds("recovery-counter")] == ["run-1", "run-2"]
    assert [w.run_id for w in ledger.worlds("recovery-counter", "run-2")] == ["run-2"]


def test_bad_records_are_refused_naming_the_field() -> None:
    with pytest.raises(ValidationError, match="spec_json"):
        experiment().model_validate({**experiment().model_dump(), "spec_json": "{not json"})
    with pytest.raises(ValidationError, match="created_at"):
        experiment().model_validate(
            {**experiment().model_dump(), "created_at": datetime(2026, 1, 1)}  # naive
        )
    with pytest.raises(ValidationError, match="exceed episodes"):
        WorldRecord.model_validate({**world("x").model_dump(), "failures": 301})


def test_foreign_schema_and_non_ledger_files_are_refused(tmp_path: Path) -> None:
    newer = tmp_path / "newer.sqlite"
    with sqlite3.connect(newer) as conn:
        conn.execute("PRAGMA user_version = 99")
    with pytest.raises(LedgerError, match="schema version 99"):
        SqliteLedger(newer).experiment("x")
    garbage = tmp_path / "garbage.sqlite"
    garbage.write_bytes(b"this is not a database at all" * 200)
    with pytest.raises(LedgerError, match="move the file aside"):
        SqliteLedger(garbage).experiment("x")


def test_a_ledger_of_schema_1_is_upgraded_in_place(tmp_path: Path) -> None:
    """Version 2 added the workload bundle digest to the experiment rows; an older ledger
    keeps its rows and gains the column (NULL: those runs predate bundles)."""
    old = tmp_path / "old.sqlite"
    ledger = SqliteLedger(old)
    ledger.record_experiment(experiment())
    with closing(sqlite3.connect(old)) as conn:  # back to what schema 1 wrote
        conn.execute("ALTER TABLE experiments DROP COLUMN workload_bundle")
        conn.execute("DROP TABLE forks")
        conn.execute("PRAGMA user_version = 1")
        conn.commit()
    upgraded = SqliteLedger(old)
    assert upgraded.experiment("recovery-counter") == experiment()
    upgraded.record_experiment(experiment("run-2", workload_bundle="c" * 64))
    assert upgraded.experiment("recovery-counter", "run-2") == experiment(
        "run-2", workload_bundle="c" * 64
    )
    with closing(sqlite3.connect(old)) as conn:
        assert conn.execute("PRAGMA user_version").fetchone() == (4,)


WRITER = """
import sys
from datetime import UTC, datetime
from pathlib import Path
from forklab.activities.stores.ledger import ExperimentRecord, SqliteLedger, WorldRecord
ledger = SqliteLedger(Path(sys.argv[1]))
me = sys.argv[2]
now = datetime.now(UTC)
for i in range(60):
    ledger.record_experiment(ExperimentRecord(
        experiment_id="shared", run_id=f"run-{i % 5}", status=f"{me}-{i}", hypothesis="h",
        plan_fingerprint="f", spec_json="{}", budget_json="{}", approval_json="{}",
        created_at=now, updated_at=now))
    for run in (f"run-{i % 5}", f"{me}-run"):
        ledger.record_world(WorldRecord(
            experiment_id="shared", run_id=run, world=f"w{i % 7}", role="treatment",
            status="completed", snapshot_id="s", code_digest="c", world_seconds=0.5,
            episodes=10, failures=i % 10, outcomes_digest="o", checks_json="[]",
            created_at=now))
"""


def test_two_processes_writing_at_once_do_not_corrupt_the_ledger(ledger: SqliteLedger) -> None:
    writers = [
        subprocess.Popen([sys.executable, "-c", WRITER, str(ledger.path), name], cwd=ROOT)
        for name in ("a", "b")
    ]
    assert [w.wait(timeout=120) for w in writers] == [0, 0]
    with sqlite3.connect(ledger.path) as conn:
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        assert conn.execute("SELECT count(*) FROM experiments").fetchone()[0] == 5
        # 5 shared runs × 7 worlds, plus each writer's own run × 7 worlds.
        assert conn.execute("SELECT count(*) FROM worlds").fetchone()[0] == 35 + 2 * 7
    latest = ledger.experiment("shared")
    assert latest is not None and latest.status.split("-")[0] in {"a", "b"}
    assert len(ledger.worlds("shared", "a-run")) == len(ledger.worlds("shared", "b-run")) == 7


CREATORS = """
import multiprocessing as mp
import sys
from datetime import UTC, datetime
from pathlib import Path
from forklab.activities.stores.ledger import ExperimentRecord, SqliteLedger

def create(path, me, go):
    go.wait()
    now = datetime.now(UTC)
    SqliteLedger(Path(path)).record_experiment(ExperimentRecord(
        experiment_id="new", run_id=me, status="running", hypothesis="h", plan_fingerprint="f",
        spec_json="{}", budget_json="{}", approval_json="{}", created_at=now, updated_at=now))

if __name__ == "__main__":
    ctx = mp.get_context("fork")
    failed = 0
    for n in range(int(sys.argv[2])):
        go = ctx.Event()
        path = Path(sys.argv[1]) / str(n) / "ledger.sqlite"
        procs = [ctx.Process(target=create, args=(str(path), str(i), go)) for i in range(8)]
        for p in procs:
            p.start()
        go.set()
        for p in procs:
            p.join()
        failed += sum(p.exitcode != 0 for p in procs)
    print(failed)
"""


def test_processes_creating_the_same_new_ledger_at_once_all_succeed(tmp_path: Path) -> None:
    """SQLite refuses some concurrent switches of a new file to WAL at once, without waiting
    out the busy timeout; without a retry about one round in seven loses a writer here."""
    done = subprocess.run(
        [sys.executable, "-c", CREATORS, str(tmp_path), "30"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "0", done.stderr[-2000:]
    for i in range(30):
        with closing(sqlite3.connect(tmp_path / str(i) / "ledger.sqlite")) as conn:
            assert conn.execute("SELECT count(*) FROM experiments").fetchone()[0] == 8
