"""A cohort experiment's payloads do not grow with what it finds: on a dev server whose
payload limit is 12,000 bytes, an experiment whose world harms every one of 40 runs
completes, and its report names every harmed run (in the stored Markdown and the report's
JSON), though a list of 40 fork pairs in the analysis' result, the ledger's input and the
run's result would pass the limit (each is about 200 bytes). An experiment that spent its
whole budget must not fail at its report because the report grew with the harm found."""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from agent_fixtures import Services, running_agent_lab
from cohort_lab import CohortLab, cohort_spec, running_cohort_lab
from cohort_workflows import ACTIVITIES, ORDER_DRIFT, ORDER_TOOLS, OrderDeskWorkflow
from orchestration_lab import SMALL_BLOB_LIMIT
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from forklab.contracts.cohort import LISTED_RUNS
from forklab.experiments.cohort.spec import CARRIED_STATE_BYTES
from forklab.temporal import ForkLabPlugin
from forklab.workflows.experiment.messages import Status

RUNS = 40


@pytest.fixture
async def cohort(
    small_blob_env: WorkflowEnvironment, services: Services, tmp_path: Path
) -> AsyncIterator[CohortLab]:
    async with (
        running_agent_lab(small_blob_env, services, tmp_path) as agents,
        running_cohort_lab(agents, tmp_path) as lab,
    ):
        yield lab


async def _payloads(cohort: CohortLab, workflow_id: str) -> list[tuple[int, str]]:
    """Every payload list (an input, a result) in every run of the experiment's chain: its
    size, and the field it is in."""
    found: list[tuple[int, str]] = []
    async for e in cohort.client.list_workflows(f"WorkflowId = '{workflow_id}'"):
        history = await cohort.client.get_workflow_handle(e.id, run_id=e.run_id).fetch_history()
        for event in history.events:
            for _, attributes in event.ListFields():
                for field, value in getattr(attributes, "ListFields", list)():
                    if hasattr(value, "payloads"):
                        size = sum(len(p.data) for p in value.payloads)
                        found.append((size, f"{type(attributes).__name__}.{field.name}"))
    return found


async def test_a_world_that_harms_every_run_reports_them_all_under_the_payload_limit(
    cohort: CohortLab,
) -> None:
    queue = f"orders-{uuid.uuid4().hex[:8]}"
    async with Worker(
        cohort.client,
        task_queue=queue,
        workflows=[OrderDeskWorkflow],
        activities=ACTIVITIES,
        plugins=[ForkLabPlugin(cohort.agents.agent.run_log_path)],
    ):
        handles = [
            await cohort.client.start_workflow(
                OrderDeskWorkflow.run, f"o{i}", id=f"order-{uuid.uuid4().hex[:8]}", task_queue=queue
            )
            for i in range(RUNS)
        ]
        for h in handles:
            await h.result()
        spec = cohort_spec(
            {
                "workflow_ids": [h.id for h in handles],
                "limit": RUNS,
                "fork_at": "tool:lookup_order#1",
            },
            [ORDER_DRIFT],
            tools=ORDER_TOOLS,
            budget={"max_forks": 6 * RUNS, "max_concurrent_forks": 8},
        )
        # a short history: the chain continues as new, carrying the matrix
        handle = await cohort.start(spec, history_events=400)
        await cohort.approve(handle)
        result = await handle.result()
    assert result.status is Status.completed, result.error
    report = result.report
    assert report is not None
    (drift,) = report.worlds
    assert drift.verdict == "harms" and drift.harms == RUNS
    # the report's own lines name the first fork pairs; the stored report names them all
    assert len(drift.harmed) == LISTED_RUNS
    markdown = cohort.markdown(report)
    assert (Path(report.report_dir) / "report.md").read_text() == markdown
    saved = json.loads((Path(report.report_dir) / "report.json").read_text())
    harmed = saved["listed"]["drift"]["harmed"]
    assert len(harmed) == RUNS and harmed[:LISTED_RUNS] == drift.harmed
    assert all(command in markdown for command in harmed)
    # the ledger's world row keeps what the line carried, and its count
    (row,) = [w for w in cohort.ledger.worlds(spec.id) if w.world == "drift"]
    assert json.loads(row.checks_json)["harms"] == RUNS
    payloads = await _payloads(cohort, handle.id)
    assert max(size for size, _ in payloads) < SMALL_BLOB_LIMIT
    # what the spec reckons a continue-as-new carries (before its allowance for the
    # state's fixed part, about 2 KB) bounds what the chain carried
    carried = [size for size, field in payloads if field.startswith("WorkflowExecutionContinued")]
    assert carried and max(carried) <= spec.carried_bytes() - CARRIED_STATE_BYTES + 4_000
