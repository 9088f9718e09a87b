"""Starting the example team: the reviewer first, then the writer, then the researcher, so
that every message finds its receiver running."""

from __future__ import annotations

from typing import Any

from temporalio.client import Client, WorkflowHandle

from forklab.agents.team import (
    ResearcherInput,
    ResearcherWorkflow,
    ReviewerInput,
    ReviewerWorkflow,
    TeamIds,
    WriterInput,
    WriterWorkflow,
    team_ids,
)


class TeamHandles:
    def __init__(
        self,
        ids: TeamIds,
        researcher: WorkflowHandle[Any, Any],
        writer: WorkflowHandle[Any, Any],
        reviewer: WorkflowHandle[Any, Any],
    ) -> None:
        self.ids = ids
        self.researcher = researcher
        self.writer = writer
        self.reviewer = reviewer

    async def results(self) -> dict[str, Any]:
        """Each member's result, by role (waits for all three)."""
        return {
            "researcher": await self.researcher.result(),
            "writer": await self.writer.result(),
            "reviewer": await self.reviewer.result(),
        }


async def start_team(
    client: Client,
    team_id: str,
    topic: str,
    task_queue: str,
    *,
    researcher_model: str = "fast",
    writer_model: str = "slow",
    reviewer_model: str = "slow",
) -> TeamHandles:
    ids = team_ids(team_id)
    reviewer = await client.start_workflow(
        ReviewerWorkflow.run,
        ReviewerInput(topic=topic, model=reviewer_model),
        id=ids.reviewer,
        task_queue=task_queue,
    )
    writer = await client.start_workflow(
        WriterWorkflow.run,
        WriterInput(topic=topic, reviewer=ids.reviewer, model=writer_model),
        id=ids.writer,
        task_queue=task_queue,
    )
    researcher = await client.start_workflow(
        ResearcherWorkflow.run,
        ResearcherInput(topic=topic, writer=ids.writer, model=researcher_model),
        id=ids.researcher,
        task_queue=task_queue,
    )
    return TeamHandles(ids, researcher, writer, reviewer)
