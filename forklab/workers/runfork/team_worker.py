"""The example team's worker: its three workflows, the model call and the team's messaging
activity, made fork-capable by ``ForkLabPlugin`` (as ``agent_worker`` is).

It polls a queue of its own, :func:`team_task_queue`: a worker that lacks a workflow type
must not share a queue with one that has it (its tasks for that type would fail there)."""

from __future__ import annotations

import asyncio
import signal

from temporalio.client import Client
from temporalio.worker import Worker

from forklab.agents.team import TEAM_WORKFLOWS
from forklab.agents.team_tools import TeamMessenger
from forklab.agents.tools import ModelActivities
from forklab.workers.config import Settings
from forklab.workers.runfork.agent_config import AgentSettings
from forklab.workers.runfork.agent_worker import (
    connect_agents,
    fork_plugin,
    openai_client,
)


def team_task_queue(agent: AgentSettings) -> str:
    return f"{agent.agent_task_queue}-team"


def build_team_worker(client: Client, agent: AgentSettings) -> Worker:
    models = ModelActivities(openai_client(agent))
    messenger = TeamMessenger(client)
    return Worker(
        client,
        task_queue=team_task_queue(agent),
        workflows=TEAM_WORKFLOWS,
        activities=[
            models.chat_model,
            messenger.send_update,
        ],
        plugins=[fork_plugin(agent)],
    )


async def run_team_worker(settings: Settings, agent: AgentSettings) -> None:
    """Run until SIGINT or SIGTERM, then finish gracefully."""
    client = await connect_agents(settings, agent)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    async with build_team_worker(client, agent):
        await stop.wait()
