"""What the agent-run benchmarks share: an embedded dev server, the local model server
and payments/mail service on free ports, and an agent worker in this process."""

from __future__ import annotations

import sys
import tempfile
import threading
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import WorkflowEnvironment

from forklab.cli.runfork.agent_lab import AgentLab
from forklab.workers.runfork.agent_config import AgentSettings
from forklab.workers.runfork.effects_service import EffectsService
from forklab.workers.runfork.model_server import ModelServer
from forklab.workers.server import temporal_binary
from forklab.workflows.runfork.search_attributes import RUN_FORK_KEYS


@dataclass
class Bench:
    env: WorkflowEnvironment
    client: Client
    agent: AgentSettings
    lab: AgentLab
    effects: EffectsService
    home: Path


def _serve(server: Any) -> None:
    threading.Thread(target=server.serve_forever, daemon=True).start()


@asynccontextmanager
async def bench_env(model_seed: int = 0) -> AsyncIterator[Bench]:
    with tempfile.TemporaryDirectory(prefix="forklab-bench-") as tmp:
        env = await WorkflowEnvironment.start_local(
            dev_server_existing_path=str(temporal_binary()),
            data_converter=pydantic_data_converter,
            search_attributes=RUN_FORK_KEYS,
            ui=False,
        )
        model = ModelServer(("127.0.0.1", 0), seed=model_seed)
        effects = EffectsService(("127.0.0.1", 0))
        _serve(model)
        _serve(effects)
        home = Path(tmp)
        agent = AgentSettings(
            model_base_url=f"http://127.0.0.1:{model.server_port}/v1",
            effects_url=f"http://127.0.0.1:{effects.server_port}",
            agent_task_queue=f"bench-{uuid.uuid4().hex[:8]}",
            home=home,
        )
        try:
            yield Bench(env, env.client, agent, AgentLab(env.client, agent), effects, home)
        finally:
            model.shutdown()
            effects.shutdown()
            await env.shutdown()
