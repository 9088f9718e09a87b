"""The program the worker's own workload calls run in a box: rehearsal and held-out batches.

Run as ``python -S -B /.forklab/worker_calls.py OP`` inside bubblewrap, with the
runner bundle read-only on ``PYTHONPATH`` (``/code``). It reads ``in.json`` from the
scratch folder and writes ``out.json`` there. Standard library and the bundle only: it
must not import ForkLab beyond ``forklab.runtime``, so that workload code never
shares a process with anything that decides a result.

- ``rehearse``: check the workload and every intervention against it, time the prefix
  and each world on the first episodes as the sandboxes will run them, and run the
  prefix of every episode (checking the state and features of each); given the run's
  chunks, a workload without files whose prefixes fit the box writes them for the
  worker to hand over (``PREFIXES_DIR``), so that the prefix stage does not run them
  again.
- ``batch``: run episodes through every world (guard validation on held-out episodes).

A spec that cannot run comes back as ``{"error": sentence}``; a workload that breaks its
contract (``forklab.runtime.contract``) as ``{"contract": sentence}``.
"""

from __future__ import annotations

import json
import math
import os
import resource
import select
import shutil
import signal
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

from forklab.runtime.canon import canonical_json
from forklab.runtime.contract import ContractViolation, feature_kinds, from_exception
from forklab.runtime.file_format import WorldPlan
from forklab.runtime.runner import (
    continue_checkpoints,
    run_batch,
    run_prefix,
    workload_class,
    write_prefixes,
)
from forklab.runtime.workload import Workload, WorkloadError

_R = TypeVar("_R")


def _workload(request: dict[str, Any]) -> Workload:
    cls = workload_class(request["workload"])
    try:
        workload = cls(request["params"])
    except WorkloadError:
        raise
    except Exception as exc:  # the workload's own code failed while loading
        raise from_exception(cls, exc, "while loading the workload") from exc
    feature_kinds(cls)
    for i, world in enumerate(request["worlds"]):
        if world["intervention"] is None:
            continue
        try:
            workload.intervention_params(world["intervention"], world["params"])
        except WorkloadError as exc:
            raise WorkloadError(f"worlds[{i}].{exc.field}", exc.message) from None
    return workload


def _plans(request: dict[str, Any]) -> list[WorldPlan]:
    return [WorldPlan.from_json(w) for w in request["worlds"]]


def rehearse(request: dict[str, Any]) -> dict[str, Any]:
    workload = _workload(request)
    # A workload with a workspace: one folder per episode, in the box's scratch folder;
    # the worlds continue from copies of the first ``n`` (the folders stay as they are).
    root = Path(tempfile.mkdtemp(prefix="rehearse-")) if workload.has_workspace else None
    try:
        return _rehearse(workload, request, root)
    finally:
        if root is not None:
            shutil.rmtree(root, ignore_errors=True)


def _rehearse(workload: Workload, request: dict[str, Any], root: Path | None) -> dict[str, Any]:
    seed, n, total = request["seed"], request["episodes"], request["all_episodes"]

    def folder(episode: int) -> Path | None:
        return None if root is None else root / str(episode)

    # Timed as the prefix's sandbox runs it: the budget reserves each prefix chunk from
    # this rate, and a chunk past its reservation is killed.
    start = time.perf_counter()
    checkpoints = [run_prefix(workload, seed, e, folder(e)) for e in range(n)]
    prefix_rate = (time.perf_counter() - start) / n
    # The contract on every prefix, before any approval: by running them for good, to
    # hand over, when the workload keeps no files and that fits the box's CPU; else by a
    # check of each, and the prefix stage runs them again after approval.
    chunks: list[tuple[int, int]] = [(a, b) for a, b in request.get("chunks") or []]
    handed = bool(chunks) and root is None and _handover_fits(prefix_rate, total)
    if handed:
        _hand_over(workload, request, chunks)
    else:
        _check_prefixes(workload, seed, range(n, total), root)
    # Each world alone, working out every block run it draws itself: a world batch shares
    # them with the other worlds of its sandbox, so this is what it costs at most.
    worlds = []
    for plan in _plans(request):
        start = time.perf_counter()
        cols = continue_checkpoints(workload, seed, checkpoints, plan, root)
        rate = (time.perf_counter() - start) / n
        failure = (n - sum(cols["outcomes"])) / n
        worlds.append({"name": plan.name, "seconds_per_episode": rate, "failure_rate": failure})
    return {
        "episodes": n,
        "prefix_seconds_per_episode": prefix_rate,
        "worlds": worlds,
        "workspace": workload.has_workspace,
        "handed": handed,
    }


