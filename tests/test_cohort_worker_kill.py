"""A ``forklab worker`` running a cohort experiment, killed with SIGKILL while its fork
activities wait on their forks: a new worker takes over, the retried activities find the
forks already started (their ids are derived from the experiment run) instead of starting
others, and every fork is counted once: in the result and in the shared ledger's fork
rows, on the SQLite ledger and on PostgreSQL."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from agent_fixtures import AgentTestLab
from orchestration_lab import WorkerProcesses, cli_env, forklab, lab_settings
from stores_lab import postgres_database
from temporalio.client import WorkflowFailureError
from temporalio.testing import WorkflowEnvironment

from forklab.activities.stores.fork_registry import ForkRegistry
from forklab.activities.stores.ledger import ForkOutcomeKind
from forklab.workers.config import Settings
from forklab.workers.stores import ledger
from forklab.workflows.experiment.cohort_messages import CohortResult, CohortStatusView
from forklab.workflows.experiment.messages import Stage, Status, workflow_id


@pytest.fixture(params=["sqlite", "postgresql"])
def ledger_url(request: pytest.FixtureRequest) -> Iterator[str | None]:
    """The worker's ledger: the home's SQLite file (None), or a PostgreSQL database."""
    if request.param == "sqlite":
        yield None
        return
    with postgres_database() as url:
        yield url


async def test_a_killed_worker_loses_no_fork_and_counts_none_twice(
    temporal_env: WorkflowEnvironment,
    agent_lab: AgentTestLab,
    tmp_path: Path,
    worker_processes: WorkerProcesses,
    ledger_url: str | None,
) -> None:
    name = f"killed-cohort-{'postgresql' if ledger_url else 'sqlite'}"
    settings = lab_settings(temporal_env, agent_lab.agent.home)
    env = cli_env(settings)
    if ledger_url is not None:
        env["FORKLAB_LEDGER"] = ledger_url
        settings = Settings.load({"home": settings.home}, env={"FORKLAB_LEDGER": ledger_url})
    ids = []
    for model in ["slow"] * 4 + ["medium"] * 2:
        handle = await agent_lab.start_research(model=model, temperature=1.0)
        with contextlib.suppress(WorkflowFailureError):
            await handle.result()
        ids.append(handle.id)
    spec = {
        "id": name,
        "hypothesis": {"text": "a stronger model rescues thin reports"},
        "seed": 9,
        "cohort": {
            "workflow_ids": ids,
            "limit": 6,
            "fork_at": "tool:charge_customer#1",
            "outcome": "forklab.experiments.cohort.scorers:final_score",
            "success_threshold": 1.0,
        },
        "worlds": [
            {"name": "baseline", "role": "baseline"},
            {"name": "candidate", "role": "treatment", "model": "candidate"},
        ],
        "budget": {"max_forks": 100, "max_concurrent_forks": 4},
    }
    path = tmp_path / "cohort.json"
    path.write_text(json.dumps(spec))
    log = tmp_path / "worker.log"
    first = worker_processes.start(env, log)
    started = await asyncio.to_thread(forklab, env, "cohort", "start", str(path))
    assert started.returncode == 0, started.stderr
    handle = temporal_env.client.get_workflow_handle(workflow_id(name), result_type=CohortResult)
    for _ in range(600):
        view = await handle.query("status", result_type=CohortStatusView)
        if view.stage is Stage.awaiting_approval:
            break
        await asyncio.sleep(0.1)
    approved = await asyncio.to_thread(forklab, env, "cohort", "approve", name)
    assert approved.returncode == 0, approved.stdout + approved.stderr
    for _ in range(600):
        view = await handle.query("status", result_type=CohortStatusView)
        if view.forks_done >= 4 and view.running > 0:
            break
        await asyncio.sleep(0.05)
    assert view.running > 0, "forks should be running when the worker is killed"
    worker_processes.kill(first)
    worker_processes.start(env, log)

    result = await asyncio.wait_for(handle.result(), timeout=180)
    assert result.status is Status.completed, result.error
    assert result.forks_done == 36 and result.forks_missing == 0
    registry = ForkRegistry(agent_lab.agent.forks_path)
    started = {f.fork_workflow_id for run in ids for f in registry.children(run)}
    for run in ids:
        assert len(registry.children(run)) == 6  # 2 worlds x k = 3, none started twice
    recorded = ledger(settings).experiment(name)
    assert recorded is not None and recorded.status == "completed"
    rows = ledger(settings).forks(name, recorded.run_id)
    # one row per fork, each of a fork that was started, none missing or doubled
    assert len(rows) == 36 and {r.fork_id for r in rows} == started
    assert all(r.outcome is not ForkOutcomeKind.missing and r.receipt_sha256 for r in rows)
    assert sum(r.tokens for r in rows) == result.tokens
