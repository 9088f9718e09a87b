"""A world group: several worlds over one chunk's checkpoints in one sandbox, each world
in a process of its own.

Why one box for several worlds: the local twin works out what every world of an episode
shares — the checkpoint read back, the block runs of shocks every world will draw
(``Workload.world_blocks``) — once, and a box per world would have to do all of it again
(or read it from a file and rebuild it), start an interpreter and import the workload,
eight times a chunk. Here the box's first process does the shared work once, then forks
one process per world, one after another. A fork copies nothing up front and shares
nothing afterwards: each world runs in its own address space (whatever it changes, in
its state, the draw table or the workload's globals, is its own copy), in its own
session and a fresh working folder of its own, under its own share of the CPU and wall
clock; and once it ends, every process it left is killed before the next world starts.
So no world can see what another did, and the outcomes are the twin's, bit for bit.

What this does *not* do is protect the worlds of one run from their own workload: the
code in every world is the same untrusted workload, which decides every outcome it
reports anyway. The sandbox is the boundary between that code and the host, the
secrets and other runs (docs/sandboxes.md).

Standard library only: this file ships inside every sandbox bundle.
"""

from __future__ import annotations

import contextlib
import gc
import json
import math
import os
import resource
import select
import signal
import time
import traceback
from collections import deque
from collections.abc import Sequence
from functools import partial
from typing import TYPE_CHECKING, Any, TypedDict

from forklab.runtime.canon import canonical_json, parse_canonical, sha256_hex
from forklab.runtime.contract import ContractViolation, from_exception, where
from forklab.runtime.crn import EpisodeDraws
from forklab.runtime.file_format import (
    Checkpoint,
    WorldColumns,
    WorldPlan,
    empty_columns,
)
from forklab.runtime.files import checkpoint_digest
from forklab.runtime.runner import continue_checkpoints, continue_state, world_blocks
from forklab.runtime.workload import State, Workload

if TYPE_CHECKING:
    from pathlib import Path

#: ``prctl`` option: orphaned descendants are re-parented to this process, not to init,
#: so that what a world leaves running can be found and killed.
_PR_SET_CHILD_SUBREAPER = 36
#: Most a world's process may write back (its columns are ~100 bytes an episode).
MAX_RESULT_BYTES = 256 << 20
#: How often the group checks whether a world's process ended while its pipe is quiet.
_POLL_SECONDS = 0.05
#: A large chunk is worked in slices: what the worlds share is worked out for at most
#: this many episodes, or until it takes this much more memory, then every world runs
#: over that slice, then the next. Every world's process maps all of it, and the
#: sandbox's memory limit holds for each process.
SLICE_EPISODES = 5_000
SLICE_BYTES = 96 << 20
#: How often (in episodes) a slice's growth is measured.
_MEASURE_EVERY = 64


class WorldResult(TypedDict, total=False):
    """What one world of a group came to: its ``columns``, or why there are none — the
    workload broke its ``contract`` (the sentence), the world's process failed with an
    ``error`` (its traceback or how it died), or it ran past its allowance
    (``timed_out``); and the wall ``seconds`` its process ran."""

    columns: WorldColumns
    contract: str
    error: str
    timed_out: bool
    seconds: float


class _Shared:
    """What every world of the group starts from over one slice of the chunk, worked out
    once before the forks: each checkpoint's state read back, its inherited identity and
    the episode's draw table holding the block runs the workload says every world will
    draw. Takes checkpoints from the front of ``pending`` (each is freed once read) until
    the slice is full (``SLICE_EPISODES``, ``SLICE_BYTES``)."""

    __slots__ = ("episodes", "inherited", "states", "tables")

    def __init__(self, workload: Workload, seed: int, pending: deque[Checkpoint]) -> None:
        self.episodes: list[int] = []
        self.inherited: list[str] = []
        self.states: list[State] = []
        self.tables: list[EpisodeDraws] = []
        start = _resident_bytes()
        # Millions of small objects are made here and all of them live on: a collection
        # would only walk them again and again (it doubled this part's time).
        collecting = gc.isenabled()
        gc.disable()
        try:
            while pending and len(self.episodes) < SLICE_EPISODES:
                if len(self.episodes) % _MEASURE_EVERY == _MEASURE_EVERY - 1 and (
                    _resident_bytes() - start > SLICE_BYTES
                ):
                    break
                cp = pending.popleft()
                episode = cp["episode"]
                state = parse_canonical(cp["state"])
                table = EpisodeDraws(seed, episode)
                at = where(episode, None, 0)
                for block, begin, stop in world_blocks(workload, state, at):
                    try:
                        table.keep_run(block, begin, stop)
                    except Exception as exc:  # the block's decode failed
                        raise from_exception(workload, exc, at) from exc
                self.episodes.append(episode)
                self.inherited.append(checkpoint_digest(sha256_hex(cp["state"]), None))
                self.states.append(state)
                self.tables.append(table)
        finally:
            if collecting:
                gc.enable()


