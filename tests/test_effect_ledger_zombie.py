"""The effect ledger, one contract over both backends (a real SQLite file; a real
PostgreSQL database of the test's own, dropped afterwards): claims, epochs, zombie
completions, replays, mismatches, racing claimers, two workers sharing the store; and a
zombie attempt on a real dev server: attempt 1 applies the charge and hangs past its
timeout; attempt 2 finds the key claimed without a result (the ambiguous window), asks
the payments service, records what it found; attempt 1's late completion is rejected."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import closing
from pathlib import Path
from typing import TypeVar

import pytest
from agent_fixtures import Services
from fork_workloads import ChargeOnceWorkflow
from stores_lab import postgres_database
from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from forklab.activities.stores.effect_ledger import EffectLedger, SqliteEffectLedger
from forklab.activities.stores.effect_ledger_postgres import PostgresEffectLedger
from forklab.activities.stores.postgres import Conn, PostgresDatabase
from forklab.agents.tools import EffectTools, LedgerMode
from forklab.experiments.runfork.effects import ClaimOutcome, request_sha256
from forklab.experiments.runfork.identity import effect_scope, lineage_root
from forklab.workers.config import Settings
from forklab.workers.runfork.agent_config import AgentSettings
from forklab.workers.stores import effect_ledger
from forklab.workflows.runfork.interceptor import ForkInterceptor

_T = TypeVar("_T")


@pytest.fixture(params=["sqlite", "postgresql"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Callable[[], EffectLedger]]:
    """Makes ledgers on one store: each call is another worker's handle on it."""
    if request.param == "sqlite":
        yield lambda: effect_ledger(AgentSettings(home=tmp_path))
        return
    with postgres_database() as url:
        settings = Settings.load({"home": tmp_path}, env={"FORKLAB_LEDGER": url})
        agent = AgentSettings.load(settings, env={})
        yield lambda: effect_ledger(agent)


def test_settings_choose_the_backend(tmp_path: Path) -> None:
    local = AgentSettings.load(Settings.load({"home": tmp_path}, env={}), env={})
    assert isinstance(effect_ledger(local), SqliteEffectLedger)
    url = "postgresql://u:secret@db:5432/forklab"
    shared = Settings.load({"home": tmp_path}, env={"FORKLAB_LEDGER": url})
    ledger = effect_ledger(AgentSettings.load(shared, env={}))
    assert isinstance(ledger, PostgresEffectLedger)
    assert ledger.location == "postgresql://u:***@db:5432/forklab"


def test_a_zombie_completion_is_rejected(store: Callable[[], EffectLedger]) -> None:
    ledger = store()
    req = request_sha256({"amount": 4900})
    first = ledger.claim("root", "charge:inv-1", "charge_customer", req, "wf/run/1", 1)
    assert first.outcome is ClaimOutcome.new and first.claim_token
    # attempt 1 hangs; attempt 2 of the same activity takes over in the ambiguous window
    again = ledger.claim("root", "charge:inv-1", "charge_customer", req, "wf/run/1", 1)
    assert again.outcome is ClaimOutcome.fenced and again.claim_token is None
    second = ledger.claim("root", "charge:inv-1", "charge_customer", req, "wf/run/1", 2)
    assert second.outcome is ClaimOutcome.ambiguous and second.claim_token
    assert not ledger.complete("root", "charge:inv-1", first.claim_token, {"effect_id": "z"})
    assert ledger.complete("root", "charge:inv-1", second.claim_token, {"effect_id": "e2"})
    # completed: replays; a different request under the key is a mismatch
    replay = ledger.claim("root", "charge:inv-1", "charge_customer", req, "fork/run/4", 1)
    assert replay.outcome is ClaimOutcome.replay and replay.entry is not None
    assert replay.entry.result == {"effect_id": "e2"}
    other = request_sha256({"amount": 5000})
    mismatch = ledger.claim("root", "charge:inv-1", "charge_customer", other, "x", 1)
    assert mismatch.outcome is ClaimOutcome.mismatch
    assert [(e["event"], e["epoch"]) for e in ledger.events("root")] == [
        ("claim:new", 1),
        ("claim:fenced", 1),
        ("claim:ambiguous", 2),
        ("complete:rejected", 2),
        ("complete", 2),
        ("claim:replay", 1),
        ("claim:mismatch", 1),
    ]
    (entry,) = ledger.entries("root")
    assert entry.epoch == 2 and entry.result == {"effect_id": "e2"}
    # another lineage root is another key
    fresh = ledger.claim("other-root", "charge:inv-1", "charge_customer", req, "y", 1)
    assert fresh.outcome is ClaimOutcome.new


