"""The effect ledger in PostgreSQL, for agent workers on many hosts: the SQLite ledger's
rows and rules in two tables, ``effects`` and ``effect_events``, created by migrations of
the ``effects`` component (see ``forklab.activities.stores.postgres``), in the database the
experiment ledger uses (``FORKLAB_LEDGER``).

Every claim and completion of one key is decided under a transaction-level advisory lock
on that key, so two workers racing for a key that has no row yet are serialised like
``BEGIN IMMEDIATE`` serialises them in SQLite. ``PostgresDatabase.run`` runs a unit of
work again when the connection drops, including after a commit whose answer was lost; so
the claim token is drawn once per call, outside the work, and a retry that finds its own
token already written returns what that commit decided instead of deciding again (which
would fence the caller against itself).
"""

from __future__ import annotations

import uuid
from typing import Any

from forklab.activities.stores.effect_ledger import (
    ENTRY_COLUMNS,
    EVENT_FIELDS,
    Claim,
    claimed,
    entry_of,
    result_json,
)
from forklab.activities.stores.postgres import Conn, Migration, PostgresDatabase, PostgresTables
from forklab.experiments.runfork.effects import (
    ClaimOutcome,
    EntryState,
    LedgerEntry,
    completion_accepted,
    on_claim,
)

COMPONENT = "effects"
MIGRATIONS = (
    Migration(
        version=1,
        name="effects and their events",
        sql="""
CREATE TABLE effects (
    lineage_root   TEXT NOT NULL,
    key_name       TEXT NOT NULL,
    tool           TEXT NOT NULL,
    request_sha256 TEXT NOT NULL,
    state          TEXT NOT NULL,
    claim_token    TEXT NOT NULL,
    epoch          INTEGER NOT NULL,
    holder         TEXT NOT NULL,
    result_json    TEXT,
    PRIMARY KEY (lineage_root, key_name)
);
CREATE TABLE effect_events (
    seq          BIGSERIAL PRIMARY KEY,
    lineage_root TEXT NOT NULL,
    key_name     TEXT NOT NULL,
    event        TEXT NOT NULL,
    holder       TEXT NOT NULL,
    epoch        INTEGER NOT NULL
);
CREATE INDEX effect_events_root ON effect_events (lineage_root, seq);
""",
    ),
    Migration(
        version=2,
        name="a claim's lease",
        sql="ALTER TABLE effects ADD COLUMN lease_until DOUBLE PRECISION NOT NULL DEFAULT 0;",
    ),
)


def _lock(conn: Conn, root: str, key: str) -> None:
    # one lock per key (two 32-bit halves); a hash collision only serialises two keys
    conn.execute("SELECT pg_advisory_xact_lock(hashtext(%s), hashtext(%s))", (root, key))


def _get(conn: Conn, root: str, key: str) -> LedgerEntry | None:
    sql = f"SELECT {ENTRY_COLUMNS} FROM effects WHERE lineage_root=%s AND key_name=%s"
    return entry_of(conn.execute(sql.encode(), (root, key)).fetchone())


def _event(conn: Conn, root: str, key: str, event: str, holder: str, epoch: int) -> None:
    conn.execute(
        "INSERT INTO effect_events (lineage_root, key_name, event, holder, epoch)"
        " VALUES (%s, %s, %s, %s, %s)",
        (root, key, event, holder, epoch),
    )


class PostgresEffectLedger:
    def __init__(self, db: PostgresDatabase) -> None:
        self._tables = PostgresTables(db, COMPONENT, MIGRATIONS)

    @property
    def location(self) -> str:
        return self._tables.location

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
        token = uuid.uuid4().hex

        def work(conn: Conn) -> Claim:
            _lock(conn, root, key)
            entry = _get(conn, root, key)
            if entry is not None and entry.claim_token == token:
                # this call's earlier try committed; its answer was lost on the way back
                last = conn.execute(
                    "SELECT event FROM effect_events WHERE lineage_root=%s AND key_name=%s"
                    " AND holder=%s AND epoch=%s AND event IN ('claim:new', 'claim:ambiguous')"
                    " ORDER BY seq DESC LIMIT 1",
                    (root, key, holder, epoch),
                ).fetchone()
                assert last is not None, "the claim event commits with the claim"
                outcome = ClaimOutcome(str(last[0]).removeprefix("claim:"))
                return Claim(outcome=outcome, claim_token=token)
            # the database's clock: workers on several hosts meet one clock
            row = conn.execute("SELECT extract(epoch FROM clock_timestamp())::float8").fetchone()
            assert row is not None
            now = float(row[0])
            outcome = on_claim(entry, request_sha, holder, epoch, now)
            _event(conn, root, key, f"claim:{outcome.value}", holder, epoch)
            answer = claimed(outcome, entry, now)
            if answer is not None:
                return answer
            conn.execute(
                f"INSERT INTO effects ({ENTRY_COLUMNS})".encode()
                + b" VALUES (%s, %s, %s, %s, 'claimed', %s, %s, %s, NULL, %s)"
                b" ON CONFLICT (lineage_root, key_name) DO UPDATE SET"
                b" claim_token=excluded.claim_token, epoch=excluded.epoch, holder=excluded.holder,"
                b" lease_until=excluded.lease_until",
                (root, key, tool, request_sha, token, epoch, holder, now + lease_seconds),
            )
            return Claim(outcome=outcome, claim_token=token, entry=entry)

        return self._tables.run(work)

    def complete(self, root: str, key: str, claim_token: str, result: dict[str, Any]) -> bool:
        text = result_json(result)

        def work(conn: Conn) -> bool:
            _lock(conn, root, key)
            entry = _get(conn, root, key)
            if (
                entry is not None
                and entry.state is EntryState.completed
                and entry.claim_token == claim_token
            ):
                return True  # this call's earlier try committed; its answer was lost
            ok = completion_accepted(entry, claim_token)
            _event(
                conn,
                root,
                key,
                "complete" if ok else "complete:rejected",
                entry.holder if entry else "",
                entry.epoch if entry else 0,
            )
            if ok:
                conn.execute(
                    "UPDATE effects SET state='completed', result_json=%s"
                    " WHERE lineage_root=%s AND key_name=%s",
                    (text, root, key),
                )
            return ok

        return self._tables.run(work)

    def entries(self, root: str) -> list[LedgerEntry]:
        sql = f"SELECT {ENTRY_COLUMNS} FROM effects WHERE lineage_root=%s ORDER BY key_name"
        rows = self._tables.run(lambda conn: conn.execute(sql.encode(), (root,)).fetchall())
        return [e for e in (entry_of(r) for r in rows) if e is not None]

    def events(self, root: str) -> list[dict[str, Any]]:
        rows = self._tables.run(
            lambda conn: conn.execute(
                "SELECT seq, key_name, event, holder, epoch FROM effect_events"
                " WHERE lineage_root=%s ORDER BY seq",
                (root,),
            ).fetchall()
        )
        return [dict(zip(EVENT_FIELDS, r, strict=True)) for r in rows]