def _resident_bytes() -> int:
    """This process's resident memory (0 where ``/proc`` cannot say)."""
    try:
        with open("/proc/self/statm", encoding="ascii") as fh:
            return int(fh.read().split()[1]) * resource.getpagesize()
    except (OSError, ValueError, IndexError):
        return 0


class _World:
    """One world's results so far, slice after slice: its columns, the seconds its
    processes ran, and the first failure (after which it runs no more)."""

    __slots__ = ("columns", "failure", "seconds")

    def __init__(self) -> None:
        self.columns = empty_columns()
        self.failure: WorldResult | None = None
        self.seconds = 0.0

    def add(self, result: WorldResult) -> None:
        self.seconds += result.pop("seconds", 0.0)
        if "columns" not in result:
            self.failure = result
            return
        got, cols = result["columns"], self.columns
        # (what a world's process wrote: the worker checks the whole, this only the shape)
        if not isinstance(got, dict) or not all(isinstance(v, list) for v in got.values()):
            self.failure = {"error": "the world's process wrote columns of another shape"}
            return
        cols["outcomes"] += got.get("outcomes", [])
        cols["intervened"] += got.get("intervened", [])
        cols["shocks"] += got.get("shocks", [])
        cols["inherited"] += got.get("inherited", [])

    def result(self) -> WorldResult:
        out: WorldResult = self.failure or {"columns": self.columns}
        out["seconds"] = round(self.seconds, 6)
        return out


def run_group(
    workload: Workload,
    seed: int,
    checkpoints: Sequence[Checkpoint],
    worlds: Sequence[WorldPlan],
    seconds: Sequence[float],
    root: Path | None = None,
) -> list[WorldResult]:
    """Continue every world in ``worlds`` from ``checkpoints``, each in its own forked
    process (one per slice of the chunk) with ``seconds[i]`` of wall clock in all (and as
    many CPU seconds a process); in world order.

    A workload with a workspace continues from ``root/<episode>``, which each world
    changes in place: such a group holds one world (the sandbox's workspace is that
    world's own copy-on-write view), run over the chunk in one process. A contract broken
    in the shared part (``world_blocks`` or a block's decode) is raised: it is every
    world's."""
    if len(seconds) != len(worlds):
        raise ValueError("give one allowance per world")
    if workload.has_workspace and len(worlds) > 1:
        raise ValueError("a workload with a workspace runs one world per sandbox")
    _become_subreaper()
    folders = [os.path.abspath(f"world-{i}") for i in range(len(worlds))]
    for folder in folders:
        os.mkdir(folder)
    if workload.has_workspace:
        job = partial(continue_checkpoints, workload, seed, checkpoints, worlds[0], root, True)
        return [_in_own_process(job, seconds[0], folders[0])]
    pending = deque(checkpoints)
    del checkpoints  # each checkpoint is freed once its slice has read it back
    runs = [_World() for _ in worlds]
    while pending:
        shared = _Shared(workload, seed, pending)
        # The parent's objects stay as they are for every fork: keeping the collector off
        # them spares each world copying the pages a collection would touch.
        gc.freeze()
        for world, allowance, folder, run in zip(worlds, seconds, folders, runs, strict=True):
            left = allowance - run.seconds
            if run.failure is None and left <= 0:
                run.failure = {"timed_out": True}
            if run.failure is not None:
                continue
            job = partial(_continue, workload, seed, world, shared)
            run.add(_in_own_process(job, left, folder))
        gc.unfreeze()
        del shared  # the slice's memory goes back for the next one
    return [run.result() for run in runs]


def _continue(workload: Workload, seed: int, world: WorldPlan, shared: _Shared) -> WorldColumns:
    """One world over the chunk, from the shared states and draw tables (this process's
    own copies of them, since it was forked)."""
    cols = empty_columns()
    outcomes, intervened, shocks = cols["outcomes"], cols["intervened"], cols["shocks"]
    for episode, state, kept in zip(shared.episodes, shared.states, shared.tables, strict=True):
        # A table of the world's own for the episode, holding the runs worked out ahead:
        # what the world draws besides goes there and is freed with it (kept in the
        # shared one, it would hold the whole chunk's draws and touch its pages).
        table = EpisodeDraws(seed, episode)
        table.runs.update(kept.runs)
        ok, did, fp, _ = continue_state(workload, state, seed, episode, world, table)
        outcomes.append(ok)
        intervened.append(did)
        shocks.append(fp)
    cols["inherited"] = shared.inherited
    return cols


def _become_subreaper() -> None:
    with contextlib.suppress(OSError, AttributeError):  # not Linux: by process group only
        import ctypes

        ctypes.CDLL(None).prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)