#: The share of the box's CPU seconds the handed-over prefixes may take, as the sample's
#: rate foretells them (a quarter of 900 s: on one CPU at half speed the rehearsal still
#: ends within its 10-minute activity timeout); past it the rehearsal only checks each
#: prefix (nothing written) and the prefix stage runs them after approval.
HANDOVER_CPU_SHARE = 0.25

#: Where the handed-over prefixes go, in the box's folder: ``<chunk>.checkpoints``.
PREFIXES_DIR = "prefixes"


def _handover_fits(prefix_rate: float, episodes: int) -> bool:
    cpu = _limit(resource.RLIMIT_CPU)
    return cpu is None or prefix_rate * episodes <= HANDOVER_CPU_SHARE * cpu[0]


def _hand_over(workload: Workload, request: dict[str, Any], chunks: list[tuple[int, int]]) -> None:
    """Write every chunk's checkpoints, as the prefix sandbox's runner writes them
    (``write_prefixes``), over the box's CPUs, each part taking the next chunk as it
    finishes one."""
    seed = request["seed"]
    out = Path(PREFIXES_DIR)
    out.mkdir()

    def run(part: Sequence[int]) -> None:
        for index in part:
            first, stop = chunks[index]
            checkpoints = str(out / f"{index}.checkpoints")
            write_prefixes(workload, seed, range(first, stop), None, checkpoints)

    episodes = sum(stop - first for first, stop in chunks)
    _in_parts(range(len(chunks)), run, min(_parts(episodes), len(chunks)), piece=1)


#: Below this many episodes a part, checking prefixes in one process is cheaper than forking.
MIN_CHECKS_PER_PROCESS = 2_000

#: Processes (and threads) of the box's uid left free beside the check's parts.
PROCESS_HEADROOM = 2


class _Answer(Exception):
    """A check process's answer (``{"error"|"contract": sentence}``), to send as the box's."""

    def __init__(self, answer: dict[str, str]) -> None:
        super().__init__(next(iter(answer.values())))
        self.answer = answer


def _answer(exc: _Answer | WorkloadError | ContractViolation) -> dict[str, str]:
    """The box's answer for a spec that cannot run or a workload that broke its contract."""
    if isinstance(exc, _Answer):
        return exc.answer
    if isinstance(exc, WorkloadError):
        return {"error": f"field {exc.field}: {exc.message}"}
    return {"contract": str(exc)}


def _check(workload: Workload, seed: int, episodes: Sequence[int], root: Path | None) -> None:
    for episode in episodes:
        run_prefix(workload, seed, episode, None if root is None else root / str(episode))
        if root is not None:
            shutil.rmtree(root / str(episode))


def tasks_of_this_uid() -> int:
    """Processes and threads of this process's real uid: what ``RLIMIT_NPROC`` counts (the
    box's parts count them here; the worker, in ``jail.process_allowance``)."""
    uid, tasks = str(os.getuid()), 0
    for status in Path("/proc").glob("[0-9]*/status"):
        try:
            fields = dict(ln.split(":", 1) for ln in status.read_text().splitlines() if ":" in ln)
        except OSError:
            continue
        if fields.get("Uid", "").split()[:1] == [uid]:
            tasks += int(fields.get("Threads", "1"))
    return tasks


