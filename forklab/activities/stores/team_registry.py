"""Team fork records: one row per team fork, written once, in the fork registry's file.

The row is the group receipt the coordinator recorded: the final one (every member's fork
receipt in its slot) when the team was forked, the plan and the reason when it was
aborted. Like fork receipts, rows are never updated or deleted (triggers refuse it); a
retried write of the same record is accepted, another record under the same name refused.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from forklab.activities.stores.fork_registry import ForkRegistry, insert_receipt
from forklab.activities.stores.sqlite_tx import init_schema, transaction
from forklab.contracts.team_fork import TeamForkRecord
from forklab.experiments.runfork.receipt import ForkReceipt

_SCHEMA = """
CREATE TABLE IF NOT EXISTS team_forks (
    team_fork_id TEXT PRIMARY KEY,
    status TEXT NOT NULL,
    record_json TEXT NOT NULL
);
CREATE TRIGGER IF NOT EXISTS team_forks_immutable BEFORE UPDATE ON team_forks
BEGIN SELECT RAISE(ABORT, 'team fork records are immutable'); END;
CREATE TRIGGER IF NOT EXISTS team_forks_kept BEFORE DELETE ON team_forks
BEGIN SELECT RAISE(ABORT, 'team fork records are immutable'); END;
"""


class TeamRecordConflict(ValueError):
    """Another record is already kept under this team fork's name."""


class TeamRegistry:
    def __init__(self, path: Path) -> None:
        self.path = path
        init_schema(path, _SCHEMA)
        ForkRegistry(path)  # the receipts table the members' receipts go to

    def add(self, record: TeamForkRecord, receipts: Sequence[ForkReceipt] = ()) -> None:
        """Keeps ``record`` (once; the same record again is a retry and changes nothing)
        and, in the same transaction, the member forks' ``receipts`` (each kept once: one a
        retried attempt recorded already is left as it is). One write, not one per member:
        concurrent writers queue for the file's lock."""
        name = record.receipt.team_fork_id
        body = record.model_dump_json()
        with transaction(self.path) as db:
            row = db.execute(
                "SELECT record_json FROM team_forks WHERE team_fork_id=?", (name,)
            ).fetchone()
            if row is None:
                for receipt in receipts:
                    insert_receipt(db, receipt, if_absent=True)
                db.execute(
                    "INSERT INTO team_forks VALUES (?, ?, ?)", (name, record.status.value, body)
                )
                return
        if TeamForkRecord.model_validate_json(row[0]) != record:
            raise TeamRecordConflict(f"team fork {name!r} is already recorded otherwise")

    def get(self, team_fork_id: str) -> TeamForkRecord | None:
        with transaction(self.path) as db:
            row = db.execute(
                "SELECT record_json FROM team_forks WHERE team_fork_id=?", (team_fork_id,)
            ).fetchone()
        return TeamForkRecord.model_validate_json(row[0]) if row else None

    def of_member(self, fork_workflow_id: str) -> TeamForkRecord | None:
        """The team fork whose member fork ``fork_workflow_id`` is (None: none here)."""
        with transaction(self.path) as db:
            rows = db.execute("SELECT record_json FROM team_forks").fetchall()
        for (body,) in rows:
            record = TeamForkRecord.model_validate_json(body)
            if fork_workflow_id in record.receipt.addresses.values():
                return record
        return None