def test_another_execution_waits_out_a_live_claim(store: Callable[[], EffectLedger]) -> None:
    """A fork (another activity execution) meeting its parent's open claim is ``held``
    while the parent's attempt may still be applying the effect, and takes over only
    once that attempt's lease has ended; the parent's own next attempt does not wait."""
    ledger = store()
    req = request_sha256({"amount": 4900})
    parent = ledger.claim("root", "charge:inv-1", "charge_customer", req, "p/run/4", 1, 60.0)
    assert parent.outcome is ClaimOutcome.new and parent.claim_token
    fork = ledger.claim("root", "charge:inv-1", "charge_customer", req, "p--fork/run/3", 1, 60.0)
    assert fork.outcome is ClaimOutcome.held and fork.claim_token is None
    assert fork.retry_after is not None and 55.0 < fork.retry_after <= 60.0
    assert fork.entry is not None and fork.entry.holder == "p/run/4"
    # the parent completes: the fork's next claim replays its result
    assert ledger.complete("root", "charge:inv-1", parent.claim_token, {"effect_id": "e1"})
    again = ledger.claim("root", "charge:inv-1", "charge_customer", req, "p--fork/run/3", 2, 60.0)
    assert again.outcome is ClaimOutcome.replay
    # a claim whose lease has ended (its holder died) is taken over, as ambiguous
    dead = ledger.claim("root", "email:1", "send_email", req, "q/run/2", 1, 0.05)
    time.sleep(0.1)
    taken = ledger.claim("root", "email:1", "send_email", req, "q--fork/run/3", 1, 60.0)
    assert taken.outcome is ClaimOutcome.ambiguous and taken.claim_token
    assert dead.claim_token and not ledger.complete("root", "email:1", dead.claim_token, {})
    # the holder's own next attempt takes its live claim over at once (Temporal starts it
    # only after the earlier attempt failed or timed out)
    own = ledger.claim("root", "email:1", "send_email", req, "q--fork/run/3", 2, 60.0)
    assert own.outcome is ClaimOutcome.ambiguous
    assert [e["event"] for e in ledger.events("root")] == [
        "claim:new",
        "claim:held",
        "complete",
        "claim:replay",
        "claim:new",
        "claim:ambiguous",
        "complete:rejected",
        "claim:ambiguous",
    ]


def test_a_version_1_sqlite_ledger_gains_leases(tmp_path: Path) -> None:
    """A ledger file written before leases keeps its rows; its open claims have no lease
    (another execution takes them over, as before)."""
    path = tmp_path / "effects.sqlite"
    with closing(sqlite3.connect(path)) as db:
        db.executescript(_V1_SCHEMA)
        db.execute(
            "INSERT INTO effects VALUES ('root', 'charge:inv-1', 'charge_customer', ?,"
            " 'claimed', 'tok', 1, 'p/run/4', NULL)",
            (request_sha256({"amount": 1}),),
        )
        db.commit()
    ledger = SqliteEffectLedger(path)
    (entry,) = ledger.entries("root")
    assert entry.lease_until == 0.0 and entry.holder == "p/run/4"
    claim = ledger.claim(
        "root", "charge:inv-1", "charge_customer", entry.request_sha256, "f/run/1", 1, 60.0
    )
    assert claim.outcome is ClaimOutcome.ambiguous
    with closing(sqlite3.connect(path)) as db:
        assert db.execute("PRAGMA user_version").fetchone()[0] == 2
        db.execute("PRAGMA user_version = 9")
        db.commit()
    with pytest.raises(ValueError, match="schema version 9 but this ForkLab knows version 2"):
        SqliteEffectLedger(path)


_V1_SCHEMA = """
CREATE TABLE effects (
    lineage_root TEXT NOT NULL, key_name TEXT NOT NULL, tool TEXT NOT NULL,
    request_sha256 TEXT NOT NULL, state TEXT NOT NULL, claim_token TEXT NOT NULL,
    epoch INTEGER NOT NULL, holder TEXT NOT NULL, result_json TEXT,
    PRIMARY KEY (lineage_root, key_name)
);
CREATE TABLE effect_events (
    seq INTEGER PRIMARY KEY AUTOINCREMENT, lineage_root TEXT NOT NULL,
    key_name TEXT NOT NULL, event TEXT NOT NULL, holder TEXT NOT NULL, epoch INTEGER NOT NULL
);
"""


