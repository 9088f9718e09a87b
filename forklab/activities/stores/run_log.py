"""The run log: an offset-addressed, append-only event log per run (workflow id), in SQLite.

Writers are fenced (rules in ``forklab.experiments.runfork.fencing``): each producer appends with
(epoch, seq); a repeat is a no-op success, a gap is rejected with the seq expected, a
stale epoch (a zombie) is rejected. Readers resume from any offset and get exactly the
events after it.

Why not ``temporalio.contrib.workflow_streams``: it keeps the stream inside the running
workflow (readers long-poll an Update), so a finished or crashed run can no longer be
read, and its dedup is (publisher, sequence) without epochs: a zombie is not fenced.
"""

from __future__ import annotations

import json
import sqlite3
from contextlib import AbstractContextManager, closing
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from forklab.activities.stores.sqlite_tx import init_schema, transaction
from forklab.experiments.runfork.fencing import FenceDecision, ProducerState, Verdict, check_append

_SCHEMA = """
CREATE TABLE IF NOT EXISTS run_events (
    stream   TEXT NOT NULL,
    offset   INTEGER NOT NULL,
    producer TEXT NOT NULL,
    epoch    INTEGER NOT NULL,
    seq      INTEGER NOT NULL,
    event    TEXT NOT NULL,
    PRIMARY KEY (stream, offset)
);
CREATE TABLE IF NOT EXISTS producers (
    stream   TEXT NOT NULL,
    producer TEXT NOT NULL,
    epoch    INTEGER NOT NULL,
    last_seq INTEGER NOT NULL,
    PRIMARY KEY (stream, producer)
);
"""


class LogEvent(BaseModel):
    model_config = ConfigDict(frozen=True)

    offset: int
    producer: str
    event: dict[str, Any]


class AppendResult(BaseModel):
    model_config = ConfigDict(frozen=True)

    decision: FenceDecision
    offset: int | None = None

    @property
    def accepted(self) -> bool:
        return self.decision.verdict in (Verdict.append, Verdict.duplicate)


class RunLog:
    def __init__(self, path: Path) -> None:
        self.path = path
        init_schema(path, _SCHEMA)

    def _tx(self) -> AbstractContextManager[sqlite3.Connection]:
        return transaction(self.path)

    def append(
        self, stream: str, producer: str, epoch: int, seq: int, event: dict[str, Any]
    ) -> AppendResult:
        with self._tx() as db:
            row = db.execute(
                "SELECT epoch, last_seq FROM producers WHERE stream=? AND producer=?",
                (stream, producer),
            ).fetchone()
            state = ProducerState(epoch=row[0], last_seq=row[1]) if row else None
            decision = check_append(state, epoch, seq)
            if decision.verdict is not Verdict.append:
                return AppendResult(decision=decision)
            (offset,) = db.execute(
                "SELECT COALESCE(MAX(offset) + 1, 0) FROM run_events WHERE stream=?", (stream,)
            ).fetchone()
            db.execute(
                "INSERT INTO run_events VALUES (?, ?, ?, ?, ?, ?)",
                (stream, offset, producer, epoch, seq, json.dumps(event, sort_keys=True)),
            )
            db.execute(
                "INSERT INTO producers VALUES (?, ?, ?, ?) ON CONFLICT (stream, producer)"
                " DO UPDATE SET epoch=excluded.epoch, last_seq=excluded.last_seq",
                (stream, producer, epoch, seq),
            )
            return AppendResult(decision=decision, offset=offset)

    def read(self, stream: str, after: int = -1, limit: int = 1000) -> list[LogEvent]:
        """Events with an offset greater than ``after`` (-1: from the start), in order."""
        with closing(sqlite3.connect(self.path, timeout=30)) as db:
            rows = db.execute(
                "SELECT offset, producer, event FROM run_events WHERE stream=? AND offset>?"
                " ORDER BY offset LIMIT ?",
                (stream, after, limit),
            ).fetchall()
        return [LogEvent(offset=o, producer=p, event=json.loads(e)) for o, p, e in rows]

    def count(self, stream: str) -> int:
        with closing(sqlite3.connect(self.path, timeout=30)) as db:
            (n,) = db.execute(
                "SELECT COUNT(*) FROM run_events WHERE stream=?", (stream,)
            ).fetchone()
        return int(n)
