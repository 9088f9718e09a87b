"""Sandbox activities: run prefixes once, run world batches (a group of worlds over a
chunk in one sandbox, each world in a process of its own), and clean up by label.

Each activity execution is one attempt of one unit (the workflow starts the next one
under a renewed reservation, see ``forklab.workflows.experiment.attempts``). It heartbeats before
anything else and then every ``HEARTBEAT_SECONDS`` with what it has spent and whether its sandbox
dies with the worker, so a dead attempt is charged honestly. It first deletes whatever
an earlier attempt of the same unit left (so one unit never has two sandboxes), owns the
sandbox it creates and deletes it on the way out; ``cleanup`` then reconciles by the
run's label. Sandboxes are labelled with the run (workflow id + run id), so no other run
lists, reuses or cleans them. Inputs and outputs travel as artifact digests.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from temporalio import activity
from temporalio.exceptions import ApplicationError

from forklab.activities.heartbeat import heartbeat_until
from forklab.activities.sandbox.base import (
    ExecResult,
    Limits,
    SandboxBackend,
    SandboxError,
    SnapshotCorruptedError,
    WorkspaceBackend,
    WorkspaceRefusedError,
)
from forklab.activities.sandbox.shared_snapshots import SharedSnapshots
from forklab.activities.sandbox.workspace import WorkspaceError
from forklab.activities.stores.artifacts import ArtifactStore
from forklab.activities.stores.outages import StoreUnavailableError
from forklab.contracts.errors import ExperimentErrorType
from forklab.contracts.experiment import (
    SETTLED_BEAT,
    BatchInput,
    BatchOutcome,
    BatchStatus,
    CleanupInput,
    CleanupResult,
    GroupOutcome,
    PrefixInput,
    PrefixResult,
)
from forklab.contracts.experiment_activities import CLEANUP_SANDBOXES, RUN_PREFIXES, RUN_WORLD_GROUP
from forklab.experiments.experiment.outcomes import StoredColumns
from forklab.experiments.workspace import WorkspaceEvidence, WorkspaceManifest
from forklab.runtime.contract import CONTRACT_EXIT
from forklab.runtime.file_format import (
    CHECKPOINTS_FILE,
    OUT_FILE,
    REQUEST_FILE,
    RUNNER_MODULE,
    Checkpoint,
    FormatError,
    WorldOutput,
    checkpoint_line,
    parse_checkpoints,
    parse_world_outputs,
    request_text,
)
from forklab.runtime.files import WorkspaceContentError, folder_digest

#: Rounds of list-and-delete before cleanup reports what is still left.
CLEANUP_ROUNDS = 5

EXPERIMENT_LABEL = "forklab.experiment"
#: The run that owns a sandbox: ``<workflow id>/<first run id>``.
RUN_LABEL = "forklab.run"
WORLD_LABEL = "forklab.world"
BATCH_LABEL = "forklab.batch"
#: Joins the names of a group's worlds in its sandbox's world label (no world name holds it).
GROUP_JOIN = "+"
#: The error type of a snapshot whose files no longer match its id: it ends the run.
#: The label value of the sandbox that runs the prefixes (it is no world).
PREFIX_WORLD = "prefix"

#: Where a workload with files finds its workspace, relative to the runner's folder (one
#: sub-folder per episode; the backend mounts it there).
WORKSPACE_DIR = "workspace"

_RUNNER = ["python", "-m", RUNNER_MODULE]
_FILES = ["--request", REQUEST_FILE, "--checkpoints", CHECKPOINTS_FILE, "--out", OUT_FILE]
_T = TypeVar("_T")


def _limits(seconds: float) -> Limits:
    return Limits(cpu_seconds=max(1, math.ceil(seconds)) + 1, wall_seconds=seconds)


def _tail(text: str, limit: int = 300) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1][:limit] if lines else "no output"


class _Beat:
    """What one attempt reports in its heartbeats: the seconds its sandbox has run,
    whether that sandbox dies with the worker (else a dead attempt may leave it running)
    and, once it exists, the sandbox's id (a failed unit's outcome still names it)."""

    def __init__(self, dies_with_worker: bool) -> None:
        self.charged = 0.0
        self.dies_with_worker = dies_with_worker
        self.sandbox_id: str | None = None

    def details(self) -> dict[str, Any]:
        beat: dict[str, Any] = {
            "charged": round(self.charged, 3),
            "dies_with_worker": self.dies_with_worker,
        }
        if self.sandbox_id:
            beat["sandbox_id"] = self.sandbox_id
        return beat

    def settled(self) -> dict[str, Any]:
        """The details of an attempt that fails on its own after its sandbox is gone (or
        before it existed): ``charged`` is exactly what ran (``SETTLED_BEAT``)."""
        return {**self.details(), SETTLED_BEAT: True}


class SandboxActivities:
    """Activities that create sandboxes. Constructed by the worker with its backend and store."""

    def __init__(
        self, backend: SandboxBackend, store: ArtifactStore, snapshots: SharedSnapshots
    ) -> None:
        """``snapshots`` rebuilds a snapshot another host prepared before a sandbox needs it."""
        self._backend = backend
        self._store = store
        self._snapshots = snapshots
        # Optional on a backend: a remote one's sandboxes outlive a dead worker.
        self._dies_with_worker = bool(getattr(backend, "dies_with_worker", False))

    async def _blocking(self, fn: Callable[..., _T], *args: Any) -> _T:
        return await asyncio.to_thread(fn, *args)

    async def _stored(self, charged: float, fn: Callable[..., _T], *args: Any) -> _T:
        """A call to the artifact store, heartbeating ``charged`` while it waits: a store
        outage is ridden out inside the call (see ``forklab.activities.stores.outages``), and the
        batch must not look dead meanwhile. Waiting is not compute: no sandbox of the attempt
        runs during the call (none yet, or already deleted), so an outage longer than the
        worker's ``store_retry_seconds`` fails the attempt with a beat that settles its
        charge at ``charged``, the seconds its sandbox ran, not its whole reservation."""
        beat = _Beat(self._dies_with_worker)
        beat.charged = charged
        try:
            return await heartbeat_until(asyncio.to_thread(fn, *args), beat.details)
        except StoreUnavailableError as exc:
            raise ApplicationError(
                str(exc), beat.settled(), type=ExperimentErrorType.store_unavailable
            ) from None

    async def _in_sandbox(
        self,
        labels: dict[str, str],
        snapshot_id: str,
        inputs: dict[str, bytes],
        mode: str,
        allowance: float,
        files: _Files | None = None,
    ) -> tuple[ExecResult, bytes | None, str]:
        """Clear what an earlier attempt of this unit left, then create a sandbox, upload
        ``inputs``, run the runner, fetch its output (``None`` when the runner did not
        succeed) and delete the sandbox; returns the sandbox's id too. A fault of the
        infrastructure is raised as a retryable ``ApplicationError`` carrying the attempt's
        last heartbeat. ``files`` gives the sandbox a workspace and reads it once the
        runner succeeded."""
        beat = _Beat(self._dies_with_worker)
        activity.heartbeat(beat.details())
        try:
            await self._stored(0.0, self._snapshots.ensure, snapshot_id)
            for leftover in await self._blocking(self._backend.list, labels):
                await self._blocking(self._backend.delete, leftover)
            return await self._in_fresh_sandbox(
                labels, snapshot_id, inputs, mode, allowance, beat, files
            )
        except SnapshotCorruptedError as exc:
            raise ApplicationError(
                str(exc), type=ExperimentErrorType.snapshot_corrupted, non_retryable=True
            ) from None
        except (ApplicationError, asyncio.CancelledError):
            raise
        except Exception as exc:
            raise ApplicationError(
                f"the sandbox failed: {exc}", beat.details(), type=type(exc).__name__
            ) from exc

    async def _create(
        self, snapshot_id: str, labels: dict[str, str], allowance: float, beat: _Beat
    ) -> str:
        """Create the attempt's sandbox and own it even if the attempt is cancelled meanwhile.

        The thread creating it cannot be stopped, so a cancelled attempt waits for it
        (heartbeating; a repeated cancel changes nothing), deletes what it made and only
        then re-raises the cancellation: ending at once would let the workflow's cleanup
        list the run's sandboxes before this one exists, and nothing would delete it."""
        create = asyncio.ensure_future(
            self._blocking(self._backend.create, snapshot_id, labels, _limits(allowance))
        )
        try:
            sandbox_id = await asyncio.shield(create)
        except asyncio.CancelledError:
            undo = asyncio.ensure_future(self._delete_created(create, beat))
            while not undo.done():
                with contextlib.suppress(asyncio.CancelledError):
                    await asyncio.shield(undo)
            raise
        beat.sandbox_id = sandbox_id
        return sandbox_id

    async def _delete_created(self, create: asyncio.Future[str], beat: _Beat) -> None:
        try:
            beat.sandbox_id = await heartbeat_until(create, beat.details)
        except Exception:
            return  # a failed create made nothing
        with contextlib.suppress(Exception):  # it is labelled: the run's cleanup lists it now
            await self._blocking(self._backend.delete, beat.sandbox_id)

    async def _in_fresh_sandbox(
        self,
        labels: dict[str, str],
        snapshot_id: str,
        inputs: dict[str, bytes],
        mode: str,
        allowance: float,
        beat: _Beat,
        files: _Files | None,
    ) -> tuple[ExecResult, bytes | None, str]:
        sandbox_id = await self._create(snapshot_id, labels, allowance, beat)
        try:
            if files is not None:
                await self._blocking(files.attach, sandbox_id)
            for relpath, data in inputs.items():
                await self._blocking(self._backend.upload, sandbox_id, relpath, data)
            start = time.monotonic()

            def details() -> dict[str, Any]:
                beat.charged = time.monotonic() - start
                return beat.details()

            argv = [*_RUNNER, mode, *_FILES]
            job = asyncio.to_thread(self._backend.exec, sandbox_id, argv, allowance)
            result = await heartbeat_until(job, details)
            beat.charged = result.seconds
            if result.timed_out or result.exit_code != 0:
                return result, None, sandbox_id
            wanted = CHECKPOINTS_FILE if mode == "prefix" else OUT_FILE
            try:
                data = await self._blocking(self._backend.download, sandbox_id, wanted)
            except SandboxError:
                # the runner exited cleanly without writing its output
                return result, None, sandbox_id
            if files is not None:
                await self._blocking(files.read, sandbox_id)
            return result, data, sandbox_id
        finally:
            await self._blocking(self._backend.delete, sandbox_id)

    @activity.defn(name=RUN_PREFIXES.name)
    async def run_prefixes(self, inp: PrefixInput) -> PrefixResult:
        """Run the prefix of every episode of one chunk, once, in a sandbox."""
        allowance = inp.reservation_seconds
        episodes = range(inp.chunk.first, inp.chunk.stop)
        files = self._files(inp.job.workspace, None, inp.run_key, freeze=True)
        request = request_text(
            inp.job.workload,
            inp.job.params,
            inp.job.seed,
            episodes=episodes,
            workspace=WORKSPACE_DIR if files else None,
        )
        labels = {
            EXPERIMENT_LABEL: inp.experiment_id,
            RUN_LABEL: inp.run_key,
            WORLD_LABEL: PREFIX_WORLD,
            BATCH_LABEL: str(inp.chunk.index),
        }
        inputs = {REQUEST_FILE: request.encode(), CHECKPOINTS_FILE: b""}
        result, data, sandbox_id = await self._in_sandbox(
            labels, inp.snapshot_id, inputs, "prefix", allowance, files
        )
        why = _failure(result, allowance) or "the runner wrote no checkpoints"
        if data is None or _failure(result, allowance):
            raise ApplicationError(
                f"the prefix of episodes {inp.chunk.first}..{inp.chunk.stop - 1} failed: {why}",
                type=ExperimentErrorType.prefix_failed,
                non_retryable=True,
            )
        try:
            checkpoints = await self._blocking(
                parse_checkpoints, data, inp.chunk.first, inp.chunk.size
            )
        except FormatError as exc:
            raise ApplicationError(
                f"the prefix runner printed invalid checkpoints: {exc}",
                type=ExperimentErrorType.prefix_failed,
                non_retryable=True,
            ) from None
        evidence = None
        if files is not None:
            data = _with_layer(checkpoints, files)
            evidence = await self._stored(
                result.seconds, self._store.put_bytes, files.evidence().encode()
            )
        digest = await self._stored(result.seconds, self._store.put_bytes, data)
        return PrefixResult(
            chunk=inp.chunk,
            checkpoints_digest=digest,
            workspace_digest=evidence,
            seconds=result.seconds,
            network_isolated=result.network_isolated,
            note=result.note,
            confinement=result.confinement,
            sandbox_id=sandbox_id,
        )

    @activity.defn(name=RUN_WORLD_GROUP.name)
    async def run_world_group(self, inp: BatchInput) -> GroupOutcome:
        """Continue a group of worlds from one chunk's checkpoints in a fresh sandbox, each
        world in a process of its own under its share of the reservation.

        A world whose process crashes, runs past its share or writes garbage fails alone;
        a runner that fails as a whole (a contract broken in what the worlds share, the
        sandbox's limit) fails every world of the group. Failures are returned, not raised:
        they are deterministic and retrying would only spend budget again. A fault of the
        infrastructure raises and is retried.
        """
        names = [w.name for w in inp.worlds]
        allowance = inp.reservation_seconds
        checkpoints = await self._stored(0.0, self._store.get_bytes, inp.checkpoints_digest)
        files = None
        if inp.job.workspace:
            if len(inp.worlds) != 1:
                raise ApplicationError(
                    "a workload with files runs one world per sandbox",
                    type=ExperimentErrorType.bad_group,
                    non_retryable=True,
                )
            parsed = parse_checkpoints(checkpoints, inp.chunk.first, inp.chunk.size)
            files = self._files(True, _layer_of(parsed), inp.run_key, freeze=False)
            assert files is not None
            files.shipped = inp.workspace_digest
            files.expected = {str(cp["episode"]): cp.get("workspace", "") for cp in parsed}
        request = request_text(
            inp.job.workload,
            inp.job.params,
            inp.job.seed,
            worlds=inp.worlds,
            seconds=inp.world_seconds,
            workspace=WORKSPACE_DIR if files else None,
        )
        labels = {
            EXPERIMENT_LABEL: inp.experiment_id,
            RUN_LABEL: inp.run_key,
            WORLD_LABEL: GROUP_JOIN.join(names),
            BATCH_LABEL: str(inp.chunk.index),
        }
        inputs = {CHECKPOINTS_FILE: checkpoints, REQUEST_FILE: request.encode()}
        result, data, sandbox_id = await self._in_sandbox(
            labels, inp.snapshot_id, inputs, "continue", allowance, files
        )
        spent = result.seconds

        def outcome(index: int, seconds: float, **fields: Any) -> BatchOutcome:
            return BatchOutcome(
                world=names[index],
                chunk=inp.chunk,
                seconds=seconds,
                attempts=inp.attempt,
                network_isolated=result.network_isolated,
                note=result.note,
                confinement=result.confinement,
                sandbox_id=sandbox_id,
                **fields,
            )

        def failed(error: str) -> dict[str, Any]:
            return {"status": BatchStatus.failed, "error": error}

        why = _failure(result, allowance)
        if data is None or why:
            why = why or "the runner wrote no output file"
            return _all_failed(names, spent, lambda i, share: outcome(i, share, **failed(why)))
        try:
            outputs = parse_world_outputs(data, inp.chunk.size, len(names))
        except FormatError as exc:
            garbage = f"the runner printed garbage: {exc}"
            return _all_failed(names, spent, lambda i, share: outcome(i, share, **failed(garbage)))
        outcomes = []
        for index, (out, share) in enumerate(
            zip(outputs, _shares([o.seconds for o in outputs], spent), strict=True)
        ):
            if out.columns is None:
                why = _world_failure(out, inp.world_seconds[index])
                outcomes.append(outcome(index, share, **failed(why)))
                continue
            try:
                columns = StoredColumns.model_validate(out.columns)
            except ValueError as exc:
                garbage = f"the runner printed garbage: {exc}"
                outcomes.append(outcome(index, share, **failed(garbage)))
                continue
            put = self._store.put_json
            digest = await self._stored(spent, put, columns.model_dump(mode="json"))
            evidence = None
            if files is not None:
                put_bytes = self._store.put_bytes
                evidence = await self._stored(spent, put_bytes, files.evidence().encode())
            outcomes.append(
                outcome(
                    index,
                    share,
                    status=BatchStatus.completed,
                    columns_digest=digest,
                    workspace_digest=evidence,
                    failures=inp.chunk.size - columns.successes,
                )
            )
        return GroupOutcome(outcomes=outcomes, seconds=spent)

    @activity.defn(name=CLEANUP_SANDBOXES.name)
    async def cleanup_sandboxes(self, inp: CleanupInput) -> CleanupResult:
        """Delete every sandbox labelled with the run; list again until none is left. Then
        collect the workspace layers it no longer needs: housekeeping that never holds up
        the run's end."""
        labels = {RUN_LABEL: inp.run_key}
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
        layers = 0
        if isinstance(self._backend, WorkspaceBackend):
            # The run's workspace layers are needed no longer: unpin them and collect
            # what nothing else holds (a run still going keeps its own pins).
            await self._blocking(self._backend.release_layers, inp.run_key)
            try:
                # ...and on the hosts where it rebuilt layers, once they see its end mark;
                # this host drops the pins of runs that ended elsewhere
                await self._stored(0.0, self._store.mark_ended, inp.run_key)
                ended = await self._stored(0.0, self._backend.release_ended_runs, self._store.ended)
                if ended:
                    activity.logger.info("released the pins of %d ended runs", len(ended))
            except Exception as exc:  # a store outage past its window: housekeeping
                activity.logger.warning("runs that ended on other hosts not checked: %s", exc)
            try:
                layers = len((await self._blocking(self._backend.collect_layers)).removed)
            except (OSError, SandboxError, WorkspaceError) as exc:
                # Collecting is housekeeping: it must not hold up the run's end (the next
                # cleanup, or `forklab layers gc`, collects what is left).
                activity.logger.warning("layer collection failed: %s", exc)
        return CleanupResult(
            found=len(found),
            removed=removed,
            rounds=rounds,
            left=len(left),
            layers_removed=layers,
        )

    def _files(self, wanted: bool, layer: str | None, run_key: str, freeze: bool) -> _Files | None:
        if not wanted:
            return None
        if not isinstance(self._backend, WorkspaceBackend):
            raise ApplicationError(
                f"the workload keeps files, and the {self._backend.name} sandbox backend has no "
                "workspaces; run it on the local backend",
                type=ExperimentErrorType.no_workspaces,
                non_retryable=True,
            )
        return _Files(self._backend, self._store, layer, run_key, freeze)


