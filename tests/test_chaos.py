"""Chaos: a real worker SIGKILLed at five stages and the dev server once; nothing is lost.

One experiment runs on a real dev server (SQLite file) with real ``forklab worker``
processes. The worker is killed during the rehearsal (which runs every prefix and hands
them over: this workload keeps no files), as the run takes the prefixes over, during the
world batches, the analysis (the guard's held-out box) and the ledger stage, and the
server once during the world batches; each time a new one is started. A watcher samples
/proc every 50 ms for this run's sandboxes (bubblewrap boxes under this test's home) to
measure how many ran at once and how long each actually ran. At the end: the twin's
outcomes digest, every world complete and counted once, the seconds actually run within
what was charged and within the budget, never more sandboxes than allowed, and no
process left behind.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from free_ports import free_port
from helpers import forklab_in_process as forklab
from orchestration_lab import FORKLAB, cli_env, make_spec
from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter

from forklab.activities.sandbox.jail import bubblewrap
from forklab.cli.experiment.rehearsal import rehearse
from forklab.workers.config import Settings
from forklab.workers.server import server_argv
from forklab.workflows.experiment.messages import (
    ExperimentResult,
    Stage,
    Status,
    StatusView,
    workflow_id,
)
from forklab.workflows.experiment.workflow import ExperimentWorkflow

pytestmark = pytest.mark.skipif(
    bubblewrap()[0] is None, reason=f"bubblewrap cannot run here: {bubblewrap()[1]}"
)
LIMIT = 2  # max_concurrent_sandboxes
BUDGET = 400.0


def descendants(pid: int) -> set[int]:
    """Every live process below ``pid``."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rpartition(")")[2].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found: set[int] = set()
    todo = [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except OSError:
        return False
    return state != "Z"


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()[:200]
    except OSError:
        return "?"


def processes_mentioning(text: str) -> list[int]:
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if text in cmdline.read_bytes().decode(errors="replace") and alive(
                int(cmdline.parent.name)
            ):
                found.append(int(cmdline.parent.name))
        except OSError:
            continue
    return found


class Watcher(threading.Thread):
    """Samples the boxes of this run: how many at once, and each one's lifetime."""

    def __init__(self, boxes: Path) -> None:
        super().__init__(daemon=True)
        self.marker = f"{boxes}/lsb-"
        self.seen: dict[str, list[float]] = {}  # box → [first seen, last seen]
        self.peak = 0
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            now = time.monotonic()
            live: set[str] = set()
            for pid in processes_mentioning(self.marker):
                try:
                    argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
                except OSError:
                    continue
                live.update(a.decode() for a in argv if a.decode().startswith(self.marker))
            for box in live:
                self.seen.setdefault(box, [now, now])[1] = now
            self.peak = max(self.peak, len(live))
            time.sleep(0.05)

    def seconds(self) -> float:
        """Seconds the boxes were seen running (each at least one sample)."""
        return sum(last - first + 0.05 for first, last in self.seen.values())


class Cluster:
    """The dev server and the workers, as real processes that can be SIGKILLed."""

    def __init__(self, settings: Settings, log: Path) -> None:
        self.settings = settings
        self.log = log
        self.server: subprocess.Popen[bytes] | None = None
        self.worker: subprocess.Popen[bytes] | None = None
        self.killed: list[int] = []  # processes that must be gone after a kill

    def _spawn(self, argv: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
        with open(self.log, "ab") as out:
            return subprocess.Popen(
                argv, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )

    def start_server(self) -> None:
        self.server = self._spawn(server_argv(self.settings, ["--headless"]), dict(os.environ))
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", self.settings.port)) == 0:
                    return
            time.sleep(0.1)
        raise AssertionError("the dev server did not come up")

    def start_worker(self) -> None:
        self.worker = self._spawn([FORKLAB, "worker"], cli_env(self.settings))

    def kill(self, proc: subprocess.Popen[bytes] | None) -> None:
        assert proc is not None
        below = descendants(proc.pid)
        os.kill(proc.pid, signal.SIGKILL)  # the process alone: its children must follow
        proc.wait()
        self.killed += below

    def kill_worker(self) -> None:
        self.kill(self.worker)
        self.start_worker()

    def kill_server(self) -> None:
        self.kill(self.server)
        self.start_server()

    def stop(self) -> None:
        for proc in (self.worker, self.server):
            if proc is not None and proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    home = tmp_path / "home"
    settings = Settings.load(
        {
            "address": f"127.0.0.1:{free_port()}",
            "ui_port": free_port(),
            "home": home,
            "task_queue": "chaos",
        },
        env={},
    )
    home.mkdir(parents=True)
    lab = Cluster(settings, tmp_path / "processes.log")
    lab.start_server()
    lab.start_worker()
    yield lab
    lab.stop()


async def _connect(address: str) -> Client:
    """A client, once the (re)started server's frontend answers."""
    deadline = time.monotonic() + 60
    while True:
        try:
            return await Client.connect(address, data_converter=pydantic_data_converter)
        except RuntimeError:
            assert time.monotonic() < deadline, "the dev server did not become healthy"
            await asyncio.sleep(0.5)


async def _status(client: Client, wid: str) -> StatusView:
    handle = client.get_workflow_handle(wid)
    return await handle.query(ExperimentWorkflow.status, result_type=StatusView)


async def _wait(client: Client, wid: str, ready: object, seconds: float = 120) -> StatusView:
    deadline = time.monotonic() + seconds
    view = None
    while True:
        try:
            view = await _status(client, wid)
            if ready(view):  # type: ignore[operator]
                return view
        except Exception:  # the server restarting, or no worker yet to answer
            pass
        assert time.monotonic() < deadline, f"the run did not reach the expected point: {view}"
        await asyncio.sleep(0.05)


async def test_sigkill_at_five_stages_and_a_server_kill_lose_nothing(cluster: Cluster) -> None:
    settings = cluster.settings
    sleeps = {"sandbox_sleep": 0.05, "twin_sleep": 0.4, "prefix_sleep": 2.0}
    spec = make_spec(
        params=sleeps,
        episodes=36,
        budget={"max_world_seconds": BUDGET, "max_concurrent_sandboxes": LIMIT},
        analysis={"guard": {"holdout_episodes": 4}},
    )
    wid = workflow_id(spec.id)
    watcher = Watcher(settings.sandboxes_dir / "boxes")
    watcher.start()
    client = await _connect(settings.address)
    spec_file = settings.home / "spec.json"
    spec_file.write_text(spec.model_dump_json())
    env = cli_env(settings)
    started = await asyncio.to_thread(
        forklab, env, "start", str(spec_file), "--batch-episodes", "12", "--rehearsal-episodes", "4"
    )
    assert started.returncode == 0, started.stderr
    kills: list[str] = []

    def stage_is(stage: Stage) -> object:
        return lambda v: v.stage is stage

    # 1. rehearsal: its box sleeps 2 s in its first prefix and 0.4 s per outcome (4
    # episodes × 3 worlds)
    await _wait(client, wid, stage_is(Stage.rehearsing))
    await asyncio.sleep(1.5)
    cluster.kill_worker()
    kills.append("rehearsal")
    view = await _wait(client, wid, stage_is(Stage.awaiting_approval), 180)
    assert view.plan is not None and view.plan.rehearsal.prefixes is not None
    approved = await asyncio.to_thread(forklab, env, "approve", spec.id, "--approver", "chaos")
    assert approved.returncode == 0, approved.stderr
    # 2. prefixes: the run takes the rehearsal's over, chunk by chunk, once approved (a
    # few milliseconds, no sandbox): killed at that moment, or in the first world batches
    await _wait(client, wid, lambda v: v.stage in (Stage.running_prefixes, Stage.running_worlds))
    cluster.kill_worker()
    kills.append("prefixes taken over")
    # 3. world batches, then the server, then the worker again
    await _wait(client, wid, lambda v: v.stage is Stage.running_worlds and v.progress.running)
    await asyncio.sleep(0.5)
    cluster.kill_worker()
    kills.append("world batches")
    await _wait(client, wid, lambda v: v.progress.batches_completed >= 2, 180)
    cluster.kill_server()
    kills.append("dev server")
    client = await _connect(settings.address)
    await _wait(client, wid, lambda v: v.progress.batches_completed >= 5, 180)
    cluster.kill_worker()
    kills.append("world batches (after the server came back)")
    # 4. analysis: the guard's held-out box sleeps 0.4 s per outcome (4 × 2 worlds)
    await _wait(client, wid, stage_is(Stage.analysing), 240)
    await asyncio.sleep(1.5)
    cluster.kill_worker()
    kills.append("analysis")
    # 5. the ledger stage
    await _wait(client, wid, lambda v: v.stage in (Stage.recording, Stage.done), 240)
    cluster.kill_worker()
    kills.append("ledger")

    handle = client.get_workflow_handle(wid, result_type=ExperimentResult)
    result = await asyncio.wait_for(handle.result(), timeout=240)
    watcher.stop.set()
    watcher.join()

    assert result.status is Status.completed, (kills, result.error)
    assert result.analysis is not None
    twin = rehearse(make_spec(id=spec.id, episodes=36, analysis={"guard": {"holdout_episodes": 4}}))
    assert result.analysis.outcomes_digest == twin.outcomes_digest
    assert [(w.name, w.status, w.episodes) for w in result.analysis.worlds] == [
        (name, "completed", 36) for name in ("baseline", "boost", "placebo")
    ]  # no world lost, none counted twice
    budget = result.budget
    ran = watcher.seconds()
    print(
        f"\nchaos: kills={kills} ran={ran:.1f}s charged={budget.spent_world_seconds:.1f}s "
        f"budget={budget.max_world_seconds:g}s peak={watcher.peak}/{LIMIT} "
        f"boxes={len(watcher.seen)}"
    )
    assert ran <= budget.spent_world_seconds + 1.0, "sandboxes ran longer than was charged"
    assert budget.spent_world_seconds <= budget.max_world_seconds
    assert watcher.peak <= LIMIT and budget.peak_concurrent_sandboxes <= LIMIT
    # no orphan: every process below a killed worker or server is gone, nothing of this
    # run's boxes or calls is running, and the run's cleanup left no sandbox
    deadline = time.monotonic() + 10
    while any(alive(pid) for pid in cluster.killed) and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
    orphans = {pid: cmdline(pid) for pid in cluster.killed if alive(pid)}
    assert not orphans, f"orphans outlived their worker: {orphans}"
    assert processes_mentioning(str(settings.sandboxes_dir)) == []
    assert result.cleanup is not None and result.cleanup.left == 0
