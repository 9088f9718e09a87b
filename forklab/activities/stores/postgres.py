"""One PostgreSQL connection and migration pattern for every ForkLab store that lives in a
shared database (the experiment ledger; the effect ledger of forked agent runs).

A component (``"ledger"``, ``"effects"``, …) owns a list of numbered :class:`Migration` s.
:meth:`PostgresDatabase.migrate` applies the missing ones in order, each in its own
transaction, under an advisory lock (so workers starting together do not race), and
records them in ``forklab_schema``; a database that is ahead of this ForkLab is refused.
:meth:`PostgresDatabase.run` runs one unit of work in a transaction and, while the server
is unreachable, waits and runs it again from the start (so the work must be idempotent).
A store works through :class:`PostgresTables`, whose units of work first bring its
component's tables up to date (once per instance).

Connections are opened per unit of work, like the SQLite ledger's: the class holds no
socket, is thread-safe, and survives a database restart without reconnect logic.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import TypeVar
from urllib.parse import urlsplit, urlunsplit

import psycopg
from psycopg.rows import TupleRow
from pydantic import BaseModel, ConfigDict, Field

from forklab.activities.stores.outages import ride_out

_T = TypeVar("_T")
Conn = psycopg.Connection[TupleRow]
_COMPONENT = re.compile(r"[a-z][a-z0-9_]{0,62}")
#: Seconds to wait for a connection before one attempt counts as failed.
CONNECT_TIMEOUT_SECONDS = 5

_SCHEMA_TABLE = """
CREATE TABLE IF NOT EXISTS forklab_schema (
    component  TEXT NOT NULL,
    version    INTEGER NOT NULL,
    name       TEXT NOT NULL,
    applied_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (component, version)
)
"""
#: Key of the advisory lock every migration takes (any constant shared by all ForkLabs).
_MIGRATION_LOCK = 0x466F726B4C6162  # "ForkLab"


class SchemaError(RuntimeError):
    """The database's schema cannot be used by this ForkLab; the message says what to do."""


class Migration(BaseModel):
    """One step of a component's schema: ``version`` counts from 1 without gaps."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    version: int = Field(ge=1)
    name: str = Field(min_length=1)
    sql: str = Field(min_length=1)


def redacted(url: str) -> str:
    """``url`` without its password, for messages and logs."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = parts.hostname or ""
    netloc = f"{parts.username}:***@{host}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit(parts._replace(netloc=netloc))


def is_transient(exc: BaseException) -> bool:
    """A server that cannot be reached, restarts, or drops the connection (SQLSTATE class
    08, 57P0x), as opposed to an error in the work itself."""
    if not isinstance(exc, psycopg.OperationalError):
        return False
    state = exc.sqlstate
    return state is None or state.startswith("08") or state.startswith("57P0")


class PostgresDatabase:
    def __init__(self, url: str, retry_seconds: float = 60.0) -> None:
        self.url = url
        self.retry_seconds = retry_seconds

    @property
    def location(self) -> str:
        return redacted(self.url)

    def run(self, work: Callable[[Conn], _T]) -> _T:
        """``work(conn)`` in one transaction (committed on return, rolled back on error),
        retried from the start while the server is unreachable."""

        def attempt() -> _T:
            with psycopg.connect(self.url, connect_timeout=CONNECT_TIMEOUT_SECONDS) as conn:
                return work(conn)

        return ride_out(attempt, is_transient, self.retry_seconds, f"PostgreSQL {self.location}")

    def migrate(self, component: str, migrations: Sequence[Migration]) -> int:
        """Bring ``component``'s tables to the last of ``migrations``; returns that version."""
        if not _COMPONENT.fullmatch(component):
            raise ValueError(f"component {component!r} must be a lowercase identifier")
        versions = [m.version for m in migrations]
        if versions != list(range(1, len(migrations) + 1)):
            raise ValueError(f"migrations of {component} must be numbered 1..n, got {versions}")
        target = len(migrations)

        def current(conn: Conn) -> int:
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (_MIGRATION_LOCK,))
            conn.execute(_SCHEMA_TABLE)
            row = conn.execute(
                "SELECT coalesce(max(version), 0) FROM forklab_schema WHERE component = %s",
                (component,),
            ).fetchone()
            return int(row[0]) if row else 0

        def step(migration: Migration) -> Callable[[Conn], None]:
            def apply(conn: Conn) -> None:
                if current(conn) >= migration.version:
                    return  # another process applied it while we waited for the lock
                conn.execute(migration.sql.encode())
                conn.execute(
                    "INSERT INTO forklab_schema (component, version, name) VALUES (%s, %s, %s)",
                    (component, migration.version, migration.name),
                )

            return apply

        found = self.run(current)
        if found > target:
            raise SchemaError(
                f"{component} tables in {self.location} have schema version {found} but this "
                f"ForkLab knows version {target}; upgrade ForkLab or use another database"
            )
        for migration in migrations[found:]:
            self.run(step(migration))
        return target


class PostgresTables:
    """One component's tables in a database. A store is built before anything reaches the
    database (a worker starts while PostgreSQL is still down), so the migrations run with
    its first unit of work, not in the constructor; once they succeeded, later units of
    work skip the check. Two threads racing through the first call both migrate, which
    :meth:`PostgresDatabase.migrate` makes harmless."""

    def __init__(
        self, db: PostgresDatabase, component: str, migrations: Sequence[Migration]
    ) -> None:
        self.db = db
        self.component = component
        self.migrations = tuple(migrations)
        self._ready = False

    @property
    def location(self) -> str:
        return self.db.location

    def run(self, work: Callable[[Conn], _T]) -> _T:
        """``work(conn)`` as :meth:`PostgresDatabase.run` runs it, on migrated tables."""
        if not self._ready:
            self.db.migrate(self.component, self.migrations)
            self._ready = True
        return self.db.run(work)