class _Files:
    """The workspace of one sandbox of a workload with files. ``attach`` mounts it over
    ``layer`` (None: empty) before the runner starts; once the runner succeeded, ``read``
    freezes it into a layer (a prefix: that layer is what every world attaches, pinned for
    the run), takes the manifest of what it holds (the state evidence of the report) and,
    for a prefix, ships every file's bytes to the artifact store.

    Layers live on the worker host that sealed them. A world batch on another host
    rebuilds its chunk's workspace from the prefix's manifest (``shipped``) and those
    bytes, checks every episode's folder against its checkpoint's files digest, and seals
    it as a layer of its own (owned by this host's sandbox uid, so another digest)."""

    def __init__(
        self,
        backend: WorkspaceBackend,
        store: ArtifactStore,
        layer: str | None,
        run_key: str,
        freeze: bool,
        shipped: str | None = None,
        expected: dict[str, str] | None = None,
    ) -> None:
        self.backend = backend
        self.store = store
        self.layer = layer
        self.run_key = run_key
        self.freeze = freeze
        self.shipped = shipped
        self.expected = expected or {}  # episode → its checkpoint's files digest
        self.attached: str | None = None
        self.frozen: str | None = None
        self.folders: dict[str, str] = {}  # episode → digest of its folder, read by the host
        self.manifest: WorkspaceManifest | None = None

    def attach(self, sandbox_id: str) -> None:
        layer = self.layer
        if layer is not None and not self.backend.has_layer(layer) and self.shipped:
            layer = self._rebuild(layer, self.shipped)
        self.backend.attach_workspace(sandbox_id, layer)
        self.attached = layer

    def _rebuild(self, layer: str, shipped: str) -> str:
        evidence = WorkspaceEvidence.model_validate_json(self.store.get_bytes(shipped))
        if evidence.layer != layer:
            raise _world_failed(f"the shipped workspace is of layer {evidence.layer[:12]}")
        with tempfile.TemporaryDirectory(prefix="forklab-layer-") as tmp:
            root = Path(tmp)
            for f in evidence.manifest.files:
                parts = Path(f.path).parts
                if Path(f.path).is_absolute() or ".." in parts:
                    raise _world_failed(f"the shipped workspace names the path {f.path!r}")
                dest = root.joinpath(*parts)
                dest.parent.mkdir(parents=True, exist_ok=True)
                dest.write_bytes(self.store.get_bytes(f.sha256))
            try:
                found = {p.name: folder_digest(p) for p in root.iterdir()}
            except (WorkspaceContentError, OSError) as exc:
                raise _world_failed(f"the shipped workspace cannot be read: {exc}") from None
            if found != self.expected:
                raise _world_failed(
                    "the files shipped for this chunk are not what its checkpoints pin "
                    "(folders, symlinks and modes do not travel between hosts)"
                )
            rebuilt = self.backend.import_workspace(root).digest
        self.backend.pin_layer(self.run_key, rebuilt)
        return rebuilt

    def read(self, sandbox_id: str) -> None:
        """Freeze (a prefix) and read the workspace the runner left. What the workload put
        there that cannot be frozen or read fails the unit (never retried: it would leave
        the same again)."""
        try:
            self._read(sandbox_id)
        except WorkspaceRefusedError as exc:
            raise (_prefix_failed if self.freeze else _world_failed)(str(exc)) from None

    def _read(self, sandbox_id: str) -> None:
        if self.freeze:
            self.frozen = self.backend.freeze_workspace(sandbox_id).digest
            self.backend.pin_layer(self.run_key, self.frozen)
            root = self.backend.workspace_folder(sandbox_id)
            try:
                self.folders = {p.name: folder_digest(p) for p in root.iterdir()}
            except (WorkspaceContentError, OSError) as exc:
                raise _prefix_failed(f"its workspace cannot be pinned: {exc}") from None
        self.manifest = self.backend.workspace_manifest(sandbox_id)
        if self.freeze:
            root = self.backend.workspace_folder(sandbox_id)
            for sha256, path in {f.sha256: f.path for f in self.manifest.files}.items():
                if self.store.put_bytes((root / path).read_bytes()) != sha256:
                    raise _prefix_failed(f"{path} changed while it was being shipped")

    def evidence(self) -> str:
        assert self.manifest is not None
        return WorkspaceEvidence(
            layer=self.frozen or self.attached or "", manifest=self.manifest
        ).model_dump_json()


