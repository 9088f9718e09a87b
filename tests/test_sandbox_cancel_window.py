"""An attempt cancelled while its sandbox is being created still owns that sandbox.

The create runs in a thread that a cancellation cannot stop. If the attempt ended at once,
the thread would finish afterwards with nobody holding the id, and the workflow's cleanup,
listing the run's sandboxes as soon as the attempt ended, could look before the box
existed: it would leak. The local backend is the real one; only its create is held by a
gate, as a slow remote create would be, and the cancel is a real activity cancellation.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from temporalio.testing import ActivityEnvironment

import forklab.activities.heartbeat
from forklab.activities.experiment.runner_bundle import bundle_files
from forklab.activities.experiment.world_batches import RUN_LABEL, SandboxActivities
from forklab.activities.sandbox import ExecResult, Limits, LocalSandboxBackend, SandboxError
from forklab.activities.sandbox.shared_snapshots import SharedSnapshots
from forklab.activities.stores.artifacts import LocalArtifactStore
from forklab.contracts.experiment import EpisodeChunk, PrefixInput, PrefixResult, RunnerJob

RUN_KEY = "wf/run"
#: Only guards against a hang; nothing here is timed.
HANG = 30.0


class GatedCreate(LocalSandboxBackend):
    """The real local backend whose ``create`` waits for the test to release it (and then
    fails when told to); it counts the runs it is asked for."""

    def __init__(self, root: Path, fail: bool = False) -> None:
        super().__init__(root)
        self.entered = threading.Event()
        self.release = threading.Event()
        self.created = threading.Event()
        self.fail = fail
        self.execs = 0

    def create(self, snapshot_id: str, labels: dict[str, str], limits: Limits) -> str:
        self.entered.set()
        self.release.wait(HANG)
        try:
            if self.fail:
                raise SandboxError("create failed")
            return super().create(snapshot_id, labels, limits)
        finally:
            self.created.set()

    def exec(self, sandbox_id: str, argv: list[str], timeout: float) -> ExecResult:
        self.execs += 1
        return super().exec(sandbox_id, argv, timeout)


def _prefix_attempt(
    backend: GatedCreate, root: Path, env: ActivityEnvironment
) -> asyncio.Future[PrefixResult]:
    store = LocalArtifactStore(root / "artifacts")
    snapshots = SharedSnapshots(backend, store)
    info = snapshots.prepare(bundle_files("counter-recovery"))
    acts = SandboxActivities(backend, store, snapshots)
    inp = PrefixInput(
        experiment_id="exp",
        run_key=RUN_KEY,
        job=RunnerJob(workload="counter-recovery", params={}, seed=1),
        snapshot_id=info.id,
        chunk=EpisodeChunk(index=0, first=0, stop=2),
        reservation_seconds=60,
    )
    return asyncio.ensure_future(env.run(acts.run_prefixes, inp))


async def _until(condition: Callable[[], bool]) -> None:
    for _ in range(int(HANG / 0.01)):
        if condition():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("timed out")


async def _cancelled(task: Awaitable[Any]) -> None:
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(task, HANG)


async def test_cancel_while_creating_deletes_the_sandbox_it_made(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Cancelled (twice, as a heartbeat cancel and then a worker shutdown would) while the
    create is held: the attempt keeps heartbeating until the create returns, deletes that
    sandbox, and only then ends cancelled, so nothing of the run is left when it ends."""
    monkeypatch.setattr(forklab.activities.heartbeat, "HEARTBEAT_SECONDS", 0.02)
    backend = GatedCreate(tmp_path / "sandboxes")
    env = ActivityEnvironment()
    beats: list[Any] = []
    env.on_heartbeat = lambda *details: beats.append(details)
    task = _prefix_attempt(backend, tmp_path, env)
    await asyncio.to_thread(backend.entered.wait, HANG)

    env.cancel()
    seen = len(beats)
    await _until(lambda: task.done() or len(beats) > seen + 1)
    still_waiting = not task.done()
    task.cancel()  # a second cancel changes nothing
    seen = len(beats)
    await _until(lambda: task.done() or len(beats) > seen + 1)
    backend.release.set()
    await _cancelled(task)
    left_at_end = backend.list({RUN_LABEL: RUN_KEY})
    await asyncio.to_thread(backend.created.wait, HANG)

    assert backend.list({RUN_LABEL: RUN_KEY}) == [], "the sandbox made after the cancel leaked"
    assert left_at_end == [], "the attempt ended before deleting what its create made"
    assert still_waiting, "the attempt ended while its create was still running"
    assert backend.execs == 0


async def test_a_create_that_fails_after_the_cancel_leaves_nothing(tmp_path: Path) -> None:
    """The create fails after the attempt was cancelled: the attempt still ends cancelled
    (not as a sandbox failure), and there is nothing to delete."""
    backend = GatedCreate(tmp_path / "sandboxes", fail=True)
    env = ActivityEnvironment()
    task = _prefix_attempt(backend, tmp_path, env)
    await asyncio.to_thread(backend.entered.wait, HANG)
    env.cancel()
    backend.release.set()
    await _cancelled(task)
    await asyncio.to_thread(backend.created.wait, HANG)
    assert backend.list({RUN_LABEL: RUN_KEY}) == []
    assert backend.execs == 0


async def test_the_cancel_ends_the_attempt_as_soon_as_the_create_returns(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Heartbeats far apart: the attempt does not wait for the next beat once the create
    has returned, it deletes the sandbox and ends cancelled (else this hangs), and it
    never starts the runner."""
    monkeypatch.setattr(forklab.activities.heartbeat, "HEARTBEAT_SECONDS", 10 * HANG)
    backend = GatedCreate(tmp_path / "sandboxes")
    env = ActivityEnvironment()
    task = _prefix_attempt(backend, tmp_path, env)
    await asyncio.to_thread(backend.entered.wait, HANG)
    env.cancel()
    await asyncio.sleep(0)
    backend.release.set()
    await _cancelled(task)
    await asyncio.to_thread(backend.created.wait, HANG)
    assert backend.list({RUN_LABEL: RUN_KEY}) == []
    assert backend.execs == 0
