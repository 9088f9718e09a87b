"""The agent-run worker: the example agents and their model and tool activities, made
fork-capable by ``ForkLabPlugin`` (as any team's worker is), on a client with the OpenAI
Agents plugin."""

from __future__ import annotations

import asyncio
import signal
from datetime import timedelta

from agents.models.openai_provider import OpenAIProvider
from openai import AsyncOpenAI
from temporalio.client import Client
from temporalio.common import WorkerDeploymentVersion
from temporalio.openai_agents import ModelActivityParameters
from temporalio.worker import Worker

from forklab.activities.runfork.workspace import WorkspaceTools, agent_workspaces_root
from forklab.agents.research import ResearchPipelineWorkflow
from forklab.agents.support import SupportAgentWorkflow
from forklab.agents.tools import EffectTools, LedgerMode, ModelActivities
from forklab.workers.config import Settings
from forklab.workers.runfork.agent_config import AgentSettings
from forklab.workers.runfork.agent_converter import StrictAgentsPlugin
from forklab.workers.runfork.plugin import ForkLabPlugin
from forklab.workers.stores import effect_ledger
from forklab.workers.versioning import AGENTS, announce, deployment_config, worker_version

AGENT_WORKFLOWS: list[type] = [ResearchPipelineWorkflow, SupportAgentWorkflow]
MODEL_CALL_TIMEOUT = timedelta(seconds=60)


def openai_client(agent: AgentSettings) -> AsyncOpenAI:
    """The model client; its own retries are off, activity retries decide."""
    return AsyncOpenAI(
        base_url=agent.resolved_model_url, api_key=agent.model_api_key, max_retries=0
    )


def agents_plugin(agent: AgentSettings) -> StrictAgentsPlugin:
    """The OpenAI Agents plugin, its workflows reading payloads strictly
    (``forklab.workers.runfork.agent_converter``)."""
    provider = OpenAIProvider(openai_client=openai_client(agent), use_responses=False)
    return StrictAgentsPlugin(
        model_params=ModelActivityParameters(start_to_close_timeout=MODEL_CALL_TIMEOUT),
        model_provider=provider,
    )


async def connect_agents(settings: Settings, agent: AgentSettings) -> Client:
    """A client whose data converter and plugins suit the agent workflows."""
    return await Client.connect(
        settings.address, namespace=settings.namespace, plugins=[agents_plugin(agent)]
    )


def fork_plugin(agent: AgentSettings) -> ForkLabPlugin:
    """The plugin with this home's run log, refusing non-finite numbers in every decoded
    value: in a workflow the strict converter (``agents_plugin``) refuses them first; an
    activity's input is checked here only."""
    return ForkLabPlugin(agent.run_log_path, strict_payloads=True)


def build_agent_worker(
    client: Client,
    agent: AgentSettings,
    mode: LedgerMode = LedgerMode.ledger_query,
    workflows: list[type] | None = None,
    overlay: bool = True,
    version: WorkerDeploymentVersion | None = None,
) -> Worker:
    """``overlay=False``: agent workspaces are copies, never overlay mounts. ``version``:
    the worker deployment version it joins (``forklab.workers.versioning``)."""
    tools = EffectTools(agent.resolved_effects_url, effect_ledger(agent), mode)
    files = WorkspaceTools(agent_workspaces_root(agent.home), overlay=overlay)
    models = ModelActivities(openai_client(agent))
    return Worker(
        client,
        task_queue=agent.agent_task_queue,
        deployment_config=deployment_config(version),
        workflows=workflows or AGENT_WORKFLOWS,
        activities=[
            models.chat_model,
            tools.charge_customer,
            tools.send_email,
            files.write,
        ],
        plugins=[fork_plugin(agent)],
    )


async def run_agent_worker(settings: Settings, agent: AgentSettings) -> None:
    """Run until SIGINT or SIGTERM, then finish gracefully."""
    client = await connect_agents(settings, agent)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    version = worker_version(settings, AGENTS)
    async with build_agent_worker(client, agent, version=version):
        if version is not None:
            await announce(client, version, settings.promote)
        await stop.wait()
