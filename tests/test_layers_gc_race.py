"""``gc`` against a fork, attach, pin or seal made at the same moment on one host.

The interleaving is made deterministic with a real filesystem object, not a hook: a
half-made workspace whose ``state.json`` is a FIFO. ``gc`` reads every workspace's record
during its mark, so it stops there — after it has listed the pins and workspaces, before
it sweeps — until the test writes to the FIFO. Meanwhile another thread starts
referencing an old layer nothing needed when gc began. Without the store's lock that
thread finishes at once and the sweep then deletes the layer it now uses; with the lock
it waits for the sweep and finds the layer gone (a clear error, nothing half-made). The
test resumes gc once the kernel lists that thread as waiting for the lock (``/proc/locks``)
or it has finished: no fixed sleep.
"""

from __future__ import annotations

import asyncio
import errno
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from temporalio.testing import ActivityEnvironment

from forklab.activities.runfork.workspace import (
    WorkspaceStep,
    WorkspaceTools,
    WorkspaceWrite,
    collect_agent_layers,
    run_pins,
)
from forklab.activities.sandbox.workspace import (
    GcResult,
    WorkspaceError,
    Workspaces,
)
from tests.helpers import ROOT


def _folder(path: Path, text: str) -> Path:
    (path / "pkg").mkdir(parents=True)
    (path / "pkg" / "mod.py").write_text(text)
    (path / "blob.bin").write_bytes(bytes(range(256)) * 256)
    return path


def _age(workspaces: Workspaces, digest: str, seconds: float = 3600) -> None:
    """Make the layer look sealed ``seconds`` ago (gc's age is its folder's time)."""
    then = time.time() - seconds
    os.utime(workspaces.layers.root / digest, (then, then))


class PausedGc:
    """``collect`` run in a thread, stopped inside its mark until ``resume``."""

    def __init__(self, workspaces_root: Path, collect: Callable[[], GcResult]) -> None:
        self.fifo = workspaces_root / "workspaces" / "zz-paused" / "state.json"
        self.fifo.parent.mkdir(parents=True)
        os.mkfifo(self.fifo)
        self.result: GcResult | None = None
        self.thread = threading.Thread(target=self._run, args=(collect,), daemon=True)
        self.writer: int | None = None

    def _run(self, collect: Callable[[], GcResult]) -> None:
        self.result = collect()

    def __enter__(self) -> PausedGc:
        self.thread.start()
        deadline = time.monotonic() + 30
        while self.writer is None:  # a writer can open the FIFO once gc opened it to read
            try:
                self.writer = os.open(self.fifo, os.O_WRONLY | os.O_NONBLOCK)
            except OSError as exc:
                assert exc.errno == errno.ENXIO and time.monotonic() < deadline, exc
                time.sleep(0.01)
        return self

    def resume(self) -> GcResult:
        if self.writer is not None:
            os.write(self.writer, b"{")  # not a record: gc skips this half-made workspace
            os.close(self.writer)
            self.writer = None
        self.thread.join(timeout=60)
        assert self.result is not None, "gc did not finish"
        return self.result

    def __exit__(self, *exc: object) -> None:
        if self.writer is not None:
            self.resume()
        self.fifo.unlink()
        self.fifo.parent.rmdir()


def _blocked_on(lock: Path) -> bool:
    """Whether someone waits for ``lock``'s ``flock``: the kernel lists each waiter in
    ``/proc/locks`` with ``->`` before it (``N: -> FLOCK ADVISORY WRITE pid MAJ:MIN:INODE``)."""
    inode = f":{lock.stat().st_ino}"
    for line in Path("/proc/locks").read_text().splitlines():
        fields = line.split()
        if len(fields) > 6 and fields[1] == "->" and fields[6].endswith(inode):
            return True
    return False


def _wait_blocked_or_done(thread: threading.Thread, lock: Path) -> None:
    """Until ``thread`` ended, or waits for ``lock`` (it can do nothing more before gc
    goes on): no fixed sleep, and "it waited for the lock" is seen, not assumed."""
    deadline = time.monotonic() + 60
    while thread.is_alive() and not (lock.exists() and _blocked_on(lock)):
        assert time.monotonic() < deadline, "the action neither finished nor waited for the lock"
        time.sleep(0.005)


def _race(
    workspaces: Workspaces, action: Callable[[], object]
) -> tuple[GcResult, object | BaseException]:
    """Run ``action`` in a thread while gc is paused in its mark; resume gc once the action
    ended or waits for the store's lock; return both outcomes."""
    outcome: list[object | BaseException] = []

    def run() -> None:
        try:
            outcome.append(action())
        except BaseException as exc:
            outcome.append(exc)

    with PausedGc(workspaces.layers.root.parent, lambda: workspaces.gc(0)) as gc:
        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        _wait_blocked_or_done(thread, workspaces.layers.lock.path)
        result = gc.resume()
        thread.join(timeout=60)
    assert outcome, "the action never finished"
    return result, outcome[0]


