"""The effect ledger: side-effecting tool calls keyed by (lineage root, key name), so
retries and forks meet the effects already applied.

Two backends with one contract (:class:`EffectLedger`): :class:`SqliteEffectLedger`, one
file for the workers of one host (each call opens its own connection and decides inside
``BEGIN IMMEDIATE``; WAL), and
``forklab.activities.stores.effect_ledger_postgres.PostgresEffectLedger`` for workers on many
hosts. The rules are in ``forklab.experiments.runfork.effects``.
"""

from __future__ import annotations

import json
import sqlite3
import time
import uuid
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any, Protocol

from pydantic import BaseModel, ConfigDict

from forklab.activities.stores.sqlite_tx import init_schema, transaction
from forklab.experiments.runfork.effects import (
    ClaimOutcome,
    EntryState,
    LedgerEntry,
    completion_accepted,
    on_claim,
)

#: 2: ``lease_until`` (a file of version 1 gains it, 0 for its open claims)
SCHEMA_VERSION = 2
_SCHEMA = """
CREATE TABLE IF NOT EXISTS effects (
    lineage_root   TEXT NOT NULL,
    key_name       TEXT NOT NULL,
    tool           TEXT NOT NULL,
    request_sha256 TEXT NOT NULL,
    state          TEXT NOT NULL,
    claim_token    TEXT NOT NULL,
    epoch          INTEGER NOT NULL,
    holder         TEXT NOT NULL,
    result_json    TEXT,
    lease_until    REAL NOT NULL DEFAULT 0,
    PRIMARY KEY (lineage_root, key_name)
);
CREATE TABLE IF NOT EXISTS effect_events (
    seq          INTEGER PRIMARY KEY AUTOINCREMENT,
    lineage_root TEXT NOT NULL,
    key_name     TEXT NOT NULL,
    event        TEXT NOT NULL,
    holder       TEXT NOT NULL,
    epoch        INTEGER NOT NULL
);
"""


class Claim(BaseModel):
    model_config = ConfigDict(frozen=True)

    outcome: ClaimOutcome
    claim_token: str | None = None
    entry: LedgerEntry | None = None
    #: ``held``: seconds until the holder's lease ends
    retry_after: float | None = None


class EffectLedger(Protocol):
    """What the tools and ``forklab trail`` need of an effect ledger."""

    @property
    def location(self) -> str: ...

    def claim(
        self,
        root: str,
        key: str,
        tool: str,
        request_sha: str,
        holder: str,
        epoch: int,
        lease_seconds: float = 0.0,
    ) -> Claim:
        """Claim the key for one attempt that may run ``lease_seconds`` (other executions
        meet ``held`` until then). ``new`` and ``ambiguous`` hand out a fresh claim token
        (the previous holder's completion will be rejected); the others hand none."""
        ...

    def complete(self, root: str, key: str, claim_token: str, result: dict[str, Any]) -> bool:
        """Record the result; False (and nothing written) unless ``claim_token`` still holds
        the claim — a zombie attempt's completion is rejected here."""
        ...

    def entries(self, root: str) -> list[LedgerEntry]: ...

    def events(self, root: str) -> list[dict[str, Any]]:
        """Every claim and completion of the lineage, in the order they were decided."""
        ...


#: Columns of an entry, in :class:`LedgerEntry` order (both backends select them so).
ENTRY_COLUMNS = (
    "lineage_root, key_name, tool, request_sha256, state, claim_token, epoch, holder, result_json,"
    " lease_until"
)
EVENT_FIELDS = ("seq", "key_name", "event", "holder", "epoch")


def entry_of(row: tuple[Any, ...] | None) -> LedgerEntry | None:
    if row is None:
        return None
    return LedgerEntry(
        lineage_root=row[0],
        key_name=row[1],
        tool=row[2],
        request_sha256=row[3],
        state=EntryState(row[4]),
        claim_token=row[5],
        epoch=row[6],
        holder=row[7],
        result=json.loads(row[8]) if row[8] else None,
        lease_until=row[9],
    )


def claimed(outcome: ClaimOutcome, entry: LedgerEntry | None, now: float) -> Claim | None:
    """The answer to a claim that takes no token (None: it takes one)."""
    if outcome in (ClaimOutcome.new, ClaimOutcome.ambiguous):
        return None
    retry_after = entry.lease_until - now if outcome is ClaimOutcome.held and entry else None
    return Claim(outcome=outcome, entry=entry, retry_after=retry_after)


