"""A cohort fork's child workflows belong to the experiment, durably on a real dev server:
a third-party-style workflow hands each order to a courier child it abandons (the child
outlives its parent). In a cohort experiment every fork's courier carries the
experiment run's ``ForkLabExperiment`` search attribute and, in its child marker, the
fork's ``cohort`` part, so the experiment's cleanup finds and stops it: no courier of
the experiment is left running. The couriers of the recorded runs are not touched."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from agent_fixtures import AgentTestLab
from cohort_lab import CohortLab, cohort_spec, running_cohort_lab
from cohort_workflows import ACTIVITIES, CourierWorkflow, OrderDispatchWorkflow
from temporalio.worker import Worker

from forklab.contracts.runfork import MARKER_MEMO_KEY, ForkMarker
from forklab.temporal import ForkLabPlugin
from forklab.workflows.experiment.messages import Status


@pytest.fixture
async def cohort(agent_lab: AgentTestLab, tmp_path: Path) -> AsyncIterator[CohortLab]:
    async with running_cohort_lab(agent_lab, tmp_path) as lab:
        yield lab


async def _count(lab: CohortLab, query: str) -> int:
    return len([e async for e in lab.client.list_workflows(query)])


async def test_a_forks_children_carry_the_experiment_and_cleanup_stops_them(
    cohort: CohortLab,
) -> None:
    queue = f"dispatch-{uuid.uuid4().hex[:8]}"
    plugin = ForkLabPlugin(cohort.agents.agent.run_log_path)
    async with Worker(
        cohort.client,
        task_queue=queue,
        workflows=[OrderDispatchWorkflow, CourierWorkflow],
        activities=ACTIVITIES,
        plugins=[plugin],
    ):
        ids = []
        for i in range(3):
            h = await cohort.client.start_workflow(
                OrderDispatchWorkflow.run,
                f"o{i}",
                id=f"dispatch-{uuid.uuid4().hex[:8]}",
                task_queue=queue,
            )
            await h.result()
            ids.append(h.id)
        spec = cohort_spec(
            {"workflow_ids": ids, "limit": 3, "fork_at": "tool:lookup_order#1"},
            [
                {
                    "name": "couriers",
                    "role": "treatment",
                    "tool_policies": {"Courier": "live"},
                }
            ],
            tools={"lookup_order": "live", "Courier": "live"},
        )
        handle = await cohort.start(spec)
        await cohort.approve(handle)
        result = await handle.result()
        assert result.status is Status.completed, result.error
        run_key = f"{handle.id}/{handle.result_run_id}"
        tagged = f"WorkflowType = 'Courier' AND ForkLabExperiment = '{run_key}'"
        for _ in range(100):  # visibility is eventually consistent
            if await _count(cohort, tagged) == 9:
                break
            await asyncio.sleep(0.1)
        # the treatment's 3 x k = 3 forks each started a courier (the baseline's forks
        # are refused theirs: the signed list's default blocks the child workflow type)
        couriers = [e async for e in cohort.client.list_workflows(tagged)]
        assert len(couriers) == 9
        assert await _count(cohort, f"{tagged} AND ExecutionStatus = 'Running'") == 0
        assert result.cleanup is not None and result.cleanup.cancelled >= 9
        child = await cohort.client.get_workflow_handle(couriers[0].id).describe()
        memo = await child.memo()
        marker = ForkMarker.model_validate(memo[MARKER_MEMO_KEY])
        assert marker.cohort is not None and marker.cohort.world == "couriers"
        assert marker.cohort.experiment == run_key
        # the recorded runs' own couriers are none of the experiment's business
        for wid in ids:
            own = cohort.client.get_workflow_handle(f"{wid}-courier")
            assert (await own.describe()).status.name == "RUNNING"
            await own.terminate("test over")