def _referenced(workspaces: Workspaces) -> set[str]:
    """Every layer a workspace record or a pin names now."""
    found: set[str] = set()
    for ws_id in workspaces.ids():
        found |= set(workspaces.info(ws_id).stack)
    pins = workspaces.layers.root.parent / "pins"
    if pins.is_dir():
        found |= {p.name for owner in pins.iterdir() for p in owner.iterdir()}
    return found


def _gone_cleanly(outcome: object | BaseException) -> bool:
    return isinstance(outcome, WorkspaceError) and "does not exist" in str(outcome)


@pytest.mark.parametrize("action", ["attach", "pin", "seal-again-then-attach"])
def test_gc_never_removes_a_layer_a_concurrent_operation_starts_using(
    workspaces: Workspaces, root: Path, tmp_path: Path, action: str
) -> None:
    old = workspaces.layers.import_tree(_folder(tmp_path / "old", "x = 1\n")).digest
    _age(workspaces, old)  # sealed an hour ago, nothing refers to it: gc may take it

    def act() -> object:
        if action == "attach":  # a fork's child, a world over its chunk's layer
            return workspaces.attach("child", root / "child", old)
        if action == "pin":
            return workspaces.pin("wf/run", old)
        # the same bytes sealed again (a rebuilt chunk, a retried call): the old layer is
        # reused, then mounted
        again = workspaces.layers.import_tree(_folder(tmp_path / "again", "x = 1\n")).digest
        return workspaces.attach("child", root / "child", again)

    try:
        result, outcome = _race(workspaces, act)
        # whichever way it went, everything named by a workspace or a pin is there, intact
        for digest in _referenced(workspaces):
            workspaces.layers.verify(digest, full=True)
        if action == "seal-again-then-attach":
            assert not isinstance(outcome, BaseException), outcome  # sealed anew after gc
            assert _tree(root / "child") == {"blob.bin", "pkg", "pkg/mod.py"}
        else:
            # gc marked first: the layer goes, and the late operation says so, leaving nothing
            assert old in result.removed and _gone_cleanly(outcome), outcome
            assert workspaces.ids() == [] and _referenced(workspaces) == set()
    finally:
        workspaces.remove("child")


def _tree(folder: Path) -> set[str]:
    return {p.relative_to(folder).as_posix() for p in folder.rglob("*")}


def test_an_agent_call_and_the_agent_gc_do_not_interleave(tmp_path: Path) -> None:
    """A run's next write starts from an old layer (a fork's first live step over the
    layer its receipt names) while ``collect_agent_layers`` runs without that receipt."""
    home = tmp_path / "agent-workspaces"
    tools = WorkspaceTools(home, overlay=False)
    first = _call(tools, WorkspaceWrite(path="report/a.md", content="step 1\n"))
    _age(tools.workspaces, first.workspace_layer)
    for below in tools.workspaces.layers.stack(first.workspace_layer)[1:]:
        _age(tools.workspaces, below)

    def write() -> object:
        req = WorkspaceWrite(layer=first.workspace_layer, path="report/b.md", content="2\n")
        return _call(tools, req)

    outcome: list[object] = []
    runner = threading.Thread(target=lambda: outcome.append(_catch(write)), daemon=True)
    with PausedGc(home, lambda: collect_agent_layers(home, set(), set(), 0)) as gc:
        runner.start()
        _wait_blocked_or_done(runner, tools.workspaces.layers.lock.path)
        gc.resume()
        runner.join(timeout=60)
    assert outcome
    assert run_pins(home) == []  # no run is open: gc dropped every pin, none half-made
    assert "does not exist" in str(outcome[0]), outcome[0]  # the gc went first


def _call(tools: WorkspaceTools, req: WorkspaceWrite) -> WorkspaceStep:
    """The activity, as a worker runs it (its own event loop: this runs in a thread)."""
    return asyncio.run(ActivityEnvironment().run(tools.write, req))


def _catch(fn: Callable[[], object]) -> object:
    try:
        return fn()
    except Exception as exc:
        return exc


def test_a_killed_holder_does_not_block_gc(workspaces: Workspaces, root: Path) -> None:
    """A process that dies holding the lock (shared, mid-fork) leaves it to the kernel."""
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from pathlib import Path;"
            "from forklab.activities.sandbox.workspace import layer_lock\n"
            "with layer_lock(Path(sys.argv[1])).hold():\n"
            "    print('held', flush=True); time.sleep(600)",
            str(workspaces.layers.root.parent),
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        done = threading.Event()
        gc = threading.Thread(target=lambda: (workspaces.gc(0), done.set()), daemon=True)
        gc.start()
        assert not done.wait(timeout=1)  # gc waits for the holder ...
        holder.send_signal(signal.SIGKILL)
        assert done.wait(timeout=60)  # ... and runs once it is dead
    finally:
        holder.kill()
        holder.wait()
