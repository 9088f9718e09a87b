"""The fork registry: receipts, outcomes and promotions, append-only in one SQLite file.

Nothing here is ever updated or deleted: a later decision is a new row (an outcome
recorded twice keeps both; a promotion adds a ``promoted`` row for the winner and a
``closed`` row for each sibling), so the history of decisions is the table itself.
"""

from __future__ import annotations

import sqlite3
from contextlib import AbstractContextManager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from forklab.activities.stores.sqlite_tx import init_schema, transaction
from forklab.contracts.runfork import RunSummary
from forklab.experiments.runfork.promotion import SiblingRun, closed_note
from forklab.experiments.runfork.receipt import ForkReceipt

_SCHEMA = """
CREATE TABLE IF NOT EXISTS receipts (
    fork_workflow_id TEXT PRIMARY KEY,
    parent_workflow_id TEXT NOT NULL,
    lineage_root TEXT NOT NULL,
    receipt_json TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS decisions (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    workflow_id TEXT NOT NULL,
    kind TEXT NOT NULL,
    label TEXT,
    score REAL,
    by_whom TEXT NOT NULL,
    at TEXT NOT NULL,
    note TEXT
);
CREATE TABLE IF NOT EXISTS run_summaries (
    run_id TEXT PRIMARY KEY,
    summary_json TEXT NOT NULL
);
CREATE TRIGGER IF NOT EXISTS receipts_immutable BEFORE UPDATE ON receipts
BEGIN SELECT RAISE(ABORT, 'fork receipts are immutable'); END;
CREATE TRIGGER IF NOT EXISTS receipts_kept BEFORE DELETE ON receipts
BEGIN SELECT RAISE(ABORT, 'fork receipts are immutable'); END;
CREATE TRIGGER IF NOT EXISTS decisions_immutable BEFORE UPDATE ON decisions
BEGIN SELECT RAISE(ABORT, 'decisions are append-only'); END;
CREATE TRIGGER IF NOT EXISTS decisions_kept BEFORE DELETE ON decisions
BEGIN SELECT RAISE(ABORT, 'decisions are append-only'); END;
"""


def insert_receipt(db: sqlite3.Connection, r: ForkReceipt, *, if_absent: bool = False) -> None:
    """Adds ``r`` in the transaction ``db`` (of a file with this schema); ``if_absent``
    leaves a receipt already kept under its fork's id as it is, instead of failing."""
    verb = "INSERT OR IGNORE" if if_absent else "INSERT"
    db.execute(
        f"{verb} INTO receipts VALUES (?, ?, ?, ?)",
        (r.fork_workflow_id, r.parent_workflow_id, r.lineage_root, r.model_dump_json()),
    )


class ForkRegistry:
    def __init__(self, path: Path) -> None:
        self.path = path
        init_schema(path, _SCHEMA)

    def _tx(self) -> AbstractContextManager[sqlite3.Connection]:
        return transaction(self.path)

    def add_receipt(self, r: ForkReceipt) -> None:
        with self._tx() as db:
            insert_receipt(db, r)

    def receipt(self, workflow_id: str) -> ForkReceipt | None:
        with self._tx() as db:
            row = db.execute(
                "SELECT receipt_json FROM receipts WHERE fork_workflow_id=?", (workflow_id,)
            ).fetchone()
        return ForkReceipt.model_validate_json(row[0]) if row else None

    def children(self, parent_workflow_id: str) -> list[ForkReceipt]:
        with self._tx() as db:
            rows = db.execute(
                "SELECT receipt_json FROM receipts WHERE parent_workflow_id=? ORDER BY rowid",
                (parent_workflow_id,),
            ).fetchall()
        return [ForkReceipt.model_validate_json(r[0]) for r in rows]

    def receipts(self) -> list[ForkReceipt]:
        with self._tx() as db:
            rows = db.execute("SELECT receipt_json FROM receipts ORDER BY rowid").fetchall()
        return [ForkReceipt.model_validate_json(r[0]) for r in rows]

    # --- the summary cache of runs that continued-as-new (immutable once closed) ---------
    def get(self, run_id: str) -> RunSummary | None:
        with self._tx() as db:
            row = db.execute(
                "SELECT summary_json FROM run_summaries WHERE run_id=?", (run_id,)
            ).fetchone()
        return RunSummary.model_validate_json(row[0]) if row else None

    def put(self, summary: RunSummary) -> None:
        with self._tx() as db:
            db.execute(
                "INSERT OR IGNORE INTO run_summaries VALUES (?, ?)",
                (summary.run_id, summary.model_dump_json()),
            )

    def record(
        self,
        workflow_id: str,
        kind: str,
        by: str,
        label: str | None = None,
        score: float | None = None,
        note: str | None = None,
    ) -> None:
        with self._tx() as db:
            db.execute(
                "INSERT INTO decisions (workflow_id, kind, label, score, by_whom, at, note)"
                " VALUES (?, ?, ?, ?, ?, ?, ?)",
                (workflow_id, kind, label, score, by, datetime.now(UTC).isoformat(), note),
            )

    def promote(self, workflow_id: str, siblings: dict[str, SiblingRun], by: str) -> None:
        """One transaction: the winner's ``promoted`` row and a ``closed`` row per sibling,
        labelled with what the promotion did to the sibling's run in Temporal."""
        now = datetime.now(UTC).isoformat()
        with self._tx() as db:
            db.execute(
                "INSERT INTO decisions (workflow_id, kind, by_whom, at)"
                " VALUES (?, 'promoted', ?, ?)",
                (workflow_id, by, now),
            )
            for s, run in siblings.items():
                db.execute(
                    "INSERT INTO decisions (workflow_id, kind, label, by_whom, at, note)"
                    " VALUES (?, 'closed', ?, ?, ?, ?)",
                    (s, run.value, by, now, closed_note(workflow_id)),
                )

    def closed_by(self, winner: str) -> dict[str, str]:
        """The siblings promoting ``winner`` closed, each with what happened to its run."""
        with self._tx() as db:
            rows = db.execute(
                "SELECT workflow_id, label FROM decisions WHERE kind='closed' AND note=?"
                " ORDER BY seq",
                (closed_note(winner),),
            ).fetchall()
        return {wid: label or "" for wid, label in rows}

    def decisions(self, workflow_id: str) -> list[dict[str, Any]]:
        with self._tx() as db:
            rows = db.execute(
                "SELECT seq, kind, label, score, by_whom, at, note FROM decisions"
                " WHERE workflow_id=? ORDER BY seq",
                (workflow_id,),
            ).fetchall()
        keys = ("seq", "kind", "label", "score", "by", "at", "note")
        return [dict(zip(keys, r, strict=True)) for r in rows]
