"""The ledger: every experiment and every world it ran, in rows that are never deleted.

One root row per experiment run (hypothesis, plan, budget, approval, report) and one
child row per world (provenance, spend, outcomes digest, checks); every ending (completed,
refused, rejected, expired, failed, cancelled) writes them. Both writes are upserts on
their natural key, so an activity retried after a crash rewrites its row instead of
adding a second one. An experiment over a cohort also writes one row per fork
(:class:`ForkRecord`: lineage, receipt digest, tokens, outcome) as each fork is scored;
that write inserts once and never overwrites, so a fork scored again by a retried
activity keeps the row written first and is never counted twice. Two backends keep this
contract (:class:`Ledger`): a local SQLite file (:class:`SqliteLedger`, the default) and
PostgreSQL (``forklab.activities.stores.ledger_postgres.PostgresLedger``) for workers on
many hosts.

The SQLite file uses WAL so that several worker processes can write at once; each call
opens its own connection, which keeps the class thread-safe.
"""

from __future__ import annotations

import json
import random
import sqlite3
import time
from collections.abc import Iterator
from contextlib import closing, contextmanager
from datetime import UTC, datetime
from enum import StrEnum
from pathlib import Path
from typing import Any, Protocol

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, field_validator, model_validator

SCHEMA_VERSION = 4
_BUSY_TIMEOUT_S = 30.0

_SCHEMA = """
CREATE TABLE experiments (
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
    created_at       TEXT NOT NULL,
    updated_at       TEXT NOT NULL,
    workload_bundle  TEXT,
    PRIMARY KEY (experiment_id, run_id)
);
CREATE TABLE worlds (
    experiment_id   TEXT NOT NULL,
    run_id          TEXT NOT NULL,
    world           TEXT NOT NULL,
    role            TEXT NOT NULL,
    status          TEXT NOT NULL,
    error           TEXT,
    snapshot_id     TEXT NOT NULL,
    code_digest     TEXT NOT NULL,
    world_seconds   REAL NOT NULL,
    episodes        INTEGER NOT NULL,
    failures        INTEGER NOT NULL,
    outcomes_digest TEXT NOT NULL,
    checks_json     TEXT NOT NULL,
    created_at      TEXT NOT NULL,
    PRIMARY KEY (experiment_id, run_id, world)
);
"""

_FORKS = """
CREATE TABLE IF NOT EXISTS forks (
    experiment_id  TEXT NOT NULL,
    run_id         TEXT NOT NULL,
    fork_id        TEXT NOT NULL,
    cohort_run     TEXT NOT NULL,
    run_index      INTEGER NOT NULL,
    world          TEXT NOT NULL,
    fork           INTEGER NOT NULL,
    status         TEXT NOT NULL,
    outcome        TEXT NOT NULL,
    score          REAL,
    tokens         INTEGER NOT NULL,
    seconds        REAL NOT NULL,
    lineage_root   TEXT NOT NULL,
    receipt_sha256 TEXT NOT NULL,
    error          TEXT,
    created_at     TEXT NOT NULL,
    PRIMARY KEY (experiment_id, run_id, fork_id)
)
"""

#: A team fork's row names its team (``ForkRecord.team_json``).
_FORKS_TEAM = "ALTER TABLE forks ADD COLUMN team_json TEXT"

#: Upgrades of a ledger file from the version before each key (1 is ``_SCHEMA`` as it was).
_UPGRADES = {
    2: "ALTER TABLE experiments ADD COLUMN workload_bundle TEXT",
    3: _FORKS,
    4: _FORKS_TEAM,
}


class LedgerError(RuntimeError):
    """The ledger file cannot be used; the message says why and what to do."""


def _json_text(value: str) -> str:
    """Keep ``*_json`` columns parseable: a ValueError here is reported against the field."""
    json.loads(value)
    return value


