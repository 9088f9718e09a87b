"""The workspace of an agent run: files that live in sealed, content-addressed layers.

An agent run that declares a workspace keeps one value in its state: the digest of the
layer holding its files (None: empty). Each tool call that touches files is given that
digest; it materialises a copy-on-write workspace over the layer (overlay, copy fallback:
``forklab.activities.sandbox.workspace``), acts, freezes what changed into a new sealed layer and
returns its digest in its result — so the run's history says which layer holds the
workspace after every step, and a fork at step N starts from step N's layer. A call that
changes nothing returns the digest it was given. Nothing stays mounted between calls:
the run's workspace IS its layer digest, and a retried call starts again from the same
layer (content addressing gives a retry that writes the same bytes the same digest).

The layers of every run live under ``<FORKLAB home>/agent-workspaces`` on the worker's
host; a layer is verified (manifest digest, seal) before any call mounts it.

Each call also records the layer it returned as its run's current one
(``run-pins/<sha256 of the workflow id>.json``). A run can be forked at any step while
Temporal keeps its history, so ``forklab layers gc`` keeps, for every run whose history
is retained, every layer that history names and the run's current layer, and every layer
a recorded fork receipt names (with the layers below them); a run's record goes, and its
layers with it, only once its history is gone (:func:`collect_agent_layers`). A call holds
the store's lock shared from mounting its layer until its run's record names the layer it
returned, and the collection holds it exclusive, so the two never interleave.
"""

from __future__ import annotations

import asyncio
import hashlib
import uuid
from collections.abc import Collection
from pathlib import Path, PurePosixPath

from pydantic import BaseModel, ConfigDict, Field
from temporalio import activity
from temporalio.exceptions import ApplicationError

from forklab.activities.files import atomic_write
from forklab.activities.sandbox.workspace import (
    GcResult,
    LayerCorruptedError,
    WorkspaceError,
    Workspaces,
    layer_lock,
)
from forklab.contracts.errors import ForkErrorType

#: The error type of a call whose workspace layer is damaged (it must not be used).
_MAX_FILE_BYTES = 1 << 20


def agent_workspaces_root(home: Path) -> Path:
    return home.expanduser() / "agent-workspaces"


class RunPin(BaseModel):
    """The layer holding run ``workflow_id``'s workspace now (the last one a call of it
    returned): kept, with the layers its history names, while its history is retained."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    workflow_id: str
    layer: str


def _pins(root: Path) -> Path:
    return root / "run-pins"


def _pin_path(root: Path, workflow_id: str) -> Path:
    return _pins(root) / f"{hashlib.sha256(workflow_id.encode()).hexdigest()}.json"


def pin_run(root: Path, pin: RunPin) -> None:
    """Record ``pin`` (replacing the run's earlier one; atomic: a crash leaves either)."""
    atomic_write(_pin_path(root, pin.workflow_id), pin.model_dump_json().encode())


def run_pins(root: Path) -> list[RunPin]:
    """Every run's current layer; an unreadable record (interrupted write) is skipped."""
    folder = _pins(root)
    if not folder.is_dir():
        return []
    pins: list[RunPin] = []
    for path in sorted(folder.glob("*.json")):
        try:
            pins.append(RunPin.model_validate_json(path.read_text()))
        except (OSError, ValueError):
            continue
    return pins


def collect_agent_layers(
    root: Path,
    retained_runs: Collection[str],
    needed: Collection[str],
    min_age_seconds: float,
) -> GcResult:
    """Remove the agent-run layers nothing needs: kept are the current layer of each run in
    ``retained_runs`` (runs whose history Temporal still holds), each of ``needed`` (the
    layers those histories and the fork receipts name), each layer a call has mounted
    right now, and every layer below those; layers sealed less than ``min_age_seconds``
    ago stay too (their call may not have recorded them yet). The records of runs whose
    history is gone are dropped. Holds the store's lock exclusive (the caller should
    hold it already while it reads ``retained_runs`` and ``needed``)."""
    with layer_lock(root).hold(exclusive=True):
        keep = set(needed)
        for pin in run_pins(root):
            if pin.workflow_id in retained_runs:
                keep.add(pin.layer)
            else:
                _pin_path(root, pin.workflow_id).unlink(missing_ok=True)
        return Workspaces(root, overlay=False).gc(min_age_seconds, keep=keep)


class WorkspaceWrite(BaseModel):
    """Write ``content`` to ``path`` in the run's workspace, which is layer ``layer``."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    #: the layer holding the run's workspace before this call (None: empty)
    layer: str | None = None
    path: str = Field(min_length=1, max_length=500)
    content: str = Field(max_length=_MAX_FILE_BYTES)


class WorkspaceStep(BaseModel):
    """The result of a workspace tool call: what it touched, and the layer holding the
    run's workspace after it (``workspace_layer``: the run's checkpoint of its files)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    path: str
    sha256: str
    changed: bool
    #: ``fork_models.WORKSPACE_LAYER_FIELD``: how ``forklab fork`` finds step N's layer
    workspace_layer: str


