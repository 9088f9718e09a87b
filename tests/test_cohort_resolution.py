"""Resolving a cohort from a real dev server: by workflow ids and by a visibility query,
runs whose fork point cannot be resolved excluded with the reason, and a plan digest that
covers the cohort (a run recorded later is not in an approved plan)."""

from __future__ import annotations

import asyncio
import json

import pytest
from agent_fixtures import AgentTestLab
from temporalio.client import WorkflowFailureError

from forklab.activities.runfork.cohort_reads import resolve_cohort
from forklab.experiments.cohort.plan import CohortPlan, check_digest
from forklab.experiments.cohort.spec import CohortExperimentSpec, parse_cohort_spec
from forklab.experiments.runfork.policy import ToolPolicy


def _spec(cohort: dict[str, object]) -> CohortExperimentSpec:
    raw = {
        "id": "research-cohort",
        "hypothesis": {"text": "a stronger model at the recommendations step rescues reports"},
        "seed": 1,
        "cohort": {"forks_per_world": 3, "outcome": "mypkg.scoring:ok", **cohort},
        "tools": {"workspace_write": "auto"},
        "worlds": [
            {"name": "baseline", "role": "baseline"},
            {"name": "slow", "role": "treatment", "model": "slow"},
        ],
    }
    return parse_cohort_spec(json.dumps(raw), "cohort.yaml")


async def _record(agent_lab: AgentTestLab, model: str) -> str:
    handle = await agent_lab.start_research(model=model)
    if model == "fast":
        with pytest.raises(WorkflowFailureError):
            await handle.result()
    else:
        await handle.result()
    return handle.id


async def test_a_cohort_resolves_by_ids_and_by_query_and_excludes_with_reasons(
    agent_lab: AgentTestLab,
) -> None:
    failed = await _record(agent_lab, "fast")
    fine = await _record(agent_lab, "slow")
    by_ids = await resolve_cohort(
        agent_lab.client,
        _spec({"workflow_ids": [failed, fine, "no-such-run"], "fork_at": "tool:charge_customer#1"}),
    )
    assert [r.workflow_id for r in by_ids.runs] == sorted([failed, fine])
    run = next(r for r in by_ids.runs if r.workflow_id == failed)
    steps = await agent_lab.lab.steps(failed)
    charge = next(
        s for s in steps if s.label == "charge_customer" or s.activity_type == "charge_customer"
    )
    assert (run.at_step, run.decisive_step, run.failed) == (charge.index - 1, charge.index, True)
    assert run.chain_run_ids and run.run_id == run.chain_run_ids[-1]
    assert [(e.workflow_id, e.reason) for e in by_ids.excluded] == [
        ("no-such-run", "no run with this id in the namespace")
    ]
    # the plan lists every tool the histories call, blocked unless the spec says otherwise
    assert by_ids.tools["charge_customer"] is ToolPolicy.block
    check_digest(by_ids)
    # a fork point that needs a failed step excludes runs without one, never substitutes
    strict = await resolve_cohort(
        agent_lab.client, _spec({"workflow_ids": [failed, fine], "fork_at": "failed"})
    )
    assert strict.runs == []
    assert {e.reason for e in strict.excluded} == {"failed: the run has no failed step"}
    past = await resolve_cohort(
        agent_lab.client, _spec({"workflow_ids": [fine], "fork_at": "step:99"})
    )
    assert "step:99 is past the run's" in past.excluded[0].reason

    queue = agent_lab.agent.agent_task_queue
    query = {
        "query": f"WorkflowType='ResearchPipeline' AND TaskQueue='{queue}'",
        "fork_at": "step:2",
    }
    plan = await _until(agent_lab, _spec(query), 2)
    assert sorted(r.workflow_id for r in plan.runs) == sorted([failed, fine])
    assert all(r.at_step == 2 for r in plan.runs)
    # a run recorded after approval: the approved plan (and its digest) do not include it
    late = await _record(agent_lab, "slow")
    again = await _until(agent_lab, _spec(query), 3)
    assert late in {r.workflow_id for r in again.runs}
    assert late not in {r.workflow_id for r in plan.runs}
    assert again.digest != plan.digest
    tampered = plan.model_copy(update={"runs": again.runs})
    with pytest.raises(ValueError, match="differs from its signed digest"):
        check_digest(tampered)


async def _until(agent_lab: AgentTestLab, spec: CohortExperimentSpec, runs: int) -> CohortPlan:
    """Visibility is eventually consistent: wait until the query sees ``runs`` runs."""
    plan = await resolve_cohort(agent_lab.client, spec)
    for _ in range(100):
        if len(plan.runs) + len(plan.excluded) >= runs:
            return plan
        await asyncio.sleep(0.1)
        plan = await resolve_cohort(agent_lab.client, spec)
    return plan