class ExperimentRecord(BaseModel):
    """The root row of one experiment run. Timestamps come from the caller."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    experiment_id: str = Field(min_length=1)
    run_id: str = Field(min_length=1)
    status: str = Field(min_length=1)
    hypothesis: str
    plan_fingerprint: str
    spec_json: str
    budget_json: str
    approval_json: str
    report_digest: str | None = None
    error: str | None = None
    created_at: AwareDatetime
    updated_at: AwareDatetime
    workload_bundle: str | None = Field(
        default=None, description="Digest of the workload bundle the run was started with."
    )

    @field_validator("spec_json", "budget_json", "approval_json")
    @classmethod
    def _is_json(cls, value: str) -> str:
        return _json_text(value)


class WorldRecord(BaseModel):
    """One world of one experiment run: where it ran, what it spent, what it produced."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    experiment_id: str = Field(min_length=1)
    run_id: str = Field(min_length=1)
    world: str = Field(min_length=1)
    role: str
    status: str = Field(min_length=1)
    error: str | None = None
    snapshot_id: str
    code_digest: str
    world_seconds: float = Field(ge=0)
    episodes: int = Field(ge=0)
    failures: int = Field(ge=0)
    outcomes_digest: str
    checks_json: str
    created_at: AwareDatetime

    @field_validator("checks_json")
    @classmethod
    def _is_json(cls, value: str) -> str:
        return _json_text(value)

    @model_validator(mode="after")
    def _failures_within_episodes(self) -> WorldRecord:
        if self.failures > self.episodes:
            raise ValueError(f"failures ({self.failures}) exceed episodes ({self.episodes})")
        return self


class ForkOutcomeKind(StrEnum):
    success = "success"
    failure = "failure"
    #: the fork could not be started, read or scored (never counted as a failure)
    missing = "missing"


