"""History: continue-as-new gives the identical report; recorded histories replay."""

from __future__ import annotations

from collections.abc import AsyncIterator
from concurrent.futures import Executor
from pathlib import Path

import pytest
from temporalio import workflow
from temporalio.client import WorkflowHistory
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Replayer
from temporalio.workflow import NondeterminismError

from workflows.experiment import ExperimentWorkflow
from workflows.messages import ExperimentInput, ExperimentResult, Status

# This module defines a workflow, so the workflow sandbox re-imports it: pass the helpers
# (which touch the file system at import) and the worker wiring through instead of
# re-importing them there.
with workflow.unsafe.imports_passed_through():
    from orchestration_lab import Lab, lab_settings, make_spec, science, start_dev_server

    from workers.worker import build_worker, workflow_runner  # store clients import urllib3


@pytest.fixture(scope="module")
async def eager_env() -> AsyncIterator[WorkflowEnvironment]:
    """A dev server that suggests continue-as-new after 30 history events."""
    env = await start_dev_server(
        "--dynamic-config-value", "limit.historyCount.suggestContinueAsNew=30"
    )
    yield env
    await env.shutdown()


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
