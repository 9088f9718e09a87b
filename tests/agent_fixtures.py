"""What the agent-run fixtures (``conftest.py``) start: the local model server and the
payments/mail service on free ports (real HTTP), a client with the OpenAI Agents plugin,
and one agent worker per test on its own task queue, on the session's dev server."""

from __future__ import annotations

import contextlib
import json
import threading
import urllib.request
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from temporalio.client import Client, WorkflowHandle
from temporalio.testing import WorkflowEnvironment

from forklab.agents.research import ResearchInput, ResearchPipelineWorkflow
from forklab.agents.tools import LedgerMode
from forklab.cli.runfork.agent_lab import AgentLab
from forklab.workers.config import Settings
from forklab.workers.runfork.agent_config import AgentSettings
from forklab.workers.runfork.agent_worker import (
    build_agent_worker,
    connect_agents,
)
from forklab.workers.runfork.effects_service import EffectsService
from forklab.workers.runfork.model_server import ModelServer


@dataclass
class Services:
    model_url: str
    effects_url: str
    effects: EffectsService

    def effects_log(self) -> list[dict[str, Any]]:
        """The applied effects, read over HTTP like any client would."""
        with urllib.request.urlopen(self.effects_url + "/effects/log", timeout=10) as r:
            log: list[dict[str, Any]] = json.loads(r.read())["effects"]
            return log


def _serve(server: Any) -> None:
    threading.Thread(target=server.serve_forever, daemon=True).start()


@contextlib.contextmanager
def running_services() -> Iterator[Services]:
    """The ``services`` fixture (``conftest.py``): both servers on free ports."""
    model = ModelServer(("127.0.0.1", 0), seed=7)
    effects = EffectsService(("127.0.0.1", 0))
    _serve(model)
    _serve(effects)
    yield Services(
        model_url=f"http://127.0.0.1:{model.server_port}/v1",
        effects_url=f"http://127.0.0.1:{effects.server_port}",
        effects=effects,
    )
    model.shutdown()
    effects.shutdown()


@dataclass
class AgentTestLab:
    lab: AgentLab
    client: Client
    agent: AgentSettings
    services: Services

    async def start_research(self, **fields: Any) -> WorkflowHandle[Any, Any]:
        run_id = fields.pop("run_id", f"research-{uuid.uuid4().hex[:8]}")
        inp = ResearchInput(topic=fields.pop("topic", "durable execution"), **fields)
        return await self.client.start_workflow(
            ResearchPipelineWorkflow.run,
            inp,
            id=run_id,
            task_queue=self.agent.agent_task_queue,
        )

    def charges(self) -> int:
        return sum(1 for e in self.services.effects_log() if e["kind"] == "charge")


def agent_settings(services: Services, home: Path) -> AgentSettings:
    return AgentSettings(
        model_base_url=services.model_url,
        effects_url=services.effects_url,
        agent_task_queue=f"agents-test-{uuid.uuid4().hex[:8]}",
        home=home,
    )


@contextlib.asynccontextmanager
async def running_agent_lab(
    temporal_env: WorkflowEnvironment, services: Services, tmp_path: Path
) -> AsyncIterator[AgentTestLab]:
    """The ``agent_lab`` fixture (``conftest.py``): an agent worker on its own queue."""
    agent = agent_settings(services, tmp_path / "home")
    target = temporal_env.client.service_client.config.target_host
    settings = Settings.load({"address": target, "home": tmp_path / "home"}, env={})
    client = await connect_agents(settings, agent)
    async with build_agent_worker(client, agent, LedgerMode.ledger_query):
        yield AgentTestLab(
            lab=AgentLab(client, agent), client=client, agent=agent, services=services
        )