class ForkRecord(BaseModel):
    """One fork of an experiment over a cohort: which recorded run and world it forked,
    its lineage and receipt, what it spent and its outcome."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    experiment_id: str = Field(min_length=1)
    run_id: str = Field(min_length=1)
    fork_id: str = Field(min_length=1)
    cohort_run: str
    run_index: int = Field(ge=0)
    world: str = Field(min_length=1)
    fork: int = Field(ge=0)
    status: str = Field(min_length=1)
    outcome: ForkOutcomeKind
    score: float | None = None
    tokens: int = Field(ge=0)
    seconds: float = Field(ge=0)
    lineage_root: str
    receipt_sha256: str
    error: str | None = None
    created_at: AwareDatetime
    #: the fork of a whole team (``cohort.team``): the team fork, the requested and result
    #: members, and each member's fork id (or its role when it has none); None for a run
    #: forked alone
    team_json: str | None = None


EXPERIMENT_KEY = ("experiment_id", "run_id")
WORLD_KEY = ("experiment_id", "run_id", "world")
EXPERIMENT_COLUMNS = tuple(ExperimentRecord.model_fields)
WORLD_COLUMNS = tuple(WorldRecord.model_fields)
FORK_KEY = ("experiment_id", "run_id", "fork_id")
FORK_COLUMNS = tuple(ForkRecord.model_fields)
_TIMESTAMPS = frozenset({"created_at", "updated_at"})


def upsert_sql(
    table: str, columns: tuple[str, ...], key: tuple[str, ...], placeholder: str = "?"
) -> str:
    """INSERT, or on a key conflict overwrite every column except the key and created_at
    (a retried write keeps the time the row was first recorded). SQLite and PostgreSQL
    both speak this ``ON CONFLICT`` form."""
    updates = ", ".join(f"{c} = excluded.{c}" for c in columns if c not in (*key, "created_at"))
    return (
        f"INSERT INTO {table} ({', '.join(columns)}) "
        f"VALUES ({', '.join(placeholder for _ in columns)}) "
        f"ON CONFLICT ({', '.join(key)}) DO UPDATE SET {updates}"
    )


def insert_once_sql(
    table: str, columns: tuple[str, ...], key: tuple[str, ...], placeholder: str = "?"
) -> str:
    """INSERT, or nothing when a row with the key exists: the first write stands."""
    return (
        f"INSERT INTO {table} ({', '.join(columns)}) "
        f"VALUES ({', '.join(placeholder for _ in columns)}) "
        f"ON CONFLICT ({', '.join(key)}) DO NOTHING"
    )


def forks_sql(table: str, placeholder: str = "?") -> str:
    return (
        f"SELECT {', '.join(FORK_COLUMNS)} FROM {table} "
        f"WHERE experiment_id = {placeholder} AND run_id = {placeholder} "
        "ORDER BY run_index, fork, world"
    )


def latest_experiment_sql(table: str, run_id: str | None, placeholder: str = "?") -> str:
    sql = f"SELECT {', '.join(EXPERIMENT_COLUMNS)} FROM {table} WHERE experiment_id = {placeholder}"
    if run_id is not None:
        sql += f" AND run_id = {placeholder}"
    return sql + " ORDER BY created_at DESC, run_id DESC LIMIT 1"


def worlds_sql(table: str, run_id: str | None, placeholder: str = "?") -> str:
    sql = f"SELECT {', '.join(WORLD_COLUMNS)} FROM {table} WHERE experiment_id = {placeholder}"
    if run_id is not None:
        sql += f" AND run_id = {placeholder}"
    return sql + " ORDER BY created_at, run_id, world"


class Ledger(Protocol):
    """What the record activities and the CLI need from a ledger backend."""

    @property
    def location(self) -> str:
        """Where the rows are, for messages (never with credentials)."""
        ...

    def record_experiment(self, row: ExperimentRecord) -> None: ...

    def record_world(self, row: WorldRecord) -> None: ...

    def experiment(self, experiment_id: str, run_id: str | None = None) -> ExperimentRecord | None:
        """The record of ``run_id``, or by default of the experiment's latest run."""
        ...

    def worlds(self, experiment_id: str, run_id: str | None = None) -> list[WorldRecord]:
        """The experiment's world rows (of one run when ``run_id`` is given), oldest first."""
        ...

    def record_fork(self, row: ForkRecord) -> bool:
        """Insert the fork's row unless it is there; True when this call wrote it."""
        ...

    def forks(self, experiment_id: str, run_id: str) -> list[ForkRecord]:
        """The fork rows of one experiment run, by cohort run, fork index and world."""
        ...


def to_row(record: BaseModel, columns: tuple[str, ...]) -> list[Any]:
    values = record.model_dump()
    return [
        values[c].astimezone(UTC).isoformat(timespec="microseconds")
        if c in _TIMESTAMPS
        else values[c]
        for c in columns
    ]


def from_row(columns: tuple[str, ...], row: tuple[Any, ...]) -> dict[str, Any]:
    return {
        c: datetime.fromisoformat(v) if c in _TIMESTAMPS else v
        for c, v in zip(columns, row, strict=True)
    }


