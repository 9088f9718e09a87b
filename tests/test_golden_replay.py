"""The committed golden histories (``tests/golden/``) replay, offline, on the workflow code
as it is now: an experiment run, an agent run, a fork of it and a fork of that fork.

They were recorded by an earlier version (``scripts/record_golden_histories.py``,
``make golden``), so a change that makes the workflows decide differently on a recorded
history — a determinism break that would strand every run in flight when a worker is
upgraded — fails here, with no server. A run under a sequential design (waves, a look
after each, a world stopped at the first) has a history of its own. That each replay can
fail is shown on the same histories: a workflow whose first step differs is refused, and a
fork's history does not replay without the fork interceptor that serves its inherited
steps.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from golden_variants import ExperimentSleepingFirst, ResearchSleepingFirst
from temporalio import workflow
from temporalio.client import WorkflowHistory
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Replayer

from forklab.agents.research import ResearchPipelineWorkflow
from forklab.workflows.experiment.workflow import ExperimentWorkflow

with workflow.unsafe.imports_passed_through():
    from forklab.workers.experiment.worker import workflow_runner
    from forklab.workers.runfork.agent_config import AgentSettings
    from forklab.workers.runfork.agent_worker import agents_plugin, fork_plugin

GOLDEN = Path(__file__).resolve().parent / "golden"
INDEX: dict[str, dict[str, str]] = json.loads((GOLDEN / "index.json").read_text())
AGENT_RUNS = ("agent_run", "fork", "fork_of_fork")


def golden(name: str) -> WorkflowHistory:
    return WorkflowHistory.from_json(
        INDEX[name]["workflow_id"], (GOLDEN / f"{name}.json").read_text(encoding="utf-8")
    )


def experiment_replayer(*workflows: type) -> Replayer:
    """Set up as ``forklab.workers.experiment.worker.build_worker`` sets up its worker."""
    return Replayer(
        workflows=list(workflows or [ExperimentWorkflow]),
        data_converter=pydantic_data_converter,
        workflow_runner=workflow_runner(),
    )


def agent_replayer(*workflows: type, interceptors: bool = True) -> Replayer:
    """Set up as ``build_agent_worker`` sets up its worker: the OpenAI Agents plugin (no
    model is called in replay: model calls are activities) and ForkLab's plugin."""
    agent = AgentSettings(model_base_url="http://127.0.0.1:9/v1", effects_url="http://127.0.0.1:9")
    return Replayer(
        workflows=list(workflows or [ResearchPipelineWorkflow]),
        plugins=[agents_plugin(agent), *([fork_plugin(agent)] if interceptors else [])],
    )


def test_the_index_names_every_kind_of_history() -> None:
    assert set(INDEX) == {"experiment", "sequential_experiment", *AGENT_RUNS}
    for name in INDEX:
        assert len(golden(name).events) > 10, name


@pytest.mark.parametrize("name", ["experiment", "sequential_experiment"])
async def test_the_golden_experiment_runs_replay(name: str) -> None:
    await experiment_replayer().replay_workflow(golden(name))


@pytest.mark.parametrize("name", AGENT_RUNS)
async def test_the_golden_agent_run_and_its_forks_replay(name: str) -> None:
    result = await agent_replayer().replay_workflow(golden(name))
    assert result.replay_failure is None


@pytest.mark.parametrize("name", ["experiment", "sequential_experiment"])
async def test_a_changed_experiment_workflow_is_refused_on_the_golden_runs(name: str) -> None:
    with pytest.raises(workflow.NondeterminismError):
        await experiment_replayer(ExperimentSleepingFirst).replay_workflow(golden(name))


@pytest.mark.parametrize("name", AGENT_RUNS)
async def test_a_changed_research_pipeline_is_refused_on_the_golden_runs(name: str) -> None:
    with pytest.raises(workflow.NondeterminismError):
        await agent_replayer(ResearchSleepingFirst).replay_workflow(golden(name))


@pytest.mark.parametrize("name", ["fork", "fork_of_fork"])
async def test_a_golden_fork_needs_the_interceptor_that_serves_its_prefix(name: str) -> None:
    with pytest.raises(Exception, match=r"(?i)nondetermin"):
        await agent_replayer(interceptors=False).replay_workflow(golden(name))