def _world_failed(why: str) -> ApplicationError:
    return ApplicationError(
        f"the world's workspace: {why}",
        type=ExperimentErrorType.workspace_unavailable,
        non_retryable=True,
    )


def _prefix_failed(why: str) -> ApplicationError:
    return ApplicationError(
        f"the prefix runner's workspace: {why}",
        type=ExperimentErrorType.prefix_failed,
        non_retryable=True,
    )


def _with_layer(checkpoints: list[Checkpoint], files: _Files) -> bytes:
    """The checkpoint lines with the layer the prefix's workspace was frozen into, after
    checking every episode's files digest against what the host itself read there."""
    assert files.frozen is not None
    expected = {str(cp["episode"]) for cp in checkpoints}
    if set(files.folders) != expected:
        extra = sorted(set(files.folders) ^ expected)
        raise _prefix_failed(f"it holds {extra[:3]} besides one folder per episode")
    lines = []
    for cp in checkpoints:
        if cp.get("workspace") != files.folders[str(cp["episode"])]:
            raise _prefix_failed(
                f"episode {cp['episode']}'s files are not what its checkpoint says"
            )
        lines.append(checkpoint_line({**cp, "layer": files.frozen}))
    return "".join(lines).encode()


def _layer_of(checkpoints: list[Checkpoint]) -> str:
    layers = {cp.get("layer") for cp in checkpoints}
    if len(layers) != 1 or None in layers:
        raise ApplicationError(
            "the chunk's checkpoints do not name one workspace layer; run the prefix again",
            type=ExperimentErrorType.prefix_failed,
            non_retryable=True,
        )
    (layer,) = layers
    assert layer is not None
    return layer