class SqliteLedger:
    def __init__(self, path: Path) -> None:
        self.path = path
        self._ready = False

    @property
    def location(self) -> str:
        return str(self.path)

    @contextmanager
    def _connect(self) -> Iterator[sqlite3.Connection]:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with closing(
            sqlite3.connect(self.path, timeout=_BUSY_TIMEOUT_S, isolation_level=None)
        ) as conn:
            try:
                if not self._ready:
                    self._prepare(conn)
                    self._ready = True
                yield conn
            except sqlite3.DatabaseError as exc:
                if type(exc) is not sqlite3.DatabaseError:
                    raise  # e.g. "database is locked" past the busy timeout: transient
                # The bare class is what SQLite raises for a file that is not a database.
                raise LedgerError(
                    f"ledger {self.path} is unusable ({exc}); move the file aside so a new "
                    "ledger is created, or point ForkLab at another home folder"
                ) from exc

    def _enable_wal(self, conn: sqlite3.Connection) -> None:
        """Switch the file to WAL (a no-op once it is). While several processes switch a new
        file at once, SQLite answers some of them SQLITE_BUSY at once instead of waiting out
        the busy timeout (waiting could deadlock), so retry, briefly and with jitter, until
        that timeout has passed."""
        deadline = time.monotonic() + _BUSY_TIMEOUT_S
        while True:
            try:
                conn.execute("PRAGMA journal_mode=WAL")
                return
            except sqlite3.OperationalError as exc:
                busy = exc.sqlite_errorcode & 0xFF == sqlite3.SQLITE_BUSY
                if not busy or time.monotonic() > deadline:
                    raise
                time.sleep(random.uniform(0.005, 0.05))

    def _prepare(self, conn: sqlite3.Connection) -> None:
        """Create the schema on first use; refuse a ledger written by another schema."""
        self._enable_wal(conn)
        conn.execute("BEGIN IMMEDIATE")
        try:
            version = conn.execute("PRAGMA user_version").fetchone()[0]
            if version == 0:
                for statement in [*_SCHEMA.split(";"), _FORKS, _FORKS_TEAM]:
                    if statement.strip():
                        conn.execute(statement)
                conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
            elif 0 < version < SCHEMA_VERSION:  # an older ledger: upgrade it in place
                for step in range(version + 1, SCHEMA_VERSION + 1):
                    conn.execute(_UPGRADES[step])
                conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
            elif version != SCHEMA_VERSION:
                raise LedgerError(
                    f"ledger {self.path} has schema version {version} but this ForkLab "
                    f"knows version {SCHEMA_VERSION}; use a matching ForkLab or a new ledger file"
                )
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise

    def _write(self, sql: str, row: list[Any]) -> int:
        """Run one write in its own transaction; the number of rows it changed."""
        with self._connect() as conn:
            conn.execute("BEGIN IMMEDIATE")
            try:
                changed = conn.execute(sql, row).rowcount
                conn.execute("COMMIT")
            except BaseException:
                conn.execute("ROLLBACK")
                raise
        return changed

    def record_experiment(self, row: ExperimentRecord) -> None:
        self._write(
            upsert_sql("experiments", EXPERIMENT_COLUMNS, EXPERIMENT_KEY),
            to_row(row, EXPERIMENT_COLUMNS),
        )

    def record_world(self, row: WorldRecord) -> None:
        self._write(upsert_sql("worlds", WORLD_COLUMNS, WORLD_KEY), to_row(row, WORLD_COLUMNS))

    def experiment(self, experiment_id: str, run_id: str | None = None) -> ExperimentRecord | None:
        """The record of ``run_id``, or by default of the experiment's latest run."""
        args = [experiment_id] if run_id is None else [experiment_id, run_id]
        with self._connect() as conn:
            row = conn.execute(latest_experiment_sql("experiments", run_id), args).fetchone()
        return None if row is None else ExperimentRecord(**from_row(EXPERIMENT_COLUMNS, row))

    def worlds(self, experiment_id: str, run_id: str | None = None) -> list[WorldRecord]:
        """The experiment's world rows (of one run when ``run_id`` is given), oldest first."""
        args = [experiment_id] if run_id is None else [experiment_id, run_id]
        with self._connect() as conn:
            rows = conn.execute(worlds_sql("worlds", run_id), args).fetchall()
        return [WorldRecord(**from_row(WORLD_COLUMNS, r)) for r in rows]

    def record_fork(self, row: ForkRecord) -> bool:
        sql = insert_once_sql("forks", FORK_COLUMNS, FORK_KEY)
        return self._write(sql, to_row(row, FORK_COLUMNS)) == 1

    def forks(self, experiment_id: str, run_id: str) -> list[ForkRecord]:
        with self._connect() as conn:
            rows = conn.execute(forks_sql("forks"), [experiment_id, run_id]).fetchall()
        return [ForkRecord(**from_row(FORK_COLUMNS, r)) for r in rows]