def test_two_workers_share_the_store(store: Callable[[], EffectLedger]) -> None:
    a, b = store(), store()
    req = request_sha256({"to": "x@y"})
    claim = a.claim("root", "email:1", "send_email", req, "wf/run/7", 1)
    assert claim.claim_token and a.complete("root", "email:1", claim.claim_token, {"id": 1})
    seen = b.claim("root", "email:1", "send_email", req, "fork/run/2", 1)
    assert seen.outcome is ClaimOutcome.replay and seen.entry and seen.entry.result == {"id": 1}


def test_racing_claims_of_a_new_key_make_one_owner(store: Callable[[], EffectLedger]) -> None:
    """Eight workers claim a key nobody holds at once, as one attempt: exactly one owns
    it, the others are fenced (nothing fails on the missing row)."""
    req = request_sha256({"amount": 1})
    ledgers = [store() for _ in range(8)]
    for ledger in ledgers:  # schema ready before the race
        ledger.entries("warm-up")
    gate = threading.Barrier(len(ledgers))
    outcomes: list[ClaimOutcome] = []

    def claim(ledger: EffectLedger) -> None:
        gate.wait()
        outcomes.append(ledger.claim("race", "k", "t", req, "wf/run/1", 1).outcome)

    threads = [threading.Thread(target=claim, args=(ledger,)) for ledger in ledgers]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(outcomes) == sorted([ClaimOutcome.new] + [ClaimOutcome.fenced] * 7)


class _LostAnswers(PostgresDatabase):
    """Every unit of work commits, then runs again: what ``run`` does when the
    connection drops after a commit and before its answer arrives."""

    def run(self, work: Callable[[Conn], _T]) -> _T:
        super().run(work)
        return super().run(work)


def test_postgres_retry_after_a_lost_commit_decides_nothing_twice() -> None:
    with postgres_database() as url:
        ledger = PostgresEffectLedger(_LostAnswers(url))
        req = request_sha256({"amount": 1})
        claim = ledger.claim("root", "k", "t", req, "wf/run/1", 1)
        assert claim.outcome is ClaimOutcome.new and claim.claim_token
        assert ledger.complete("root", "k", claim.claim_token, {"ok": True})
        assert [e["event"] for e in ledger.events("root")] == ["claim:new", "complete"]


async def test_zombie_completion_is_rejected_and_nothing_is_charged_twice(
    temporal_env: WorkflowEnvironment,
    services: Services,
    store: Callable[[], EffectLedger],
    tmp_path: Path,
) -> None:
    client = await Client.connect(
        temporal_env.client.service_client.config.target_host,
        data_converter=pydantic_data_converter,
    )
    ledger = store()
    tools = EffectTools(
        services.effects_url,
        ledger,
        LedgerMode.ledger_query,
        crash_point="after_apply",
        crash_flag=tmp_path / "hung",
        hang_seconds=4.0,
    )
    queue = f"zombie-{uuid.uuid4().hex[:8]}"
    customer = f"zombie-{uuid.uuid4().hex[:6]}"
    async with Worker(
        client,
        task_queue=queue,
        workflows=[ChargeOnceWorkflow],
        activities=[tools.charge_customer],
        interceptors=[ForkInterceptor()],
    ):
        handle = await client.start_workflow(
            ChargeOnceWorkflow.run, customer, id=customer, task_queue=queue
        )
        assert await handle.result() == "recovered"  # attempt 2 found the applied charge by its key
        scope = effect_scope(
            client.namespace, lineage_root(customer, handle.first_execution_run_id or "")
        )
        for _ in range(100):  # wait for the zombie to wake up and try to complete
            if any(e["event"] == "complete:rejected" for e in ledger.events(scope)):
                break
            await asyncio.sleep(0.1)
    events = [(e["event"], e["epoch"]) for e in ledger.events(scope)]
    assert events == [
        ("claim:new", 1),
        ("claim:ambiguous", 2),
        ("complete", 2),
        ("complete:rejected", 2),
    ]
    charges = [
        e
        for e in services.effects_log()
        if e["kind"] == "charge" and e["params"]["customer"] == customer
    ]
    assert len(charges) == 1
    (entry,) = ledger.entries(scope)
    assert entry.epoch == 2 and entry.result is not None and entry.result["status"] == "recovered"
