"""The sandbox interface every backend implements (local processes, Daytona).

The orchestrator codes against :class:`SandboxBackend` only: it prepares one snapshot per
experiment, creates a labelled sandbox per world batch, uploads the inputs, runs the
runner, downloads the result, and deletes — then lists by label until nothing is left.
"""

from __future__ import annotations

import errno
import os
import re
import stat
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field

from forklab.activities.sandbox.workspace import GcResult, LayerInfo, WorkspaceInfo
from forklab.experiments.experiment.bundle import BundleFile
from forklab.experiments.workspace import WorkspaceManifest


def read_box_file(path: Path, follow: bool = False) -> bytes:
    """A file a box wrote, read only if it is a regular file: a FIFO put in its place would
    block the reading worker thread for ever (the box has exited, so its wall limit no
    longer stops anything), a device could stream without end. A symlink is refused
    unless ``follow`` (the caller then checked where it leads); ``OSError`` otherwise."""
    flags = os.O_RDONLY | os.O_NONBLOCK | (0 if follow else os.O_NOFOLLOW)
    fd = os.open(path, flags)
    with os.fdopen(fd, "rb") as fh:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, "not a regular file", str(path))
        return fh.read()


class SandboxError(RuntimeError):
    """A sandbox operation failed; the message says what and how to fix it."""


class SandboxNotFoundError(SandboxError):
    """The sandbox id is unknown to the backend (never created, or already deleted)."""


class WorkspaceRefusedError(SandboxError):
    """What the sandbox left in its workspace cannot be frozen or read (a special file, a
    path too long or not one printable line, the folder replaced by a link): the
    workload's doing, so the unit fails instead of being tried again."""


class SnapshotCorruptedError(SandboxError):
    """A snapshot's files no longer hash to its id: it must not be used (never retried)."""


class Limits(BaseModel):
    """Per-sandbox resource limits, applied to every process the sandbox runs."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    memory_mb: int = Field(512, ge=16)
    cpu_seconds: int = Field(600, ge=1)
    open_files: int = Field(256, ge=8)
    wall_seconds: float = Field(900.0, gt=0)
    processes: int = Field(64, ge=4)  # processes and threads, all of the sandbox's together
    file_mb: int = Field(256, ge=1)  # the largest file a command may write


_DIGEST = re.compile(r"[0-9a-f]{64}")


def snapshot_code_digest(snapshot_id: str) -> str:
    """The code digest every backend's snapshot id ends with (``local:<digest>``,
    ``daytona:<Daytona snapshot id>:<digest>``): the name under which the snapshot's
    bundle manifest travels through the artifact store."""
    digest = snapshot_id.rpartition(":")[2]
    if ":" not in snapshot_id or not _DIGEST.fullmatch(digest):
        raise SandboxError(
            f"snapshot id {snapshot_id!r} does not end with ':' and a sha256 code digest"
        )
    return digest


class SnapshotInfo(BaseModel):
    """The image worlds start from; for local sandboxes ``id`` is ``"local:" + code_digest``."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    id: str
    backend: str
    code_digest: str
    files: int


class ExecResult(BaseModel):
    """What one command did inside a sandbox. ``stdout``/``stderr`` are bounded: when a
    stream was longer, its head and tail are kept around a marker saying how much was cut."""

    model_config = ConfigDict(extra="forbid")

    exit_code: int  # negative: killed by that signal (as in ``subprocess``)
    stdout: str
    stderr: str
    timed_out: bool
    network_isolated: bool  # False when the private network namespace was not permitted
    note: str | None = None  # e.g. why network isolation fell back
    confinement: str  # "bubblewrap", or "process" on a host without it (see ``note``)
    seconds: float  # wall-clock seconds the command ran


class SandboxBackend(Protocol):
    name: str

    def prepare_snapshot(self, files: list[BundleFile]) -> SnapshotInfo:
        """Make ``files`` available as a snapshot; idempotent (same files → same id)."""
        ...

    def restore_snapshot(self, snapshot_id: str, files: list[BundleFile]) -> None:
        """Make ``snapshot_id``, prepared by another worker, usable here from its bundle
        ``files`` (fetched from the artifact store). Raises ``SandboxError`` unless the
        files make exactly that snapshot; never re-resolves anything by name."""
        ...

    def create(self, snapshot_id: str, labels: dict[str, str], limits: Limits) -> str:
        """A fresh sandbox whose working folder holds the snapshot's files; returns its id."""
        ...

    def upload(self, sandbox_id: str, relpath: str, data: bytes) -> None: ...

    def exec(self, sandbox_id: str, argv: list[str], timeout: float) -> ExecResult:
        """Run ``argv`` in the sandbox folder; ``argv[0] == "python"`` means the backend's
        isolated interpreter."""
        ...

    def download(self, sandbox_id: str, relpath: str) -> bytes: ...

    def delete(self, sandbox_id: str) -> None:
        """Kill anything still running in the sandbox and remove it; idempotent."""
        ...

    def list(self, labels: dict[str, str]) -> list[str]:
        """Ids whose labels include every given pair, reconciled with what actually exists,
        so that leftovers of a crash are listed (and can be deleted) too."""
        ...


@runtime_checkable
class WorkspaceBackend(Protocol):
    """A backend whose sandboxes can have copy-on-write workspaces (the local one): what
    the durable path needs to run a workload with files (``Workload.has_workspace``)."""

    def attach_workspace(self, sandbox_id: str, layer: str | None) -> WorkspaceInfo:
        """A workspace over ``layer`` (verified first; a tampered one raises
        ``SnapshotCorruptedError``) at ``workspace/`` in the sandbox's folder."""
        ...

    def freeze_workspace(self, sandbox_id: str) -> LayerInfo: ...

    def has_layer(self, digest: str) -> bool:
        """Whether this host's layer store holds ``digest`` (sealed; not verified here)."""
        ...

    def import_workspace(self, folder: Path) -> LayerInfo: ...

    def workspace_manifest(self, sandbox_id: str) -> WorkspaceManifest: ...

    def workspace_folder(self, sandbox_id: str) -> Path: ...

    def pin_layer(self, run_key: str, digest: str) -> None:
        """Keep ``digest`` (and the layers below it) until ``release_layers(run_key)``."""
        ...

    def release_layers(self, run_key: str) -> None: ...

    def release_ended_runs(self, ended: Callable[[Sequence[str]], set[str]]) -> Sequence[str]:
        """Drop the pins of the runs ``ended`` (given the names of the runs that pin layers
        here) says have ended; returns their names."""
        ...

    def collect_layers(self) -> GcResult:
        """Remove the layers nothing pins or sits on any more."""
        ...
