"""History: continue-as-new gives the identical report; recorded histories replay."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from concurrent.futures import Executor
from pathlib import Path

import pytest
from temporalio import workflow
from temporalio.client import WorkflowFailureError, WorkflowHistory
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Replayer
from temporalio.workflow import NondeterminismError

from forklab.workflows.experiment import run_state
from forklab.workflows.experiment.messages import (
    ExperimentInput,
    ExperimentResult,
    Stage,
    Status,
    workflow_id,
)
from forklab.workflows.experiment.workflow import ExperimentWorkflow

# This module defines a workflow, so the workflow sandbox re-imports it: pass the helpers
# (which touch the file system at import) and the worker wiring through instead of
# re-importing them there.
with workflow.unsafe.imports_passed_through():
    from orchestration_lab import (
        SMALL_BLOB_LIMIT,
        Lab,
        lab_settings,
        make_spec,
        science,
        start_dev_server,
    )

    from bench.campaign import chain_runs
    from forklab.activities.experiment.approval_keys import new_private_key, public_key_hex
    from forklab.activities.experiment.progress import read_progress
    from forklab.cli.experiment.rehearsal import rehearse
    from forklab.workers.experiment.worker import (  # store clients import urllib3
        build_worker,
        workflow_runner,
    )


@pytest.fixture(scope="module")
async def eager_env() -> AsyncIterator[WorkflowEnvironment]:
    """A dev server that suggests continue-as-new after 30 history events."""
    env = await start_dev_server(
        "--dynamic-config-value", "limit.historyCount.suggestContinueAsNew=30"
    )
    yield env
    await env.shutdown()


async def test_a_long_chain_keeps_every_payload_under_a_fixed_limit(
    small_blob_env: WorkflowEnvironment, cpu: Executor, tmp_path: Path
) -> None:
    """Many small chunks and a low history limit: the run continues as new many times.
    No payload (progress saved, progress or checkpoints read back, a run's input, the
    analysis' input, the status query) may grow with the chunks done, or a large
    experiment fails mid-run when one passes Temporal's limit; the chain still gives the
    twin's outcomes."""
    spec = make_spec(episodes=72)
    lab = Lab(client=small_blob_env.client, settings=lab_settings(small_blob_env, tmp_path))
    key = new_private_key()
    async with build_worker(lab.client, lab.settings, cpu):
        handle = await lab.client.start_workflow(
            ExperimentWorkflow.run,
            ExperimentInput(
                spec=spec,
                approver_public_key=public_key_hex(key),
                batch_episodes=2,  # 36 chunks: 36 prefixes and 108 world batches
                rehearsal_episodes=0,
                history_events=120,
                workload_bundle=lab.ship(spec),
            ),
            id=workflow_id(spec.id),
            task_queue=lab.settings.task_queue,
            result_type=ExperimentResult,
        )
        await lab.approve(handle, key)
        # a payload over the limit fails the workflow task over and over: bound the wait
        result = await asyncio.wait_for(handle.result(), timeout=240)
        view = await lab.status(handle)
    assert result.status is Status.completed, result.error
    assert result.analysis is not None
    assert result.analysis.outcomes_digest == rehearse(spec).outcomes_digest
    assert [w.episodes for w in result.worlds] == [72, 72, 72]
    assert view.progress.prefixes_done == 36 and view.progress.batches_completed == 108
    assert len(view.model_dump_json()) < SMALL_BLOB_LIMIT
    first = handle.first_execution_run_id or handle.result_run_id or ""
    runs = await chain_runs(lab.client, handle.id, first)
    assert len(runs) == result.runs >= 5
    largest = max(r.largest_event_bytes for r in runs)
    assert largest < SMALL_BLOB_LIMIT
    # runs that started world batches on earlier runs' prefixes loaded their checkpoints
    assert any("load_prefix_refs" in r.spans for r in runs)
    # every run of the chain replays (the tally it inherited, the windows it loaded)
    replayer = Replayer(
        workflows=[ExperimentWorkflow],
        data_converter=pydantic_data_converter,
        workflow_runner=workflow_runner(),
    )
    for r in runs:
        run = lab.client.get_workflow_handle(handle.id, run_id=r.run_id)
        await replayer.replay_workflow(await run.fetch_history())
    assert sum(sum(r.world_runs.values()) for r in runs) == 72 * 3  # each batch ran once
    # the progress as one payload (what a continued run used to load) would not fit
    digest = next(r.progress_digest for r in runs if r.progress_digest)
    whole = len(read_progress(lab.store, digest).model_dump_json())
    assert whole > SMALL_BLOB_LIMIT
    print(f"runs {len(runs)}, largest event {largest} B, whole progress {whole} B")


async def test_a_run_saves_its_records_mid_run_and_loses_none(
    lab: Lab, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run saves its records every ``SAVE_EVERY`` (lowered here to 4) while batches still
    run; records that complete during a save are kept for the next one, so the analysis
    finds every batch and the outcomes are the twin's."""
    monkeypatch.setattr(run_state, "SAVE_EVERY", 4)  # read by each run as it starts
    spec = make_spec(episodes=24)
    # 12 chunks: 12 prefixes and 12 world groups of three worlds, 48 records
    handle, key = await lab.start(spec, batch_episodes=2)
    await lab.approve(handle, key)
    result = await handle.result()
    assert result.status is Status.completed, result.error
    assert result.runs == 1 and result.analysis is not None
    assert result.analysis.outcomes_digest == rehearse(spec).outcomes_digest
    assert [w.episodes for w in result.worlds] == [24, 24, 24]
    saves = (await lab.activity_types(handle)).count("save_progress")
    assert saves >= 48 // 6, saves  # each takes 4 to 6 records (a group adds three at once)


async def test_continue_as_new_gives_the_identical_report(
    lab: Lab, eager_env: WorkflowEnvironment, cpu: Executor, tmp_path: Path
) -> None:
    spec = make_spec(episodes=36)
    handle, key = await lab.start(spec, batch_episodes=6)
    await lab.approve(handle, key)
    plain = await handle.result()
    assert plain.status is Status.completed and plain.runs == 1

    eager = Lab(client=eager_env.client, settings=lab_settings(eager_env, tmp_path / "eager"))
    async with build_worker(eager.client, eager.settings, cpu):
        handle, key = await eager.start(spec, batch_episodes=6)
        await eager.approve(handle, key)
        chained = await handle.result()
    assert chained.status is Status.completed, chained.error
    assert chained.runs > 1  # it really continued as new
    assert plain.analysis is not None and chained.analysis is not None
    assert chained.analysis.outcomes_digest == plain.analysis.outcomes_digest
    assert science(eager.store.get_json(chained.analysis.report_digest)) == science(
        lab.store.get_json(plain.analysis.report_digest)
    )
    assert chained.budget.skipped_batches == 0
    assert [w.episodes for w in chained.worlds] == [36, 36, 36]
    assert len(eager.ledger.worlds(spec.id)) == 3  # one row per world across the chain


@workflow.defn(name="ForkLabExperiment")
class ReorderedWorkflow(ExperimentWorkflow):
    """The same workflow type with its first step changed: replay must notice."""

    @workflow.run
    async def run(self, inp: ExperimentInput) -> ExperimentResult:
        await workflow.sleep(1)
        return await super().run(inp)


async def test_recorded_history_replays(lab: Lab) -> None:
    spec = make_spec(episodes=12)
    handle, key = await lab.start(spec, batch_episodes=6)
    await lab.approve(handle, key)
    assert (await handle.result()).status is Status.completed
    history = WorkflowHistory.from_json(handle.id, (await handle.fetch_history()).to_json())

    replayer = Replayer(
        workflows=[ExperimentWorkflow],
        data_converter=pydantic_data_converter,
        workflow_runner=workflow_runner(),
    )
    await replayer.replay_workflow(history)

    changed = Replayer(
        workflows=[ReorderedWorkflow],
        data_converter=pydantic_data_converter,
        workflow_runner=workflow_runner(),
    )
    with pytest.raises(NondeterminismError):
        await changed.replay_workflow(history)


async def test_a_run_continued_mid_execution_gives_the_same_outcomes_and_carries_little(
    lab: Lab,
) -> None:
    """A low history limit makes the run continue as new between its prefix chunks and
    world batches; the chain reports the same outcomes as one run, each run stays under
    the limit, and what a continued run inherits does not grow with the work done."""
    spec = make_spec(episodes=36)
    # Small chunks: a chunk's worlds run as one unit, so 18 chunks give ~36 units, enough
    # to continue as new ~4 times under this limit whatever the machine's pace (at 6
    # chunks a slow runner batched results into fewer events and continued only once).
    handle, key = await lab.start(spec, batch_episodes=2)
    await lab.approve(handle, key)
    plain = await handle.result()
    assert plain.status is Status.completed and plain.runs == 1

    limit = 120
    spec2 = spec.model_copy(update={"id": f"{spec.id}-chain"})
    key2 = new_private_key()
    chained_handle = await lab.client.start_workflow(
        ExperimentWorkflow.run,
        ExperimentInput(
            spec=spec2,
            approver_public_key=public_key_hex(key2),
            batch_episodes=2,
            rehearsal_episodes=0,
            history_events=limit,
            workload_bundle=lab.ship(spec2),
        ),
        id=workflow_id(spec2.id),
        task_queue=lab.settings.task_queue,
        result_type=ExperimentResult,
    )
    await lab.approve(chained_handle, key2)
    chained = await chained_handle.result()
    assert chained.status is Status.completed, chained.error
    assert plain.analysis is not None and chained.analysis is not None
    assert chained.analysis.outcomes_digest == plain.analysis.outcomes_digest
    assert [w.episodes for w in chained.worlds] == [36, 36, 36]  # nothing counted twice

    first = chained_handle.first_execution_run_id or chained_handle.result_run_id or ""
    runs = await chain_runs(lab.client, chained_handle.id, first)
    assert len(runs) == chained.runs >= 3
    assert all(r.events < limit for r in runs), [r.events for r in runs]
    # it continued as new in the middle of the work, not only while awaiting approval
    assert {r.carry_stage for r in runs[1:]} >= {Stage.running_worlds.value}
    # the carry is aggregates, spans and one digest: the same size whatever the progress
    # (bytes move with the digits of the budget's numbers and counts, and a world's pace
    # appears once its first batch completed)
    carries = [r.carry_bytes for r in runs[1:]]
    assert max(carries) - min(carries) < 64 * len(spec.worlds), carries
    # every world batch ran once across the chain
    assert sum(sum(r.world_runs.values()) for r in runs) == 36 * 3

    # An attacker who reads a continued run's input (an approved carry) cannot start
    # another experiment with it: only the workflow's own continue-as-new hands one over.
    continued = await lab.client.get_workflow_handle(
        chained_handle.id, run_id=runs[1].run_id
    ).fetch_history()
    started = continued.events[0].workflow_execution_started_event_attributes
    (recorded,) = await pydantic_data_converter.decode(started.input.payloads, [ExperimentInput])
    assert recorded.carry is not None and recorded.carry.approval.status.value == "approved"
    forged_spec = spec.model_copy(update={"id": f"{spec.id}-forged"})
    forged = lab.client.get_workflow_handle(
        (
            await lab.client.start_workflow(
                ExperimentWorkflow.run,
                recorded.model_copy(update={"spec": forged_spec}),
                id=workflow_id(forged_spec.id),
                task_queue=lab.settings.task_queue,
            )
        ).id
    )
    with pytest.raises(WorkflowFailureError) as refused:
        await forged.result()
    assert "carry" in str(refused.value.cause)
    assert lab.ledger.experiment(forged_spec.id) is None
    assert lab.sandbox_folders() == []
