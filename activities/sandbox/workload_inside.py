"""The program the worker's own workload calls run in a box: rehearsal and held-out batches.

Run as ``python -S -B /.forklab/workload_inside.py OP`` inside bubblewrap, with the
runner bundle read-only on ``PYTHONPATH`` (``/code``). It reads ``in.json`` from the
scratch folder and writes ``out.json`` there. Standard library and the bundle only: it
must not import ForkLab beyond ``experiments.runtime``, so that workload code never
shares a process with anything that decides a result.

- ``rehearse``: check the workload and every intervention against it, run the prefix of
  every episode (checking the state and features of each), then time the prefix and
  each world on the first episodes, as the sandboxes will run them.
- ``batch``: run episodes through every world (guard validation on held-out episodes).

A spec that cannot run comes back as ``{"error": sentence}``; a workload that breaks its
contract (``experiments.runtime.contract``) as ``{"contract": sentence}``.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

from experiments.runtime.canon import canonical_json
from experiments.runtime.contract import ContractViolation, feature_kinds, from_exception
from experiments.runtime.file_format import WorldPlan
from experiments.runtime.runner import (
    continue_checkpoints,
    run_batch,
    run_prefix,
    workload_class,
)
from experiments.runtime.workload import Workload, WorkloadError


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

    start = time.perf_counter()
    checkpoints = [run_prefix(workload, seed, e, folder(e)) for e in range(n)]
    prefix_rate = (time.perf_counter() - start) / n
    # the contract on every prefix, before any approval
    _check_prefixes(workload, seed, range(n, total), root)
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
    }


#: Below this many episodes a part, checking prefixes in one process is cheaper than forking.
MIN_CHECKS_PER_PROCESS = 2_000


class _Answer(Exception):
    """A check process's answer (``{"error"|"contract": sentence}``), to send as the box's."""

    def __init__(self, answer: dict[str, str]) -> None:
        super().__init__(next(iter(answer.values())))
        self.answer = answer


def _check(workload: Workload, seed: int, episodes: range, root: Path | None) -> None:
    for episode in episodes:
        run_prefix(workload, seed, episode, None if root is None else root / str(episode))
        if root is not None:
            shutil.rmtree(root / str(episode))


def _check_prefixes(workload: Workload, seed: int, episodes: range, root: Path | None) -> None:
    """Run the prefix of every episode in ``episodes``, in contiguous parts over the CPUs
    this box may use (the twin runs them over ``--processes``; here they would otherwise
    take one core for the whole check): this process checks the first part, a forked one
    each other part. The first failure in episode order is the one answered, as one loop
    would answer it; a part that crashed fails the box with its traceback."""
    if not episodes:  # the rehearsal's sample held every episode
        return
    cpus = len(os.sched_getaffinity(0))
    parts = max(1, min(cpus, len(episodes) // MIN_CHECKS_PER_PROCESS))
    size = -(-len(episodes) // parts)
    ranges = [episodes[i : i + size] for i in range(0, len(episodes), size)]
    children: list[tuple[int, int]] = []
    try:
        for part in ranges[1:]:
            children.append(_fork_check(workload, seed, part, root))
        _check(workload, seed, ranges[0], root)
    except BaseException:
        for pid, fd in children:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            os.close(fd)
        raise
    reports = []
    for pid, fd in children:
        with os.fdopen(fd, encoding="utf-8") as pipe:
            reports.append(pipe.read())
        os.waitpid(pid, 0)
    for report in reports:
        answer = json.loads(report or '{"crash": "the check process died"}')
        if "crash" in answer:
            raise RuntimeError(f"a prefix check process failed:\n{answer['crash']}")
        if answer:
            raise _Answer(answer)


def _fork_check(workload: Workload, seed: int, part: range, root: Path | None) -> tuple[int, int]:
    """A child checking ``part``; it writes ``{}`` or its answer to the pipe returned."""
    read, write = os.pipe()
    pid = os.fork()
    if pid:
        os.close(write)
        return pid, read
    os.close(read)
    answer: dict[str, str] = {}
    try:
        _check(workload, seed, part, root)
    except WorkloadError as exc:
        answer = {"error": f"field {exc.field}: {exc.message}"}
    except ContractViolation as exc:
        answer = {"contract": str(exc)}
    except BaseException:
        answer = {"crash": traceback.format_exc()}
    os.write(write, json.dumps(answer).encode())
    os._exit(0)


def batch(request: dict[str, Any]) -> dict[str, Any]:
    workload = _workload(request)
    return dict(run_batch(workload, request["seed"], request["episodes"], _plans(request)))


def main(argv: list[str]) -> int:
    op = {"rehearse": rehearse, "batch": batch}[argv[1]]
    with open("in.json", encoding="utf-8") as fh:
        request = json.load(fh)
    try:
        result = op(request)
    except _Answer as exc:
        result = exc.answer
    except WorkloadError as exc:
        result = {"error": f"field {exc.field}: {exc.message}"}
    except ContractViolation as exc:
        result = {"contract": str(exc)}
    with open("out.json", "w", encoding="utf-8") as fh:
        fh.write(canonical_json(result))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
