"""The rehearsal's side of a cohort: find the recorded runs (a visibility query or a list
of workflow ids), read each run's continue-as-new chain, and plan the cohort
(``forklab.experiments.cohort.plan``) without starting anything."""

from __future__ import annotations

from temporalio.client import Client

from forklab.activities.runfork.history_events import chain_steps
from forklab.activities.runfork.history_reads import RunNotFound, read_chain
from forklab.experiments.cohort.plan import (
    CohortPlan,
    ExcludedRun,
    RecordedRun,
    RunStatus,
    plan_cohort,
)
from forklab.experiments.cohort.spec import CohortExperimentSpec


async def cohort_ids(client: Client, spec: CohortExperimentSpec) -> list[str]:
    """The cohort's workflow ids: the spec's list, or the query's matches (distinct, at
    most ``limit``, in the order visibility returns them)."""
    cohort = spec.cohort
    if cohort.workflow_ids is not None:
        return list(cohort.workflow_ids)
    ids: list[str] = []
    assert cohort.query is not None  # the spec names exactly one source
    async for execution in client.list_workflows(cohort.query, limit=cohort.limit * 2):
        if execution.id not in ids:
            ids.append(execution.id)
        if len(ids) >= cohort.limit:
            break
    return ids


async def read_recorded(client: Client, workflow_id: str) -> RecordedRun:
    chain = await read_chain(client, workflow_id)
    last = chain[-1]
    return RecordedRun(
        workflow_id=workflow_id,
        run_id=last.run_id,
        chain_run_ids=[rec.run_id for rec in chain],
        workflow_type=last.workflow_type,
        status=RunStatus(last.status),
        steps=chain_steps(chain),
    )


async def resolve_cohort(client: Client, spec: CohortExperimentSpec) -> CohortPlan:
    """Every run of the cohort read and its fork point resolved, or excluded with why."""
    recorded: list[RecordedRun] = []
    missing: list[ExcludedRun] = []
    for workflow_id in await cohort_ids(client, spec):
        try:
            recorded.append(await read_recorded(client, workflow_id))
        except RunNotFound:
            missing.append(
                ExcludedRun(workflow_id=workflow_id, reason="no run with this id in the namespace")
            )
    return plan_cohort(spec, recorded, missing)
