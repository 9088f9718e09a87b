"""Workload code the worker itself needs run — the rehearsal and the guard's held-out
validation — in a box like the worlds', never in the worker's process.

Each call copies the runner bundle into a fresh folder (read-only, checked against the
digest it must have), runs ``forklab/runtime/worker_calls.py`` on it with ``run_confined``
(bubblewrap:
no network, no ``FORKLAB_HOME``, no environment, rlimits, dies with the worker) and reads
one JSON answer back, which it validates like any untrusted output.
"""

from __future__ import annotations

import json
import math
import os
import secrets
import shutil
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, cast

from forklab.activities.experiment.runner_bundle import code_digest
from forklab.activities.sandbox.base import ExecResult, Limits, read_box_file
from forklab.activities.sandbox.code_box import copy_code, run_program, tail
from forklab.activities.sandbox.jail import RUNTIME
from forklab.experiments.experiment.bundle import BundleFile
from forklab.experiments.experiment.columnar import ColumnBatch, to_columns
from forklab.experiments.experiment.spec import ExperimentSpec
from forklab.runtime import strict_json
from forklab.runtime.file_format import COLUMN_TYPES, Batch, WorldPlan
from forklab.runtime.worker_calls import PREFIXES_DIR

#: Limits of one call: a rehearsal or a held-out validation is one process, a few minutes.
CALL_LIMITS = Limits(memory_mb=1024, cpu_seconds=900, wall_seconds=900, processes=16)
_PROGRAM = RUNTIME / "worker_calls.py"


class WorkloadSpecError(ValueError):
    """The workload cannot run this spec; the message is the sentence to show."""


class WorkloadContractError(WorkloadSpecError):
    """The workload broke its contract; the message is its one sentence."""


class WorkloadCallError(RuntimeError):
    """The box crashed, timed out, or answered something that is not a valid answer."""


def _is_rate(value: Any) -> bool:
    return isinstance(value, int | float) and math.isfinite(value) and value >= 0


def _check_rehearsal(answer: dict[str, Any], worlds: list[str]) -> None:
    if not (isinstance(answer.get("episodes"), int) and answer["episodes"] > 0):
        raise WorkloadCallError("the rehearsal answered no episode count")
    if not _is_rate(answer.get("prefix_seconds_per_episode")):
        raise WorkloadCallError("the rehearsal answered no valid prefix rate")
    if not isinstance(answer.get("workspace"), bool):
        raise WorkloadCallError("the rehearsal did not say whether the workload has a workspace")
    if not isinstance(answer.get("handed", False), bool):
        raise WorkloadCallError("the rehearsal did not say whether it hands its prefixes over")
    seen = answer.get("worlds")
    if not isinstance(seen, list) or [w.get("name") for w in seen] != worlds:
        raise WorkloadCallError("the rehearsal did not answer for exactly the spec's worlds")
    for w in seen:
        rate = w.get("failure_rate")
        if not (_is_rate(w.get("seconds_per_episode")) and _is_rate(rate) and rate <= 1):
            raise WorkloadCallError(f"the rehearsal answered invalid rates for {w['name']!r}")


def _held_out_batch(answer: dict[str, Any], worlds: list[str], episodes: list[int]) -> Batch:
    """The box's batch, checked like any untrusted output: the episodes asked for, every
    world's four columns and each episode's pre-decision features (the guarded world is
    derived from them), all of the right length and types."""
    n = len(episodes)
    if answer.get("episodes") != episodes:
        raise WorkloadCallError("the held-out batch did not answer for the episodes asked")
    kinds: list[tuple[str, type]] = [("requested", int), ("resolved", int), ("checkpoints", str)]
    for key, kind in kinds:
        col = answer.get(key)
        if not (isinstance(col, list) and len(col) == n and all(isinstance(v, kind) for v in col)):
            raise WorkloadCallError(f"held-out column {key} is not {n} entries of {kind.__name__}")
    features = answer.get("features")
    if not (isinstance(features, list) and len(features) == n):
        raise WorkloadCallError(f"held-out features are not {n} entries")
    for f in features:
        if not isinstance(f, dict) or not all(
            isinstance(k, str) and (v is None or isinstance(v, bool | int | float | str))
            for k, v in f.items()
        ):
            raise WorkloadCallError("held-out features hold something other than feature values")
    columns = answer.get("worlds")
    if not isinstance(columns, dict) or sorted(columns) != sorted(worlds):
        raise WorkloadCallError("the held-out batch did not answer for exactly its worlds")
    for name, cols in columns.items():
        if not isinstance(cols, dict) or sorted(cols) != sorted(COLUMN_TYPES):
            raise WorkloadCallError(f"held-out world {name!r} lacks its four columns")
        for key, kind in COLUMN_TYPES.items():
            col = cols[key]
            if not (isinstance(col, list) and len(col) == n):
                raise WorkloadCallError(f"held-out column {name}.{key} is not {n} long")
            if not all(isinstance(v, kind) for v in col):
                raise WorkloadCallError(f"held-out column {name}.{key} holds wrong types")
    return cast(Batch, answer)


