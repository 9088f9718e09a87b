"""The ledger in PostgreSQL, for workers on many hosts: the SQLite ledger's rows and rules
(upserts on the natural key that keep the first ``created_at``, fork rows written once;
nothing is ever deleted) in three tables, ``ledger_experiments``, ``ledger_worlds`` and
``ledger_forks``, created by migrations of the ``ledger`` component (see
``forklab.activities.stores.postgres``).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from forklab.activities.stores.ledger import (
    EXPERIMENT_COLUMNS,
    EXPERIMENT_KEY,
    FORK_COLUMNS,
    FORK_KEY,
    WORLD_COLUMNS,
    WORLD_KEY,
    ExperimentRecord,
    ForkRecord,
    WorldRecord,
    forks_sql,
    insert_once_sql,
    latest_experiment_sql,
    upsert_sql,
    worlds_sql,
)
from forklab.activities.stores.postgres import Conn, Migration, PostgresDatabase, PostgresTables

COMPONENT = "ledger"
EXPERIMENTS = "ledger_experiments"
WORLDS = "ledger_worlds"
FORKS = "ledger_forks"
MIGRATIONS = (
    Migration(
        version=1,
        name="experiments and worlds",
        sql=f"""
CREATE TABLE {EXPERIMENTS} (
    experiment_id    TEXT NOT NULL,
    run_id           TEXT NOT NULL,
    status           TEXT NOT NULL,
    hypothesis       TEXT NOT NULL,
    plan_fingerprint TEXT NOT NULL,
    spec_json        TEXT NOT NULL,
    budget_json      TEXT NOT NULL,
    approval_json    TEXT NOT NULL,
    report_digest    TEXT,
    error            TEXT,
    created_at       TIMESTAMPTZ NOT NULL,
    updated_at       TIMESTAMPTZ NOT NULL,
    PRIMARY KEY (experiment_id, run_id)
);
CREATE TABLE {WORLDS} (
    experiment_id   TEXT NOT NULL,
    run_id          TEXT NOT NULL,
    world           TEXT NOT NULL,
    role            TEXT NOT NULL,
    status          TEXT NOT NULL,
    error           TEXT,
    snapshot_id     TEXT NOT NULL,
    code_digest     TEXT NOT NULL,
    world_seconds   DOUBLE PRECISION NOT NULL,
    episodes        INTEGER NOT NULL,
    failures        INTEGER NOT NULL,
    outcomes_digest TEXT NOT NULL,
    checks_json     TEXT NOT NULL,
    created_at      TIMESTAMPTZ NOT NULL,
    PRIMARY KEY (experiment_id, run_id, world)
);
""",
    ),
    Migration(
        version=2,
        name="workload bundle digest",
        sql=f"ALTER TABLE {EXPERIMENTS} ADD COLUMN workload_bundle TEXT",
    ),
    Migration(
        version=3,
        name="forks of experiments over cohorts",
        sql=f"""
CREATE TABLE {FORKS} (
    experiment_id  TEXT NOT NULL,
    run_id         TEXT NOT NULL,
    fork_id        TEXT NOT NULL,
    cohort_run     TEXT NOT NULL,
    run_index      INTEGER NOT NULL,
    world          TEXT NOT NULL,
    fork           INTEGER NOT NULL,
    status         TEXT NOT NULL,
    outcome        TEXT NOT NULL,
    score          DOUBLE PRECISION,
    tokens         BIGINT NOT NULL,
    seconds        DOUBLE PRECISION NOT NULL,
    lineage_root   TEXT NOT NULL,
    receipt_sha256 TEXT NOT NULL,
    error          TEXT,
    created_at     TIMESTAMPTZ NOT NULL,
    PRIMARY KEY (experiment_id, run_id, fork_id)
);
""",
    ),
    Migration(
        version=4,
        name="the team of a team fork's row",
        sql=f"ALTER TABLE {FORKS} ADD COLUMN team_json TEXT",
    ),
)


def _values(record: BaseModel, columns: tuple[str, ...]) -> list[Any]:
    values = record.model_dump()
    return [values[c] for c in columns]


class PostgresLedger:
    def __init__(self, db: PostgresDatabase) -> None:
        self._tables = PostgresTables(db, COMPONENT, MIGRATIONS)

    @property
    def location(self) -> str:
        return self._tables.location

    def _write(self, sql: str, values: list[Any]) -> int:
        """One write; the number of rows it changed."""

        def write(conn: Conn) -> int:
            return conn.execute(sql.encode(), values).rowcount

        return self._tables.run(write)

    def record_experiment(self, row: ExperimentRecord) -> None:
        sql = upsert_sql(EXPERIMENTS, EXPERIMENT_COLUMNS, EXPERIMENT_KEY, "%s")
        self._write(sql, _values(row, EXPERIMENT_COLUMNS))

    def record_world(self, row: WorldRecord) -> None:
        self._write(upsert_sql(WORLDS, WORLD_COLUMNS, WORLD_KEY, "%s"), _values(row, WORLD_COLUMNS))

    def experiment(self, experiment_id: str, run_id: str | None = None) -> ExperimentRecord | None:
        """The record of ``run_id``, or by default of the experiment's latest run."""
        sql = latest_experiment_sql(EXPERIMENTS, run_id, "%s").encode()
        args = [experiment_id] if run_id is None else [experiment_id, run_id]
        row = self._tables.run(lambda conn: conn.execute(sql, args).fetchone())
        if row is None:
            return None
        return ExperimentRecord(**dict(zip(EXPERIMENT_COLUMNS, row, strict=True)))

    def worlds(self, experiment_id: str, run_id: str | None = None) -> list[WorldRecord]:
        """The experiment's world rows (of one run when ``run_id`` is given), oldest first."""
        sql = worlds_sql(WORLDS, run_id, "%s").encode()
        args = [experiment_id] if run_id is None else [experiment_id, run_id]
        rows = self._tables.run(lambda conn: conn.execute(sql, args).fetchall())
        return [WorldRecord(**dict(zip(WORLD_COLUMNS, r, strict=True))) for r in rows]

    def record_fork(self, row: ForkRecord) -> bool:
        sql = insert_once_sql(FORKS, FORK_COLUMNS, FORK_KEY, "%s")
        values = _values(row, FORK_COLUMNS)
        values[FORK_COLUMNS.index("outcome")] = row.outcome.value
        return self._write(sql, values) == 1

    def forks(self, experiment_id: str, run_id: str) -> list[ForkRecord]:
        sql = forks_sql(FORKS, "%s").encode()
        rows = self._tables.run(lambda conn: conn.execute(sql, [experiment_id, run_id]).fetchall())
        return [ForkRecord(**dict(zip(FORK_COLUMNS, r, strict=True))) for r in rows]
