"""The worker of the LangGraph support agent: the workflow, its graph's nodes as
activities through ``temporalio-langgraph``'s plugin, ``ForkLabPlugin``, and
:class:`LangGraphInputs` (the plugin puts the fork interceptor before it, so that forks
see steady inputs).

It polls a queue of its own (:func:`langgraph_task_queue`)."""

from __future__ import annotations

import asyncio
import signal

from temporalio.client import Client
from temporalio.langgraph import LangGraphPlugin
from temporalio.worker import Worker

from forklab.agents.support_graph import GRAPH, SupportGraphWorkflow
from forklab.agents.support_graph_nodes import SupportGraphNodes, support_graph
from forklab.agents.tools import EffectTools, LedgerMode
from forklab.workers.config import Settings
from forklab.workers.runfork.agent_config import AgentSettings
from forklab.workers.runfork.agent_worker import (
    connect_agents,
    fork_plugin,
    openai_client,
)
from forklab.workers.stores import effect_ledger
from forklab.workflows.runfork.langgraph_inputs import LangGraphInputs


def langgraph_task_queue(agent: AgentSettings) -> str:
    return f"{agent.agent_task_queue}-langgraph"


def langgraph_plugin(agent: AgentSettings, mode: LedgerMode) -> LangGraphPlugin:
    tools = EffectTools(agent.resolved_effects_url, effect_ledger(agent), mode)
    nodes = SupportGraphNodes(openai_client(agent), tools)
    return LangGraphPlugin(graphs={GRAPH: support_graph(nodes)})


def build_langgraph_worker(
    client: Client, agent: AgentSettings, mode: LedgerMode = LedgerMode.ledger_query
) -> Worker:
    return Worker(
        client,
        task_queue=langgraph_task_queue(agent),
        workflows=[SupportGraphWorkflow],
        interceptors=[LangGraphInputs()],
        plugins=[langgraph_plugin(agent, mode), fork_plugin(agent)],
    )


async def run_langgraph_worker(settings: Settings, agent: AgentSettings) -> None:
    """Run until SIGINT or SIGTERM, then finish gracefully."""
    client = await connect_agents(settings, agent)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    async with build_langgraph_worker(client, agent):
        await stop.wait()