class WorkloadCalls:
    """Runs rehearsals and held-out batches in boxes under ``root`` (one folder per call,
    removed afterwards; leftovers of a dead worker are removed by the next one)."""

    def __init__(self, root: Path, limits: Limits = CALL_LIMITS) -> None:
        self.root = root
        self.limits = limits
        root.mkdir(parents=True, exist_ok=True)
        for stale in root.glob("call-*"):
            pid = stale.name.split("-")[1]
            if pid.isdigit() and not Path(f"/proc/{pid}").exists():
                _remove(stale)

    def rehearse(
        self,
        spec: ExperimentSpec,
        plans: Sequence[WorldPlan],
        episodes: int,
        files: list[BundleFile],
        started: Callable[[int], None] = lambda pid: None,
        handover: Handover | None = None,
    ) -> tuple[dict[str, Any], str, ExecResult]:
        """The rehearsal's answer, the code digest it ran (``files``, as they are now),
        and how the box ran; ``started`` gets the box's process group id (to kill it when
        the activity is cancelled). With ``handover``, the box may run every chunk's
        prefixes for good: then (answer ``handed``) each chunk's files go to
        ``handover.take``, in chunk order, before the box's folder is removed."""
        request = self._request(spec, plans) | {
            "episodes": episodes,
            "all_episodes": spec.episodes,
        }
        if handover is not None:
            request["chunks"] = [list(chunk) for chunk in handover.chunks]
        digest = code_digest(files)
        names = [p.name for p in plans]

        def collect(work: Path, answer: dict[str, Any]) -> None:
            _check_rehearsal(answer, names)
            if handover is None or not answer.get("handed"):
                return
            folder = work / PREFIXES_DIR
            for index in range(len(handover.chunks)):
                try:
                    checkpoints = read_box_file(folder / f"{index}.checkpoints")
                except OSError as exc:
                    raise WorkloadCallError(
                        f"the rehearsal wrote no checkpoints for chunk {index} ({exc})"
                    ) from None
                handover.take(index, checkpoints)

        answer, result = self._call("rehearse", files, request, digest, started, collect)
        return answer, digest, result

    def held_out(
        self,
        spec: ExperimentSpec,
        episodes: Sequence[int],
        plans: Sequence[WorldPlan],
        files: list[BundleFile],
        expected_digest: str,
        started: Callable[[int], None] = lambda pid: None,
    ) -> ColumnBatch:
        """Every world's columns and the features over ``episodes``, run from the code the
        plan named; ``started`` gets the box's process group id."""
        request = self._request(spec, plans) | {"episodes": list(episodes)}
        answer, _ = self._call("batch", files, request, expected_digest, started)
        return to_columns(_held_out_batch(answer, [p.name for p in plans], list(episodes)))

    def held_out_runner(
        self, files: list[BundleFile], expected_digest: str
    ) -> Callable[[ExperimentSpec, Sequence[int], Sequence[WorldPlan]], ColumnBatch]:
        return lambda spec, episodes, plans: self.held_out(
            spec, episodes, plans, files, expected_digest
        )

    @staticmethod
    def _request(spec: ExperimentSpec, plans: Sequence[WorldPlan]) -> dict[str, Any]:
        return {
            "workload": spec.workload.name,
            "params": dict(spec.workload.params),
            "seed": spec.seed,
            "worlds": [p.to_json() for p in plans],
        }

    def _call(
        self,
        op: str,
        files: list[BundleFile],
        request: dict[str, Any],
        expected_digest: str,
        started: Callable[[int], None] = lambda pid: None,
        collect: Callable[[Path, dict[str, Any]], None] | None = None,
    ) -> tuple[dict[str, Any], ExecResult]:
        """Copy ``files`` into a fresh box folder, check that the copies are the code
        ``expected_digest`` names (what runs is what was planned), run ``op`` there;
        ``collect`` reads what else the box wrote, given its answer (a valid one), before
        the folder goes."""
        folder = self.root / f"call-{os.getpid()}-{secrets.token_hex(6)}"
        work = folder / "work"
        try:
            found = copy_code(files, folder / "code")
            if found != expected_digest:
                raise WorkloadCallError(
                    f"the workload code is now {found[:12]} but the plan ran "
                    f"{expected_digest[:12]}; start the experiment again"
                )
            body = json.dumps(request).encode()
            result = run_program(_PROGRAM, [op], folder, body, self.limits, started)
            if result.timed_out:
                raise WorkloadCallError(
                    f"the {op} box ran out of its {self.limits.wall_seconds:g} s and was killed"
                )
            if result.exit_code != 0:
                raise WorkloadCallError(
                    f"the {op} box exited with code {result.exit_code}: {tail(result.stderr)}"
                )
            try:
                answer = strict_json.loads(read_box_file(work / "out.json"), "out.json")
            except (OSError, ValueError) as exc:  # StrictJsonError is a ValueError
                raise WorkloadCallError(f"the {op} box wrote no valid answer ({exc})") from None
            if not isinstance(answer, dict):
                raise WorkloadCallError(f"the {op} box answered something that is not an object")
            if "error" in answer:
                raise WorkloadSpecError(str(answer["error"])[:500])
            if "contract" in answer:
                raise WorkloadContractError(str(answer["contract"])[:1000])
            if collect is not None:
                collect(work, answer)
        finally:
            _remove(folder)
        return answer, result


class Handover:
    """What the rehearsal hands over when its box runs every prefix for good: the run's
    chunks (first, stop) and where each chunk's checkpoints go (``take(index,
    checkpoints)``, raising to refuse them)."""

    def __init__(
        self, chunks: Sequence[tuple[int, int]], take: Callable[[int, bytes], None]
    ) -> None:
        self.chunks = list(chunks)
        self.take = take


def _remove(folder: Path) -> None:
    shutil.rmtree(folder, ignore_errors=True)