def result_json(result: dict[str, Any]) -> str:
    return json.dumps(result, sort_keys=True)


class SqliteEffectLedger:
    def __init__(self, path: Path) -> None:
        self.path = path
        init_schema(path, _SCHEMA)
        self._upgrade()

    def _upgrade(self) -> None:
        """Bring a file of an earlier schema up to this one; refuse one of a later."""
        with self._tx() as db:
            version = db.execute("PRAGMA user_version").fetchone()[0]
            if version > SCHEMA_VERSION:
                raise ValueError(
                    f"effect ledger {self.path} has schema version {version} but this "
                    f"ForkLab knows version {SCHEMA_VERSION}; use a matching ForkLab"
                )
            columns = {row[1] for row in db.execute("PRAGMA table_info(effects)")}
            if "lease_until" not in columns:
                db.execute("ALTER TABLE effects ADD COLUMN lease_until REAL NOT NULL DEFAULT 0")
            db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")

    @property
    def location(self) -> str:
        return str(self.path)

    def _tx(self) -> AbstractContextManager[sqlite3.Connection]:
        return transaction(self.path)

    def _get(self, db: sqlite3.Connection, root: str, key: str) -> LedgerEntry | None:
        row = db.execute(
            f"SELECT {ENTRY_COLUMNS} FROM effects WHERE lineage_root=? AND key_name=?",
            (root, key),
        ).fetchone()
        return entry_of(row)

    def _event(
        self, db: sqlite3.Connection, root: str, key: str, event: str, holder: str, epoch: int
    ) -> None:
        db.execute(
            "INSERT INTO effect_events (lineage_root, key_name, event, holder, epoch)"
            " VALUES (?, ?, ?, ?, ?)",
            (root, key, event, holder, epoch),
        )

    def claim(
        self,
        root: str,
        key: str,
        tool: str,
        request_sha: str,
        holder: str,
        epoch: int,
        lease_seconds: float = 0.0,
    ) -> Claim:
        with self._tx() as db:
            now = time.time()  # one file, one host: its clock is the ledger's
            entry = self._get(db, root, key)
            outcome = on_claim(entry, request_sha, holder, epoch, now)
            self._event(db, root, key, f"claim:{outcome.value}", holder, epoch)
            answer = claimed(outcome, entry, now)
            if answer is not None:
                return answer
            token = uuid.uuid4().hex
            db.execute(
                f"INSERT INTO effects ({ENTRY_COLUMNS})"
                " VALUES (?, ?, ?, ?, 'claimed', ?, ?, ?, NULL, ?)"
                " ON CONFLICT (lineage_root, key_name) DO UPDATE SET"
                " claim_token=excluded.claim_token, epoch=excluded.epoch, holder=excluded.holder,"
                " lease_until=excluded.lease_until",
                (root, key, tool, request_sha, token, epoch, holder, now + lease_seconds),
            )
            return Claim(outcome=outcome, claim_token=token, entry=entry)

    def complete(self, root: str, key: str, claim_token: str, result: dict[str, Any]) -> bool:
        with self._tx() as db:
            entry = self._get(db, root, key)
            ok = completion_accepted(entry, claim_token)
            holder = entry.holder if entry else ""
            self._event(
                db,
                root,
                key,
                "complete" if ok else "complete:rejected",
                holder,
                entry.epoch if entry else 0,
            )
            if ok:
                db.execute(
                    "UPDATE effects SET state='completed', result_json=? WHERE lineage_root=?"
                    " AND key_name=?",
                    (result_json(result), root, key),
                )
            return ok

    def entries(self, root: str) -> list[LedgerEntry]:
        with self._tx() as db:
            rows = db.execute(
                f"SELECT {ENTRY_COLUMNS} FROM effects WHERE lineage_root=? ORDER BY key_name",
                (root,),
            ).fetchall()
        return [e for e in (entry_of(r) for r in rows) if e is not None]

    def events(self, root: str) -> list[dict[str, Any]]:
        with self._tx() as db:
            rows = db.execute(
                "SELECT seq, key_name, event, holder, epoch FROM effect_events"
                " WHERE lineage_root=? ORDER BY seq",
                (root,),
            ).fetchall()
        return [dict(zip(EVENT_FIELDS, r, strict=True)) for r in rows]
