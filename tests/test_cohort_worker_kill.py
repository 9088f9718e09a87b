"""A ``forklab worker`` running a cohort experiment, killed with SIGKILL while its fork
activities wait on their forks: a new worker takes over, the retried activities find the
forks already started (their ids are derived from the experiment run) instead of starting
others, and every fork is counted once."""

from __future__ import annotations

import asyncio
import contextlib
import json
from pathlib import Path

from agent_fixtures import AgentTestLab
from orchestration_lab import WorkerProcesses, cli_env, forklab, lab_settings
from temporalio.client import WorkflowFailureError
from temporalio.testing import WorkflowEnvironment

from forklab.activities.runfork.cohort_forks import OUTCOME_ROW
from forklab.activities.stores.fork_registry import ForkRegistry
from forklab.workflows.experiment.cohort_messages import CohortResult, CohortStatusView
from forklab.workflows.experiment.messages import Stage, Status, workflow_id


async def test_a_killed_worker_loses_no_fork_and_counts_none_twice(
    temporal_env: WorkflowEnvironment,
    agent_lab: AgentTestLab,
    tmp_path: Path,
    worker_processes: WorkerProcesses,
) -> None:
    settings = lab_settings(temporal_env, agent_lab.agent.home)
    env = cli_env(settings)
    ids = []
    for model in ["slow"] * 4 + ["medium"] * 2:
        handle = await agent_lab.start_research(model=model, temperature=1.0)
        with contextlib.suppress(WorkflowFailureError):
            await handle.result()
        ids.append(handle.id)
    spec = {
        "id": "killed-cohort",
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
    handle = temporal_env.client.get_workflow_handle(
        workflow_id("killed-cohort"), result_type=CohortResult
    )
    for _ in range(600):
        view = await handle.query("status", result_type=CohortStatusView)
        if view.stage is Stage.awaiting_approval:
            break
        await asyncio.sleep(0.1)
    approved = await asyncio.to_thread(forklab, env, "cohort", "approve", "killed-cohort")
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
    for run in ids:
        forks = registry.children(run)
        assert len(forks) == 6  # 2 worlds x k = 3, none started twice
        for fork in forks:
            rows = registry.decisions(fork.fork_workflow_id)
            assert [d["kind"] for d in rows].count(OUTCOME_ROW) == 1
