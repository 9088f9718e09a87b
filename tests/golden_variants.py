"""Changed versions of the workflows of the golden histories (``test_golden_replay.py``):
each starts with a timer its recorded history does not have, so replaying a golden
history on it must fail. A module of their own: the workflow sandbox re-imports the
module that defines a workflow, and this one touches nothing outside it."""

from __future__ import annotations

from typing import Any

from temporalio import workflow

from forklab.agents.research import ResearchInput, ResearchPipelineWorkflow
from forklab.workflows.experiment.messages import ExperimentInput, ExperimentResult
from forklab.workflows.experiment.workflow import ExperimentWorkflow


@workflow.defn(name="ForkLabExperiment")
class ExperimentSleepingFirst(ExperimentWorkflow):
    """The experiment workflow with a timer before its first step."""

    @workflow.run
    async def run(self, inp: ExperimentInput) -> ExperimentResult:
        await workflow.sleep(1)
        return await super().run(inp)


@workflow.defn(name="ResearchPipeline")
class ResearchSleepingFirst(ResearchPipelineWorkflow):
    """The research pipeline with a timer before its first step."""

    @workflow.run
    async def run(self, inp: ResearchInput) -> dict[str, Any]:
        await workflow.sleep(1)
        return await super().run(inp)