def _relative(path: str) -> PurePosixPath:
    rel = PurePosixPath(path)
    if rel.is_absolute() or any(part in ("", ".", "..") for part in path.split("/")):
        raise ApplicationError(
            f"workspace path {path!r}: give a relative path without '.', '..' or empty parts",
            type=ForkErrorType.workspace_bad_path,
            non_retryable=True,
        )
    return rel


class WorkspaceTools:
    """File tools of agent runs over the layer store under ``root``. ``overlay=False``
    forces the copy fallback (tests; hosts that forbid mounts)."""

    def __init__(self, root: Path, overlay: bool = True) -> None:
        self.root = root
        self.workspaces = Workspaces(root, overlay=overlay)

    def _write(self, req: WorkspaceWrite, ws_id: str) -> WorkspaceStep:
        rel = _relative(req.path)
        data = req.content.encode()
        sha = hashlib.sha256(data).hexdigest()
        target = self.workspaces.root.parent / "trees" / ws_id
        try:
            self.workspaces.attach(ws_id, target, req.layer)
            try:
                dest = target / rel
                if dest.is_file() and not dest.is_symlink() and dest.read_bytes() == data:
                    base = req.layer if req.layer is not None else self.workspaces.layers.empty()
                    return WorkspaceStep(
                        path=req.path, sha256=sha, changed=False, workspace_layer=base
                    )
                if dest.is_symlink() or (dest.exists() and not dest.is_file()):
                    raise ApplicationError(
                        f"workspace path {req.path!r} exists and is not a regular file",
                        type=ForkErrorType.workspace_bad_path,
                        non_retryable=True,
                    )
                dest.parent.mkdir(parents=True, exist_ok=True)
                dest.write_bytes(data)
                layer = self.workspaces.freeze(ws_id)
            finally:
                self.workspaces.remove(ws_id)
        except LayerCorruptedError as exc:
            raise ApplicationError(
                str(exc), type=ForkErrorType.workspace_layer_corrupted, non_retryable=True
            ) from None
        except WorkspaceError as exc:
            raise ApplicationError(
                str(exc), type=ForkErrorType.workspace_error, non_retryable=True
            ) from None
        return WorkspaceStep(path=req.path, sha256=sha, changed=True, workspace_layer=layer.digest)

    def _write_and_pin(
        self, req: WorkspaceWrite, ws_id: str, workflow_id: str | None
    ) -> WorkspaceStep:
        """``_write``, then record its layer as the run's current one; ``gc`` cannot run in
        between (the layer may be an old one: the call changed nothing, or wrote what an
        earlier call already had)."""
        with self.workspaces.layers.lock.hold():
            step = self._write(req, ws_id)
            pin_run(self.root, RunPin(workflow_id=workflow_id, layer=step.workspace_layer))
        return step

    @activity.defn(name="workspace_write")
    async def write(self, req: WorkspaceWrite) -> WorkspaceStep:
        # one workspace per call attempt: nothing is shared with an earlier attempt
        ws_id = uuid.uuid4().hex
        workflow_id = activity.info().workflow_id
        return await asyncio.to_thread(self._write_and_pin, req, ws_id, workflow_id)