def _all_failed(
    names: list[str], spent: float, make: Callable[[int, float], BatchOutcome]
) -> GroupOutcome:
    """Every world of the group failed as one: each is charged an equal share."""
    share = spent / len(names)
    return GroupOutcome(outcomes=[make(i, share) for i in range(len(names))], seconds=spent)


def _shares(reported: list[float], spent: float) -> list[float]:
    """The sandbox's ``spent`` seconds split over its worlds in proportion to what the box
    reported each ran (the box is not trusted with the total, only with its split)."""
    total = sum(reported)
    if total <= 0:
        return [spent / len(reported)] * len(reported)
    return [spent * r / total for r in reported]


def _world_failure(out: WorldOutput, allowance: float) -> str:
    if out.timed_out:
        return f"the world exceeded its budget reservation of {allowance:.1f} s and was killed"
    if out.contract:
        return _tail(out.error or "", 1000)  # the workload broke its contract: its sentence
    return f"the world's process failed: {_tail(out.error or '')}"


def _failure(result: ExecResult, allowance: float) -> str:
    if result.timed_out:
        return f"the runner exceeded its budget reservation of {allowance:.1f} s and was killed"
    if result.exit_code == CONTRACT_EXIT:
        return _tail(result.stderr, 1000)  # the workload broke its contract: its sentence
    if result.exit_code != 0:
        return f"the runner exited with code {result.exit_code}: {_tail(result.stderr)}"
    return ""
