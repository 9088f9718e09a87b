"""The fork rows of experiments over cohorts in both ledger backends (a SQLite file, a
PostgreSQL database of its own): one row per fork, written once (a second write of the
same fork, as from an activity retried after its worker died, changes nothing and says
so), and a ledger file of the schema before fork rows gains their table."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator
from contextlib import closing
from datetime import timedelta
from pathlib import Path

import pytest
from stores_lab import postgres_database

from forklab.activities.stores.ledger import (
    ForkOutcomeKind,
    ForkRecord,
    Ledger,
    SqliteLedger,
)
from forklab.workers.config import Settings
from forklab.workers.stores import ledger
from tests.test_ledger import T0, experiment


def fork(fork_id: str, **changes: object) -> ForkRecord:
    fields: dict[str, object] = {
        "experiment_id": "support-fixes",
        "run_id": "run-1",
        "fork_id": fork_id,
        "cohort_run": "support-7",
        "run_index": 7,
        "world": "bigger",
        "fork": 2,
        "status": "completed",
        "outcome": ForkOutcomeKind.success,
        "score": 0.75,
        "tokens": 1234,
        "seconds": 2.5,
        "lineage_root": "lin-1",
        "receipt_sha256": "e" * 64,
        "created_at": T0,
    }
    return ForkRecord(**{**fields, **changes})


@pytest.fixture(params=["sqlite", "postgresql"])
def any_ledger(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Ledger]:
    if request.param == "sqlite":
        yield SqliteLedger(tmp_path / "ledger.sqlite")
        return
    with postgres_database() as url:
        yield ledger(Settings.load(env={"FORKLAB_LEDGER": url}))


def test_each_fork_has_one_row_written_once(any_ledger: Ledger) -> None:
    assert any_ledger.forks("support-fixes", "run-1") == []
    first = fork("f-a")
    assert any_ledger.record_fork(first) is True
    # the same fork scored again (a retried activity): the first row stands
    again = fork("f-a", outcome=ForkOutcomeKind.failure, tokens=9, created_at=T0 + timedelta(1))
    assert any_ledger.record_fork(again) is False
    missing = fork("f-b", run_index=2, outcome=ForkOutcomeKind.missing, score=None, error="gone")
    assert any_ledger.record_fork(missing) is True
    any_ledger.record_fork(fork("f-c", run_id="run-2"))
    rows = any_ledger.forks("support-fixes", "run-1")
    assert rows == [missing, first]  # by cohort run, fork, world
    assert any_ledger.forks("support-fixes", "run-2")[0].run_id == "run-2"


def test_a_ledger_before_fork_rows_gains_their_table(tmp_path: Path) -> None:
    old = tmp_path / "old.sqlite"
    SqliteLedger(old).record_experiment(experiment())
    with closing(sqlite3.connect(old)) as conn:  # back to what schema 2 wrote
        conn.execute("DROP TABLE forks")
        conn.execute("PRAGMA user_version = 2")
        conn.commit()
    upgraded = SqliteLedger(old)
    assert upgraded.experiment("recovery-counter") == experiment()
    assert upgraded.record_fork(fork("f-a")) is True
    with closing(sqlite3.connect(old)) as conn:
        assert conn.execute("PRAGMA user_version").fetchone() == (4,)


def test_a_team_forks_row_names_its_team(any_ledger: Ledger) -> None:
    team = json.dumps(
        {
            "team_fork": "f-t",
            "requested_member": "t-researcher",
            "result_member": "t-reviewer",
            "members": {"t-researcher": "f-t/t-researcher", "t-reviewer": "f-t/t-reviewer"},
        },
        sort_keys=True,
    )
    row = fork("f-t", cohort_run="t-researcher", team_json=team)
    assert any_ledger.record_fork(row) is True
    (back,) = any_ledger.forks("support-fixes", "run-1")
    assert back == row and json.loads(back.team_json or "")["result_member"] == "t-reviewer"


def test_a_ledger_before_team_rows_gains_their_column(tmp_path: Path) -> None:
    old = tmp_path / "old.sqlite"
    SqliteLedger(old).record_fork(fork("f-a"))
    with closing(sqlite3.connect(old)) as conn:  # back to what schema 3 wrote
        conn.execute("ALTER TABLE forks DROP COLUMN team_json")
        conn.execute("PRAGMA user_version = 3")
        conn.commit()
    upgraded = SqliteLedger(old)
    assert upgraded.forks("support-fixes", "run-1") == [fork("f-a")]
    assert upgraded.record_fork(fork("f-b", team_json="{}")) is True
    with closing(sqlite3.connect(old)) as conn:
        assert conn.execute("PRAGMA user_version").fetchone() == (4,)
