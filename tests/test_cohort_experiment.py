"""Experiments over a cohort of recorded agent runs, durably, on a real dev server: real
forks of the shipped research pipeline (its model calls to the local stand-in over HTTP,
its charge tool to the local payments service), started by the experiment's activities
with the run-fork half's starter.

Checked: the approved plan covers exactly the cohort it showed (a run recorded after the
approval is not forked); the A/A noise floor is the baseline forks' own flip rate; a
placebo is inside the floor and, with per-call seeds, matches the baseline fork for fork;
a positive control (a model-provider brownout) is detected as harming; the charge tool,
blocked by the signed list's default, is never reached; a cancel mid-experiment leaves no
fork running; the report and the ledger rows."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from agent_fixtures import AgentTestLab
from cohort_lab import SCORER, CohortLab, cohort_spec, running_cohort_lab
from cohort_workflows import ACTIVITIES, ORDER_DRIFT, ORDER_TOOLS, OrderDeskWorkflow
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from temporalio.client import WorkflowFailureError
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Replayer, Worker

from forklab.agents.research import ResearchPipelineWorkflow
from forklab.agents.support import SupportAgentWorkflow, SupportInput
from forklab.contracts.cohort import cohort_fork_id
from forklab.experiments.cohort.noise import noise_floor
from forklab.experiments.runfork.policy import ToolPolicy
from forklab.temporal import ForkLabPlugin
from forklab.workers.experiment.worker import workflow_runner
from forklab.workers.runfork.agent_worker import agents_plugin, fork_plugin
from forklab.workflows.experiment.cohort_workflow import CohortExperimentWorkflow
from forklab.workflows.experiment.messages import Stage, Status


@pytest.fixture
async def cohort(agent_lab: AgentTestLab, tmp_path: Path) -> AsyncIterator[CohortLab]:
    async with running_cohort_lab(agent_lab, tmp_path) as lab:
        yield lab


async def _visible(lab: CohortLab, query: str, count: int) -> None:
    """Visibility is eventually consistent: wait until ``query`` lists ``count`` runs."""
    for _ in range(200):
        if len([e async for e in lab.client.list_workflows(query)]) >= count:
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"visibility never listed {count} runs for {query}")


async def test_an_approved_cohort_experiment_measures_the_floor_and_detects_a_harm(
    cohort: CohortLab,
) -> None:
    # a cohort that mostly passes (slow) and one that sometimes fails (any other model
    # name: the stand-in's default behaviour), sampled at temperature 1
    await cohort.record(["slow"] * 9 + ["medium"] * 3)
    query = (
        f"WorkflowType='ResearchPipeline' AND TaskQueue='{cohort.agents.agent.agent_task_queue}'"
    )
    await _visible(cohort, query, 12)
    spec = cohort_spec(
        {"query": query, "limit": 20},
        [
            {"name": "noop", "role": "placebo", "prompt_patch": {"text": "Be yourself."}},
            {
                "name": "outage",
                "role": "positive_control",
                "faults": [{"kind": "brownout", "rate": 1.0}],
            },
        ],
    )
    handle = await cohort.start(spec)
    shown = await cohort.until_stage(handle, Stage.awaiting_approval)
    assert shown.runs == 12 and shown.excluded == 0
    # the signed tool list: the charge tool is blocked (the default for undeclared tools)
    assert shown.tools == {"charge_customer": ToolPolicy.block.value}
    # a run recorded while the plan awaits approval is in no approved plan
    late = (await cohort.record(["slow"]))[0]
    await _visible(cohort, query, 13)
    charges = cohort.agents.charges()
    # a signature over another plan, or by another key, approves nothing
    other = await cohort.approve(handle, fingerprint="0" * 64)
    assert not other["accepted"] and "wrong plan fingerprint" in other["reason"]
    stranger = await cohort.approve(handle, key=Ed25519PrivateKey.generate())
    assert not stranger["accepted"] and "bad signature" in stranger["reason"]
    attempt = await cohort.approve(handle)
    assert attempt["accepted"], attempt
    result = await handle.result()

    assert result.status is Status.completed, result.error
    # the workflow carries the plan as a stored digest; the runs are read from the store
    assert result.plan_artifact == shown.plan_artifact
    planned = cohort.plan_ids(result.plan_artifact)
    assert len(planned) == 12 and late not in planned
    assert cohort.registry.children(late) == []
    assert result.forks_done == 12 * 3 * 3 and result.forks_missing == 0
    assert result.cleanup is not None and result.cleanup.remaining == 0
    # the blocked charge tool was never reached by any of the 108 forks
    assert cohort.agents.charges() == charges

    report = result.report
    assert report is not None
    saved = json.loads((Path(report.report_dir) / "report.json").read_text())
    outcomes = saved["outcomes"]
    # per-call seeds: the placebo's forks drew what the baseline's did, fork for fork
    assert outcomes["noop"] == outcomes["baseline"]
    # the noise floor is the baseline forks' own flip rate
    floor = noise_floor([[c == "1" for c in row] for row in outcomes["baseline"]])
    assert report.flip_rate == pytest.approx(floor.flip_rate)
    assert report.flip_ci_low <= report.flip_rate <= report.flip_ci_high
    lines = {w.world: w for w in report.worlds}
    assert lines["noop"].verdict == "inside_noise_floor" and lines["noop"].as_expected
    assert lines["outage"].verdict == "harms" and lines["outage"].as_expected
    assert lines["outage"].harms >= 1
    # every harmed run names the fork pair to read
    for command in lines["outage"].harmed:
        assert command.startswith("forklab diff cohort-")
    markdown = cohort.markdown(report)
    assert "Noise floor" in markdown and "| outage | positive_control |" in markdown
    assert (Path(report.report_dir) / "report.md").read_text() == markdown

    # ledger: the experiment's row, one per world, one per fork
    row = cohort.ledger.experiment(spec.id)
    assert row is not None and row.status == "completed"
    assert row.plan_fingerprint == result.fingerprint
    assert {w.world for w in cohort.ledger.worlds(spec.id)} == {"baseline", "noop", "outage"}
    run_key = f"{handle.id}/{handle.result_run_id}"
    fork = cohort_fork_id(run_key, 0, "outage", 2)
    forks = cohort.ledger.forks(spec.id, row.run_id)
    assert len(forks) == 108 and len({f.fork_id for f in forks}) == 108
    (one,) = [f for f in forks if f.fork_id == fork]
    assert (one.world, one.run_index, one.fork) == ("outage", 0, 2)
    assert one.lineage_root and len(one.receipt_sha256) == 64
    assert sum(f.tokens for f in forks) == result.tokens
    receipt = cohort.registry.receipt(fork)
    assert receipt is not None and receipt.tool_policies["charge_customer"] is ToolPolicy.block

    # both histories replay on the code as it is: the experiment's, and a fork's whose
    # model calls the interceptor seeded and failed (the brownout)
    await Replayer(
        workflows=[CohortExperimentWorkflow],
        data_converter=pydantic_data_converter,
        workflow_runner=workflow_runner(),
    ).replay_workflow(await handle.fetch_history())
    agent = cohort.agents.agent
    await Replayer(
        workflows=[ResearchPipelineWorkflow],
        plugins=[agents_plugin(agent), fork_plugin(agent)],
    ).replay_workflow(await cohort.client.get_workflow_handle(fork).fetch_history())


async def test_a_tool_fault_on_a_third_party_workflow_is_detected(cohort: CohortLab) -> None:
    queue = f"orders-{uuid.uuid4().hex[:8]}"
    plugin = ForkLabPlugin(cohort.agents.agent.run_log_path)
    async with Worker(
        cohort.client,
        task_queue=queue,
        workflows=[OrderDeskWorkflow],
        activities=ACTIVITIES,
        plugins=[plugin],
    ):
        ids = []
        for i in range(8):
            h = await cohort.client.start_workflow(
                OrderDeskWorkflow.run, f"o{i}", id=f"order-{uuid.uuid4().hex[:8]}", task_queue=queue
            )
            await h.result()
            ids.append(h.id)
        spec = cohort_spec(
            {
                "workflow_ids": ids,
                "limit": 8,
                "fork_at": "tool:lookup_order#1",
                "success_threshold": 1.0,
            },
            [ORDER_DRIFT],
            tools=ORDER_TOOLS,
        )
        handle = await cohort.start(spec)
        await cohort.approve(handle)
        result = await handle.result()
    assert result.status is Status.completed, result.error
    assert result.report is not None
    (drift,) = result.report.worlds
    assert drift.verdict == "harms" and drift.as_expected and drift.harms == 8
    assert result.report.flip_rate == 0.0  # a deterministic workflow has no noise floor
    # the fault changed the live call's response, never the recorded parent
    run_key = f"{handle.id}/{handle.result_run_id}"
    baseline = await cohort.agents.lab.steps(cohort_fork_id(run_key, 0, "baseline", 0))
    assert [s.origin for s in baseline] == ["inherited", "own"]


async def test_the_agents_sdk_support_agent_draws_with_the_forks_seeds(cohort: CohortLab) -> None:
    """The Agents SDK agent's model calls carry the fork's seed (in the model settings'
    ``extra_args``): a placebo's forks make, fork for fork, the calls the baseline's make
    (the email the model writes: tone, refund, address), though every fork samples at
    temperature 1 and the stand-in would otherwise draw from its own request counter."""
    agents = cohort.agents
    ids = []
    for i in range(3):
        handle = await agents.client.start_workflow(
            SupportAgentWorkflow.run,
            SupportInput(ticket=f"I want a refund for order {i}", model="medium", temperature=1.0),
            id=f"support-{uuid.uuid4().hex[:8]}",
            task_queue=agents.agent.agent_task_queue,
        )
        await handle.result()
        ids.append(handle.id)
    spec = cohort_spec(
        {
            "workflow_ids": ids,
            "limit": 3,
            "fork_at": "step:0",
            "outcome": "forklab.experiments.cohort.scorers:completed",
        },
        [{"name": "noop", "role": "placebo", "prompt_patch": {"text": "Be yourself."}}],
        tools={"email.send": "live"},
    )
    handle = await cohort.start(spec)
    await cohort.approve(handle)
    result = await handle.result()
    assert result.status is Status.completed, result.error
    run_key = f"{handle.id}/{handle.result_run_id}"
    # per fork: the email it sent (its input digest), or None when the model skipped it
    emails: dict[str, list[str | None]] = {"baseline": [], "noop": []}
    for world, sent in emails.items():
        for run in range(3):
            for fork in range(3):
                steps = await agents.lab.steps(cohort_fork_id(run_key, run, world, fork))
                mail = [s.input_sha256 for s in steps if s.activity_type == "email.send"]
                sent.append(mail[0] if mail else None)
    assert emails["noop"] == emails["baseline"]
    # the forks draw differently from one another (the seeds differ by run and fork)
    assert len(set(emails["baseline"])) > 2


async def test_cancel_mid_experiment_leaves_no_fork_running(cohort: CohortLab) -> None:
    ids = await cohort.record(["slow"] * 6)
    spec = cohort_spec(
        {"workflow_ids": ids, "limit": 6},
        [{"name": "bigger", "role": "treatment", "model": "candidate"}],
        budget={"max_forks": 100, "max_concurrent_forks": 4},
    )
    handle = await cohort.start(spec)
    await cohort.approve(handle)
    for _ in range(300):
        view = await cohort.status(handle)
        if view.running > 0 and view.forks_done >= 2:
            break
        await asyncio.sleep(0.05)
    await handle.cancel()
    with pytest.raises(WorkflowFailureError):
        await handle.result()
    view = await cohort.status(handle)
    assert view.status is Status.cancelled and view.forks_done < 36
    run_key = f"{handle.id}/{handle.result_run_id}"
    running = f"ForkLabExperiment = '{run_key}' AND ExecutionStatus = 'Running'"
    started = f"ForkLabExperiment = '{run_key}'"
    assert [e async for e in cohort.client.list_workflows(started)], "no fork had started"
    assert [e.id async for e in cohort.client.list_workflows(running)] == []
    row = cohort.ledger.experiment(spec.id)
    assert row is not None and row.status == "cancelled"


async def test_a_long_experiment_continues_as_new_carrying_its_aggregates(
    cohort: CohortLab,
) -> None:
    """Votes that stop once decided, across continue-as-new: the carry holds aggregates
    and the plan's digest, never the plan's runs."""
    ids = await cohort.record(["slow"] * 4 + ["medium"] * 2)
    spec = cohort_spec(
        {"workflow_ids": ids, "limit": 6, "stop_when_decided": True},
        [
            {
                "name": "full",
                "role": "treatment",
                "prompt_patch": {"text": "Write every section in full."},
            }
        ],
        budget={"max_forks": 100, "max_concurrent_forks": 4},
    )
    handle = await cohort.start(spec, history_events=100)
    await cohort.approve(handle)
    result = await handle.result()
    assert result.status is Status.completed, result.error
    assert result.runs_of_chain > 2  # the history limit made it continue as new
    assert result.forks_done + result.forks_saved == 6 * 2 * 3 and result.forks_missing == 0
    # the baseline runs every fork; a treatment's run stops once its majority is decided
    assert result.forks_done >= 6 * 3 + 6 * 2
    assert result.report is not None and result.report.saved_forks == result.forks_saved
    # every fork counted once: the ledger rows match the forks the chain started
    run_key = f"{handle.id}/{handle.result_run_id}"
    started = [e.id async for e in cohort.client.list_workflows(f"ForkLabExperiment = '{run_key}'")]
    assert len(set(started)) == result.forks_done
    rows = cohort.ledger.forks(spec.id, handle.result_run_id or "")
    assert sorted(r.fork_id for r in rows) == sorted(set(started))
    assert {w.world for w in result.report.worlds} == {"full"}
    # no run of the chain carried the plan's runs (their run ids are in the plan, not in
    # the spec): not in a continue-as-new input, not in an activity's input
    run_ids = [(await cohort.client.get_workflow_handle(w).describe()).run_id for w in ids]
    first = cohort.client.get_workflow_handle(handle.id, run_id=handle.result_run_id)
    history = await first.fetch_history()
    payloads = [
        p.data
        for e in history.events
        for p in (
            list(e.workflow_execution_continued_as_new_event_attributes.input.payloads)
            + list(e.activity_task_scheduled_event_attributes.input.payloads)
        )
    ]
    assert payloads and not any(r.encode() in data for data in payloads for r in run_ids)
    # every run of the chain stayed under its 100 events, 4 forks at a time
    lengths = [
        e.history_length async for e in cohort.client.list_workflows(f"WorkflowId = '{handle.id}'")
    ]
    assert len(lengths) == result.runs_of_chain and max(lengths) < 100, lengths


async def test_a_start_carrying_a_carry_is_refused(cohort: CohortLab) -> None:
    """Only the workflow's own continue-as-new hands over a carry (it holds the approval):
    a start that brings one fails at once, before anything is read or started."""
    ids = await cohort.record(["slow"])
    spec = cohort_spec(
        {"workflow_ids": ids, "limit": 1},
        [{"name": "bigger", "role": "treatment", "model": "candidate"}],
    )
    forged = {
        "origin_run_id": "x",
        "runs": 1,
        "stage": "running_worlds",
        "message": "",
        "rehearsal": {
            "plan": {"artifact": "0" * 64, "digest": "", "runs": 0, "excluded": 0, "tools": {}},
            "scorer": SCORER,
            "forks": 0,
            "estimated_model_calls": 0,
            "estimated_tokens": 0,
            "estimated_world_seconds": 0.0,
            "fingerprint": "f",
            "capacity_ok": True,
        },
        "approval": {"status": "approved"},
        "progress": {},
    }
    handle = await cohort.start(spec, carry=forged)
    with pytest.raises(WorkflowFailureError) as failed:
        await handle.result()
    assert "only the workflow's own continue-as-new" in str(failed.value.cause)
    assert cohort.registry.children(ids[0]) == []


async def test_a_scorer_of_your_own_without_its_bundle_is_refused_before_anything_starts(
    cohort: CohortLab,
) -> None:
    ids = await cohort.record(["slow"])
    spec = cohort_spec(
        {"workflow_ids": ids, "limit": 1, "outcome": "mypkg.scoring:resolved"},
        [{"name": "bigger", "role": "treatment", "model": "candidate"}],
    )
    handle = await cohort.start(spec)
    with pytest.raises(WorkflowFailureError) as failed:
        await handle.result()
    assert "is your own code, which runs in a box from the bundle" in str(failed.value.cause)
    assert cohort.registry.children(ids[0]) == []