def _in_own_process(job: Any, allowance: float, folder: str) -> WorldResult:
    """Run ``job`` in a forked process in ``folder``, under ``allowance`` seconds; its
    result, and then no process of it left."""
    read, write = os.pipe()
    started = time.monotonic()
    pid = os.fork()
    if pid == 0:  # the world's process: it never returns from here
        os.close(read)
        _world_process(job, allowance, folder, write)
    os.close(write)
    try:
        data, cut, ended = _read_until(read, pid, started + allowance)
    finally:
        os.close(read)
    if ended is None:
        _kill(pid)
        ended = _reap(pid, 0)
        assert ended is not None
    spent = time.monotonic() - started
    _kill_leftovers(pid)
    result = _result(data, ended, cut, _cpu_limit(allowance))
    result["seconds"] = round(spent, 6)
    return result


def _world_process(job: Any, allowance: float, folder: str, write: int) -> None:
    answer: dict[str, Any]
    try:
        os.setsid()
        os.chdir(folder)
        cpu = _cpu_limit(allowance)
        resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
        answer = {"columns": job()}
    except ContractViolation as violation:
        answer = {"contract": str(violation)}
    except BaseException:
        answer = {"error": traceback.format_exc()}
    try:
        data = canonical_json(answer).encode()
    except (TypeError, ValueError):
        data = json.dumps({"error": "the world's result is not JSON"}).encode()
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(write, view) :]
    finally:
        os._exit(0)


def _cpu_limit(allowance: float) -> int:
    """The CPU seconds (soft limit) of a world with ``allowance`` wall seconds, within
    what this process may still give."""
    cpu = max(1, math.ceil(allowance)) + 1
    _, hard = resource.getrlimit(resource.RLIMIT_CPU)
    return cpu if hard == resource.RLIM_INFINITY else min(cpu, hard - 1)


def _reap(pid: int, flags: int) -> tuple[int, float] | None:
    """The wait status and CPU seconds of ``pid`` once it ended (None: not yet)."""
    done, status, usage = os.wait4(pid, flags)
    return (status, usage.ru_utime + usage.ru_stime) if done else None


def _read_until(
    fd: int, pid: int, deadline: float
) -> tuple[bytes, str | None, tuple[int, float] | None]:
    """What the world's process ``pid`` writes to ``fd`` until it ends, and how it ended
    (``_reap``); or, cut short, why ("late" once ``deadline`` passed, "large" past
    ``MAX_RESULT_BYTES``). The end of the process, not of the pipe, ends the reading: a
    process the world left behind may hold the pipe open for ever."""
    chunks: list[bytes] = []
    size = 0
    ended = None
    os.set_blocking(fd, False)
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return b"", "late", ended
        if ended is None:
            ready, _, _ = select.select([fd], [], [], min(left, _POLL_SECONDS))
            if not ready:
                ended = _reap(pid, os.WNOHANG)
                continue
        try:
            chunk = os.read(fd, 1 << 20)
        except BlockingIOError:  # the process ended and its pipe is drained
            return b"".join(chunks), None, ended
        if not chunk:  # every writer closed the pipe
            return b"".join(chunks), None, ended or _reap(pid, 0)
        size += len(chunk)
        if size > MAX_RESULT_BYTES:
            return b"", "large", ended
        chunks.append(chunk)


def _result(data: bytes, ended: tuple[int, float], cut: str | None, cpu_limit: int) -> WorldResult:
    status, cpu = ended
    if cut == "late":
        return {"timed_out": True}
    if cut == "large":
        return {"error": f"the world's process wrote more than {MAX_RESULT_BYTES} bytes"}
    if os.WIFSIGNALED(status) and (
        os.WTERMSIG(status) == signal.SIGXCPU
        or (os.WTERMSIG(status) == signal.SIGKILL and cpu >= cpu_limit)
    ):
        return {"timed_out": True}  # the CPU limit: SIGXCPU at the soft one, then SIGKILL
    try:
        answer = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError):
        answer = None
    if not isinstance(answer, dict) or len(answer) != 1:
        how = (
            f"was killed by signal {os.WTERMSIG(status)}"
            if os.WIFSIGNALED(status)
            else f"exited with code {os.waitstatus_to_exitcode(status)}"
        )
        return {"error": f"the world's process {how} without a result"}
    result: WorldResult = answer  # type: ignore[assignment]  # checked by the worker
    return result


def _kill_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


def _kill(pid: int) -> None:
    """Kill the world's process and its session's group (it may not have made it yet)."""
    _kill_group(pid)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


def _kill_leftovers(pid: int) -> None:
    """Kill what the world's process left: its session's group, then every process that
    was re-parented here (this process is their subreaper), until none is left."""
    _kill_group(pid)
    me = str(os.getpid())
    while True:
        orphans = [p for p in _children(me) if p != pid]
        if not orphans:
            break
        for orphan in orphans:
            _kill_group(orphan)
            with contextlib.suppress(ProcessLookupError):
                os.kill(orphan, signal.SIGKILL)
        for orphan in orphans:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(orphan, 0)


def _children(parent: str) -> list[int]:
    found: list[int] = []
    try:
        entries = os.listdir("/proc")
    except OSError:
        return found
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", encoding="ascii", errors="replace") as fh:
                stat = fh.read()
        except OSError:
            continue
        if stat.rpartition(")")[2].split()[1:2] == [parent]:
            found.append(int(entry))
    return found
