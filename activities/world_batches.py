"""Sandbox activities: run prefixes once, run world batches, and clean up by label.

Each activity owns the sandbox it creates and deletes it on the way out (success, error
or cancellation); ``cleanup`` then reconciles by label, so a worker killed mid-batch
leaves nothing behind for long. Inputs and outputs travel as artifact digests.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable
from typing import Any, TypeVar

from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities.artifacts import ArtifactStore
from activities.models import (
    BatchInput,
    BatchOutcome,
    BatchStatus,
    CleanupInput,
    CleanupResult,
    PrefixInput,
    PrefixResult,
)
from activities.sandbox.base import (
    ExecResult,
    Limits,
    SandboxBackend,
    SandboxError,
    SnapshotCorruptedError,
)
from activities.shared_snapshots import SharedSnapshots
from experiments.runtime.contract import CONTRACT_EXIT
from experiments.runtime.file_format import (
    CHECKPOINTS_FILE,
    OUT_FILE,
    REQUEST_FILE,
    RUNNER_MODULE,
    FormatError,
    parse_checkpoints,
    parse_columns,
    request_text,
)

#: How often a running batch heartbeats (well inside ``BATCH_HEARTBEAT_TIMEOUT``).
HEARTBEAT_SECONDS = 2.0
#: Rounds of list-and-delete before cleanup reports what is still left.
CLEANUP_ROUNDS = 5
#: A retried attempt needs at least this much of its reservation left to be worth starting.
MIN_ATTEMPT_SECONDS = 1.0

EXPERIMENT_LABEL = "forklab.experiment"
WORLD_LABEL = "forklab.world"
BATCH_LABEL = "forklab.batch"
#: The error type of a snapshot whose files no longer match its id: it ends the run.
SNAPSHOT_CORRUPTED = "SnapshotCorrupted"
#: The label value of the sandbox that runs the prefixes (it is no world).
PREFIX_WORLD = "prefix"

_RUNNER = ["python", "-m", RUNNER_MODULE]
_FILES = ["--request", REQUEST_FILE, "--checkpoints", CHECKPOINTS_FILE, "--out", OUT_FILE]
_T = TypeVar("_T")


def _limits(seconds: float) -> Limits:
    return Limits(cpu_seconds=max(1, math.ceil(seconds)) + 1, wall_seconds=seconds)


def _charged_before() -> float:
    """Seconds earlier attempts of this activity spent, from their last heartbeat (plus one
    heartbeat interval, since an attempt may have run that long after its last beat)."""
    details = activity.info().heartbeat_details
    if not details or not isinstance(details[0], dict):
        return 0.0
    return float(details[0].get("charged", 0.0)) + HEARTBEAT_SECONDS


def _tail(text: str, limit: int = 300) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1][:limit] if lines else "no output"


class SandboxActivities:
    """Activities that create sandboxes. Constructed by the worker with its backend and store."""

    def __init__(
        self, backend: SandboxBackend, store: ArtifactStore, snapshots: SharedSnapshots
    ) -> None:
        """``snapshots`` rebuilds a snapshot another host prepared before a sandbox needs it."""
        self._backend = backend
        self._store = store
        self._snapshots = snapshots

    async def _blocking(self, fn: Callable[..., _T], *args: Any) -> _T:
        return await asyncio.to_thread(fn, *args)

    async def _stored(self, charged: float, fn: Callable[..., _T], *args: Any) -> _T:
        """A call to the artifact store, heartbeating ``charged`` while it waits: a store
        outage is ridden out inside the call (see ``activities.outages``), and the batch
        must not look dead meanwhile."""
        job = asyncio.ensure_future(asyncio.to_thread(fn, *args))
        while True:
            activity.heartbeat({"charged": charged})
            done, _ = await asyncio.wait({job}, timeout=HEARTBEAT_SECONDS)
            if done:
                return job.result()

    async def _exec(
        self, sandbox_id: str, argv: list[str], timeout: float, before: float
    ) -> ExecResult:
        """Run ``argv`` in a thread while heartbeating the seconds charged so far."""
        start = time.monotonic()
        job = asyncio.ensure_future(
            asyncio.to_thread(self._backend.exec, sandbox_id, argv, timeout)
        )
        while True:
            activity.heartbeat({"charged": before + time.monotonic() - start})
            done, _ = await asyncio.wait({job}, timeout=HEARTBEAT_SECONDS)
            if done:
                return job.result()

    async def _in_sandbox(
        self,
        labels: dict[str, str],
        snapshot_id: str,
        inputs: dict[str, bytes],
        mode: str,
        allowance: float,
        before: float,
    ) -> tuple[ExecResult, bytes | None]:
        """Create a sandbox, upload ``inputs``, run the runner, fetch its output, delete.

        Returns the exec result and the output file (``checkpoints.jsonl`` for ``prefix``,
        ``out.json`` for ``continue``), or ``None`` when the runner did not succeed.
        """
        await self._stored(before, self._snapshots.ensure, snapshot_id)
        try:
            return await self._in_fresh_sandbox(
                labels, snapshot_id, inputs, mode, allowance, before
            )
        except SnapshotCorruptedError as exc:
            raise ApplicationError(str(exc), type=SNAPSHOT_CORRUPTED, non_retryable=True) from None

    async def _in_fresh_sandbox(
        self,
        labels: dict[str, str],
        snapshot_id: str,
        inputs: dict[str, bytes],
        mode: str,
        allowance: float,
        before: float,
    ) -> tuple[ExecResult, bytes | None]:
        sandbox_id = await self._blocking(
            self._backend.create, snapshot_id, labels, _limits(allowance)
        )
        try:
            for relpath, data in inputs.items():
                await self._blocking(self._backend.upload, sandbox_id, relpath, data)
            result = await self._exec(sandbox_id, [*_RUNNER, mode, *_FILES], allowance, before)
            if result.timed_out or result.exit_code != 0:
                return result, None
            wanted = CHECKPOINTS_FILE if mode == "prefix" else OUT_FILE
            try:
                data = await self._blocking(self._backend.download, sandbox_id, wanted)
            except SandboxError:
                return result, None  # the runner exited cleanly without writing its output
            return result, data
        finally:
            await self._blocking(self._backend.delete, sandbox_id)

    @activity.defn(name="run_prefixes")
    async def run_prefixes(self, inp: PrefixInput) -> PrefixResult:
        """Run the prefix of every episode of one chunk, once, in a sandbox."""
        before = _charged_before()
        allowance = inp.reservation_seconds - before
        if allowance < MIN_ATTEMPT_SECONDS:
            raise ApplicationError(
                f"prefix chunk {inp.chunk.index}: earlier attempts used its whole reservation",
                type="BudgetExhausted",
                non_retryable=True,
            )
        episodes = range(inp.chunk.first, inp.chunk.stop)
        request = request_text(inp.job.workload, inp.job.params, inp.job.seed, episodes=episodes)
        labels = {
            EXPERIMENT_LABEL: inp.experiment_id,
            WORLD_LABEL: PREFIX_WORLD,
            BATCH_LABEL: str(inp.chunk.index),
        }
        inputs = {REQUEST_FILE: request.encode(), CHECKPOINTS_FILE: b""}
        result, data = await self._in_sandbox(
            labels, inp.snapshot_id, inputs, "prefix", allowance, before
        )
        why = _failure(result, allowance) or "the runner wrote no checkpoints"
        if data is None or _failure(result, allowance):
            raise ApplicationError(
                f"the prefix of episodes {inp.chunk.first}..{inp.chunk.stop - 1} failed: {why}",
                type="PrefixFailed",
                non_retryable=True,
            )
        try:
            await self._blocking(parse_checkpoints, data, inp.chunk.first, inp.chunk.size)
        except FormatError as exc:
            raise ApplicationError(
                f"the prefix runner printed invalid checkpoints: {exc}",
                type="PrefixFailed",
                non_retryable=True,
            ) from None
        digest = await self._stored(before + result.seconds, self._store.put_bytes, data)
        return PrefixResult(
            chunk=inp.chunk,
            checkpoints_digest=digest,
            seconds=before + result.seconds,
            network_isolated=result.network_isolated,
            note=result.note,
            confinement=result.confinement,
        )

    @activity.defn(name="run_world_batch")
    async def run_world_batch(self, inp: BatchInput) -> BatchOutcome:
        """Continue one world from one chunk's checkpoints in a fresh sandbox.

        A runner that crashes, times out or writes garbage fails this world (returned, not
        raised: it is deterministic and retrying would only spend budget again); a fault of
        the infrastructure raises and is retried.
        """
        name = inp.world.name
        before = _charged_before()
        attempts = activity.info().attempt

        def failed(error: str, seconds: float, ran: ExecResult | None = None) -> BatchOutcome:
            return BatchOutcome(
                world=name,
                chunk=inp.chunk,
                status=BatchStatus.failed,
                error=error,
                seconds=seconds,
                attempts=attempts,
                network_isolated=ran.network_isolated if ran else True,
                note=ran.note if ran else None,
                confinement=ran.confinement if ran else None,
            )

        allowance = inp.reservation_seconds - before
        if allowance < MIN_ATTEMPT_SECONDS:
            return failed("earlier attempts used the batch's whole reservation", before)
        checkpoints = await self._stored(before, self._store.get_bytes, inp.checkpoints_digest)
        request = request_text(inp.job.workload, inp.job.params, inp.job.seed, world=inp.world)
        labels = {
            EXPERIMENT_LABEL: inp.experiment_id,
            WORLD_LABEL: name,
            BATCH_LABEL: str(inp.chunk.index),
        }
        inputs = {REQUEST_FILE: request.encode(), CHECKPOINTS_FILE: checkpoints}
        result, data = await self._in_sandbox(
            labels, inp.snapshot_id, inputs, "continue", allowance, before
        )
        spent = before + result.seconds
        why = _failure(result, allowance)
        if data is None or why:
            return failed(why or "the runner wrote no output file", spent, result)
        try:
            columns = parse_columns(data, inp.chunk.size)
        except FormatError as exc:
            return failed(f"the runner printed garbage: {exc}", spent, result)
        digest = await self._stored(spent, self._store.put_json, columns)
        return BatchOutcome(
            world=name,
            chunk=inp.chunk,
            status=BatchStatus.completed,
            columns_digest=digest,
            seconds=spent,
            failures=inp.chunk.size - sum(columns["outcomes"]),
            attempts=attempts,
            network_isolated=result.network_isolated,
            note=result.note,
            confinement=result.confinement,
        )

    @activity.defn(name="cleanup_sandboxes")
    async def cleanup_sandboxes(self, inp: CleanupInput) -> CleanupResult:
        """Delete every sandbox labelled with the experiment; list again until none is left."""
        labels = {EXPERIMENT_LABEL: inp.experiment_id}
        found: set[str] = set()
        rounds = 0
        for rounds in range(1, CLEANUP_ROUNDS + 1):
            ids = await self._blocking(self._backend.list, labels)
            activity.heartbeat({"round": rounds})
            if not ids:
                break
            found.update(ids)
            for sandbox_id in ids:
                await self._blocking(self._backend.delete, sandbox_id)
        left = await self._blocking(self._backend.list, labels)
        # a sandbox asked to delete that is still listed was not removed (it never deletes)
        removed = len(found - set(left))
        return CleanupResult(found=len(found), removed=removed, rounds=rounds, left=len(left))


def _failure(result: ExecResult, allowance: float) -> str:
    if result.timed_out:
        return f"the runner exceeded its budget reservation of {allowance:.1f} s and was killed"
    if result.exit_code == CONTRACT_EXIT:
        return _tail(result.stderr, 1000)  # the workload broke its contract: its sentence
    if result.exit_code != 0:
        return f"the runner exited with code {result.exit_code}: {_tail(result.stderr)}"
    return ""