def _parts(episodes: int) -> int:
    """How many processes check the prefixes: one per CPU this box may use, at least
    ``MIN_CHECKS_PER_PROCESS`` episodes each, no more than the box's process limit has
    room for (with ``PROCESS_HEADROOM`` left)."""
    parts = min(len(os.sched_getaffinity(0)), episodes // MIN_CHECKS_PER_PROCESS)
    soft = resource.getrlimit(resource.RLIMIT_NPROC)[0]
    if soft != resource.RLIM_INFINITY:
        parts = min(parts, soft - tasks_of_this_uid() - PROCESS_HEADROOM)
    return max(1, parts)


def _limit(which: int) -> tuple[int, int] | None:
    """The box's limit of ``which`` as (what is left of it, hard limit); None: no limit."""
    soft, hard = resource.getrlimit(which)
    limit = soft if soft != resource.RLIM_INFINITY else hard
    return None if limit == resource.RLIM_INFINITY else (limit, hard)


def _part_limits(parts: int) -> list[tuple[int, tuple[int, int]]]:
    """The rlimits of one of ``parts`` check processes: its share of the CPU seconds this
    process has left, and of the address space beyond what it maps now (which a forked
    part shares with it)."""
    limits = []
    cpu = _limit(resource.RLIMIT_CPU)
    if cpu is not None:
        usage = resource.getrusage(resource.RUSAGE_SELF)
        share = max(1, int((cpu[0] - usage.ru_utime - usage.ru_stime) // parts))
        limits.append((resource.RLIMIT_CPU, (share, min(share + 1, cpu[1]))))
    memory = _limit(resource.RLIMIT_AS)
    if memory is not None:
        with open("/proc/self/statm", encoding="ascii") as fh:
            mapped = int(fh.read().split()[0]) * resource.getpagesize()
        share = min(memory[0], mapped + max(0, memory[0] - mapped) // parts)
        limits.append((resource.RLIMIT_AS, (share, share)))
    return limits


def _charge_children_cpu(before: float) -> None:
    """Take the CPU seconds the check processes used from this process's limit, so that
    the box uses no more in all than one process could."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    spent = math.ceil(usage.ru_utime + usage.ru_stime - before)
    soft, hard = resource.getrlimit(resource.RLIMIT_CPU)
    own = resource.getrusage(resource.RUSAGE_SELF)
    floor = math.ceil(own.ru_utime + own.ru_stime) + 1  # (not below what it used: no kill)
    if hard != resource.RLIM_INFINITY:
        hard = min(hard, max(floor + 1, hard - spent))
    if soft != resource.RLIM_INFINITY:
        soft = min(max(floor, soft - spent), hard)
    resource.setrlimit(resource.RLIMIT_CPU, (soft, hard))


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _check_prefixes(workload: Workload, seed: int, episodes: range, root: Path | None) -> None:
    """Run the prefix of every episode in ``episodes``, in pieces over the CPUs this box
    may use (the twin runs them over ``--processes``; here they would otherwise take one
    core for the whole check); see ``_in_parts``. The first failure in episode order is
    the one answered, as one loop would answer it."""

    _in_parts(episodes, lambda part: _check(workload, seed, part, root))


#: Pieces a part's share of the work is cut into: parts take the next piece as they finish
#: one, so a part on a slower CPU (or with costlier episodes) does fewer pieces instead of
#: holding the box until it has done as many as the others.
PIECES_PER_PART = 4
#: Bytes of one piece's number in the queue the parts read: every number is written
#: before the parts start, so the queue must fit in a pipe's buffer (at least
#: ``PIPE_BUF`` bytes; a read of fewer is never split between readers).
_PIECE = 4
_MAX_PIECES = select.PIPE_BUF // _PIECE


def _in_parts(
    items: Sequence[int],
    job: Callable[[Sequence[int]], _R],
    parts: int | None = None,
    piece: int | None = None,
) -> list[_R]:
    """``job`` over contiguous pieces of ``items`` (episodes, or chunk numbers), in
    ``parts`` forked processes (one per CPU this box may use, ``_parts``, unless given),
    each under its share of the box's limits while this one waits. The pieces (``piece``
    items each, default a ``PIECES_PER_PART``-th of a part's share) wait in a queue in
    order and each part takes the next one when it has done its last, so the parts end
    together. Returns each piece's result, in order.

    The first piece (in order) that failed with a spec error or a broken contract is the
    one answered, as one loop would answer it: every piece before it was taken before it
    and is done, since a part stops only at its own failure. A part that crashed fails the
    box with its traceback. When no process could be forked, the pieces run here."""
    parts = _parts(len(items)) if parts is None else parts
    if parts == 1:
        return [job(items)]
    size = max(piece or -(-len(items) // (parts * PIECES_PER_PART)), 1)
    size = max(size, -(-len(items) // _MAX_PIECES))
    pieces = [items[i : i + size] for i in range(0, len(items), size)]
    limits = _part_limits(parts)
    before = _children_cpu()
    queue, queue_write = os.pipe()
    # Every piece's number is in the queue before a part starts, and its writing end is
    # closed: a part that finds the queue empty is done.
    os.write(queue_write, b"".join(i.to_bytes(_PIECE, "little") for i in range(len(pieces))))
    os.close(queue_write)
    running: dict[int, int] = {}
    reports: list[dict[str, Any]] = []
    try:
        for _ in range(parts):
            child = _fork_part(job, pieces, queue, limits)
            if child is not None:
                running[child[0]] = child[1]
        forked = bool(running)
        for pid, fd in list(running.items()):
            with os.fdopen(fd, encoding="utf-8") as pipe:
                del running[pid]
                report = pipe.read()
            os.waitpid(pid, 0)
            reports.append(json.loads(report or '{"crash": "the part\'s process died"}'))
        if not forked:  # no part could be forked: one loop, here
            results: list[list[Any]] = []
            while number := os.read(queue, _PIECE):
                index = int.from_bytes(number, "little")
                results.append([index, job(pieces[index])])
            reports.append({"results": results})
    except BaseException:
        for pid, fd in running.items():
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            os.close(fd)
        raise
    finally:
        os.close(queue)
    _charge_children_cpu(before)
    return _in_order(reports, len(pieces))


def _take_pieces(
    job: Callable[[Sequence[int]], object], pieces: list[Sequence[int]], queue: int
) -> dict[str, Any]:
    """Run the pieces this process takes from ``queue`` until it is empty or one fails:
    ``{"results": [[piece, result], ...]}`` and, after a failure, ``"failed": [piece,
    answer]``."""
    results: list[list[Any]] = []
    report: dict[str, Any] = {"results": results}
    while number := os.read(queue, _PIECE):
        index = int.from_bytes(number, "little")
        try:
            results.append([index, job(pieces[index])])
        except (_Answer, WorkloadError, ContractViolation) as exc:
            report["failed"] = [index, _answer(exc)]
            break
    return report


def _in_order(reports: list[dict[str, Any]], count: int) -> list[Any]:
    """Every piece's result in order, from the parts' ``reports``; or the answer of the
    first piece that failed (``_Answer``), or a part's crash (``RuntimeError``)."""
    for report in reports:
        if "crash" in report:
            raise RuntimeError(f"a part's process failed:\n{report['crash']}")
    failures = [report["failed"] for report in reports if "failed" in report]
    first = min((index for index, _ in failures), default=count)
    done = {index: result for report in reports for index, result in report["results"]}
    if any(index not in done for index in range(first)):  # (a part stops only at its own)
        raise RuntimeError("a piece before the first failure was never run")
    if first < count:
        raise _Answer(next(answer for index, answer in failures if index == first))
    return [done[index] for index in range(count)]


def _fork_part(
    job: Callable[[Sequence[int]], object],
    pieces: list[Sequence[int]],
    queue: int,
    limits: list[tuple[int, tuple[int, int]]],
) -> tuple[int, int] | None:
    """A child taking pieces from ``queue`` under ``limits`` (``_take_pieces``); it writes
    its report, or ``{"crash": traceback}``, to the pipe returned. None: no process could
    be made (the box's process limit)."""
    try:
        read, write = os.pipe()
    except OSError:
        return None
    try:
        pid = os.fork()
    except OSError:
        os.close(read)
        os.close(write)
        return None
    if pid:
        os.close(write)
        return pid, read
    os.close(read)
    try:
        for which, limit in limits:
            resource.setrlimit(which, limit)
        report = _take_pieces(job, pieces, queue)
    except BaseException:
        report = {"crash": traceback.format_exc()}
    with os.fdopen(write, "w", encoding="utf-8") as pipe:
        pipe.write(json.dumps(report))
    os._exit(0)


def batch(request: dict[str, Any]) -> dict[str, Any]:
    """Every world over ``episodes``, in pieces over the box's CPUs as the twin runs them
    over its processes (``_in_parts``), joined in episode order: the guard's held-out
    episodes otherwise took one core for the whole analysis stage."""
    workload = _workload(request)
    seed, plans = request["seed"], _plans(request)

    def run(part: Sequence[int]) -> dict[str, Any]:
        found = dict(run_batch(workload, seed, part, plans))
        found.pop("forks_saved", None)  # (the twin's count; the columns are the answer)
        return found

    return _joined(_in_parts(request["episodes"], run))


def _joined(parts: list[dict[str, Any]]) -> dict[str, Any]:
    """Batches of consecutive episodes as one, in the order given."""
    if len(parts) == 1:
        return parts[0]
    keys = ("episodes", "requested", "resolved", "checkpoints", "features")
    joined: dict[str, Any] = {key: [v for p in parts for v in p[key]] for key in keys}
    joined["worlds"] = {
        name: {key: [v for p in parts for v in p["worlds"][name][key]] for key in cols}
        for name, cols in parts[0]["worlds"].items()
    }
    return joined


def main(argv: list[str]) -> int:
    op = {"rehearse": rehearse, "batch": batch}[argv[1]]
    with open("in.json", encoding="utf-8") as fh:
        request = json.load(fh)
    try:
        result = op(request)
    except (_Answer, WorkloadError, ContractViolation) as exc:
        result = _answer(exc)
    with open("out.json", "w", encoding="utf-8") as fh:
        fh.write(canonical_json(result))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
