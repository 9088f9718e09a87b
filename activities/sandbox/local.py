"""Local sandboxes: one confined process per command, in a fresh folder per sandbox.

Layout under ``root``::

    snapshots/<code digest>/   the bundle files, copied once (immutable once in place)
    registry/<id>.json         labels, limits and the running pid; written BEFORE the folder
    boxes/<id>/                the sandbox's working folder, a copy of its snapshot
    registry.lock              serialises registry updates across threads and processes

How a command is confined (see ``launch.py`` and docs/sandboxes.md): its own session and
process group, a private network namespace when the kernel permits it, rlimits on memory,
CPU time and open files, a wall-clock timeout that kills the whole group, and a clean
environment whose ``PYTHONPATH`` is the sandbox folder alone.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import secrets
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from datetime import UTC, datetime
from pathlib import Path
from typing import IO

from pydantic import BaseModel, ConfigDict

from activities.files import atomic_write
from activities.sandbox.base import (
    ExecResult,
    Limits,
    SandboxBackend,
    SandboxError,
    SandboxNotFoundError,
    SnapshotInfo,
)
from activities.sandbox.workspace import (
    LayerInfo,
    WorkspaceError,
    WorkspaceFork,
    WorkspaceInfo,
    Workspaces,
)
from experiments.bundle import BundleFile, code_digest
from experiments.workspace import WorkspaceManifest

OUTPUT_LIMIT = 64 * 1024  # bytes kept per stream: the first and last half of it
#: Where a sandbox's workspace appears, relative to its working folder.
WORKSPACE_DIR = "workspace"
SNAPSHOT_PREFIX = "local:"
_LAUNCHER = Path(__file__).with_name("launch.py")
_ID = re.compile(r"lsb-[0-9a-f]{16}")
_DIGEST = re.compile(r"[0-9a-f]{64}")
# The interpreter a sandbox gets for "python": no site-packages (so neither the installed
# project nor its dependencies), no bytecode written into the folder.
_PYTHON = [sys.executable, "-S", "-B"]


class RegistryEntry(BaseModel):
    """What the registry remembers about one sandbox, so it can be found and cleaned up
    even after the process that created it died."""

    model_config = ConfigDict(extra="forbid")

    id: str
    labels: dict[str, str]
    snapshot_id: str
    limits: Limits
    created_at: datetime
    pid: int | None = None  # leader of the command running now (its process group id)
    pid_start: int | None = None  # its start time (clock ticks), to tell a reused pid apart
    deleting: bool = False


def _process_start(pid: int) -> int | None:
    """The process's start time from /proc, or None when no such process exists."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    # Field 22; the command name (field 2) may contain spaces, so split after its ')'.
    return int(stat.rpartition(")")[2].split()[19])


def _kill_group(pgid: int) -> None:
    with suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGKILL)


def _stop(entry: RegistryEntry) -> None:
    """Kill the recorded command's process group, unless its pid now names another process."""
    if entry.pid is None:
        return
    start = _process_start(entry.pid)
    if start is None or start == entry.pid_start:
        # Leader gone: members of its group may remain, and the group id cannot have been
        # reused while they exist.
        _kill_group(entry.pid)


def _bounded(stream: IO[bytes]) -> str:
    size = stream.seek(0, os.SEEK_END)
    stream.seek(0)
    if size <= OUTPUT_LIMIT:
        return stream.read().decode(errors="replace")
    half = OUTPUT_LIMIT // 2
    head = stream.read(half)
    stream.seek(size - half)
    tail = stream.read()
    cut = size - 2 * half
    return f"{head.decode(errors='replace')}\n…[{cut} bytes cut]…\n{tail.decode(errors='replace')}"


def _isolation(status: bytes) -> tuple[bool, str | None]:
    """Read the launcher's report: was the command cut off the network, and if not, why."""
    if not status:
        return False, "the sandbox launcher stopped before the command started"
    reported = json.loads(status)
    if reported["network_isolated"]:
        return True, None
    return False, (
        f"private network namespace not permitted ({reported['note']}); "
        "the command ran on the host network"
    )


def _check_relpath(relpath: str, what: str) -> None:
    parts = Path(relpath).parts
    if not relpath or Path(relpath).is_absolute() or ".." in parts:
        raise SandboxError(
            f"{what} {relpath!r} must be a relative path inside the sandbox without '..'"
        )


class LocalSandboxBackend(SandboxBackend):
    """Sandboxes as confined local processes; see the module docstring."""

    name = "local"

    def __init__(self, root: Path, overlay: bool = True) -> None:
        self.root = root
        self._snapshots = root / "snapshots"
        self._registry = root / "registry"
        self._boxes = root / "boxes"
        for folder in (self._snapshots, self._registry, self._boxes):
            folder.mkdir(parents=True, exist_ok=True)
        # Copy-on-write workspaces; ``overlay=False`` forces the copy fallback.
        self.workspaces = Workspaces(root, overlay=overlay)

    # --- snapshots --------------------------------------------------------------------
    def prepare_snapshot(self, files: list[BundleFile]) -> SnapshotInfo:
        if not files:
            raise SandboxError("prepare_snapshot needs at least one bundle file")
        seen: set[str] = set()
        for f in files:
            _check_relpath(f.relpath, "bundle file")
            if f.relpath in seen:
                raise SandboxError(f"bundle file {f.relpath!r} is listed twice")
            seen.add(f.relpath)
        digest = code_digest(files)
        final = self._snapshots / digest
        if not final.is_dir():
            tmp = Path(tempfile.mkdtemp(dir=self._snapshots, prefix=".tmp-"))
            try:
                for f in files:
                    (tmp / f.relpath).parent.mkdir(parents=True, exist_ok=True)
                    shutil.copyfile(f.source, tmp / f.relpath)
                copied = code_digest([BundleFile(f.relpath, tmp / f.relpath) for f in files])
                if copied != digest:
                    raise SandboxError(
                        "the bundle files changed while the snapshot was being prepared; retry"
                    )
                try:
                    os.rename(tmp, final)  # atomic; fails if another preparer won the race
                except OSError:
                    if not final.is_dir():
                        raise
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
        return SnapshotInfo(
            id=SNAPSHOT_PREFIX + digest, backend=self.name, code_digest=digest, files=len(files)
        )

    def _snapshot_dir(self, snapshot_id: str) -> Path:
        digest = snapshot_id.removeprefix(SNAPSHOT_PREFIX)
        folder = self._snapshots / digest
        if not (snapshot_id.startswith(SNAPSHOT_PREFIX) and _DIGEST.fullmatch(digest)):
            raise SandboxError(
                f"snapshot id {snapshot_id!r} is not a local snapshot ('local:' + sha256 hex)"
            )
        if not folder.is_dir():
            raise SandboxError(
                f"snapshot {snapshot_id} does not exist under {self._snapshots}; "
                "call prepare_snapshot with the bundle first"
            )
        return folder

    # --- registry ---------------------------------------------------------------------
    @contextmanager
    def _locked(self) -> Iterator[None]:
        with (self.root / "registry.lock").open("a") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(fh, fcntl.LOCK_UN)

    def _entry_path(self, sandbox_id: str) -> Path:
        if not _ID.fullmatch(sandbox_id):
            raise SandboxNotFoundError(f"{sandbox_id!r} is not a local sandbox id")
        return self._registry / f"{sandbox_id}.json"

    def _read(self, sandbox_id: str) -> RegistryEntry | None:
        """The entry, or None when absent; an unreadable entry raises ``ValueError``."""
        try:
            text = self._entry_path(sandbox_id).read_text()
        except FileNotFoundError:
            return None
        return RegistryEntry.model_validate_json(text)

    def _write(self, entry: RegistryEntry) -> None:
        atomic_write(self._entry_path(entry.id), entry.model_dump_json().encode())

    def _live(self, sandbox_id: str) -> tuple[RegistryEntry, Path]:
        """The entry and folder of a sandbox that exists and is not being deleted."""
        try:
            entry = self._read(sandbox_id)
        except ValueError:
            raise SandboxError(
                f"the registry entry of sandbox {sandbox_id} is unreadable; delete the sandbox"
            ) from None
        box = self._boxes / sandbox_id
        if entry is None or entry.deleting or not box.is_dir():
            raise SandboxNotFoundError(f"sandbox {sandbox_id} does not exist (or is being deleted)")
        return entry, box

    # --- the interface ------------------------------------------------------------------
    def create(self, snapshot_id: str, labels: dict[str, str], limits: Limits) -> str:
        snapshot = self._snapshot_dir(snapshot_id)
        sandbox_id = "lsb-" + secrets.token_hex(8)
        entry = RegistryEntry(
            id=sandbox_id,
            labels=labels,
            snapshot_id=snapshot_id,
            limits=limits,
            created_at=datetime.now(UTC),
        )
        # Registered first: a crash from here on leaves a listed, deletable sandbox.
        with self._locked():
            self._write(entry)
        try:
            shutil.copytree(snapshot, self._boxes / sandbox_id)
        except BaseException:
            self.delete(sandbox_id)
            raise
        return sandbox_id

    def upload(self, sandbox_id: str, relpath: str, data: bytes) -> None:
        _, box = self._live(sandbox_id)
        atomic_write(self._inside(box, relpath), data)

    def download(self, sandbox_id: str, relpath: str) -> bytes:
        _, box = self._live(sandbox_id)
        path = self._inside(box, relpath)
        try:
            return path.read_bytes()
        except (FileNotFoundError, IsADirectoryError):
            raise SandboxError(
                f"sandbox {sandbox_id} has no file {relpath!r}; did the command write it?"
            ) from None

    @staticmethod
    def _inside(box: Path, relpath: str) -> Path:
        _check_relpath(relpath, "path")
        path = (box / relpath).resolve()
        if not path.is_relative_to(box.resolve()):
            raise SandboxError(f"path {relpath!r} leads outside the sandbox folder")
        return path

    def exec(self, sandbox_id: str, argv: list[str], timeout: float) -> ExecResult:
        if not argv:
            raise SandboxError("exec needs a command: argv is empty")
        entry, box = self._live(sandbox_id)
        limits = entry.limits
        wall = min(timeout, limits.wall_seconds)
        command = [*_PYTHON, *argv[1:]] if argv[0] == "python" else list(argv)
        config = json.dumps(
            {
                "memory_mb": limits.memory_mb,
                "cpu_seconds": limits.cpu_seconds,
                "open_files": limits.open_files,
            }
        )
        with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
            status_r, status_w = os.pipe()  # the launcher reports its confinement here
            started = time.monotonic()
            try:
                proc = subprocess.Popen(
                    [sys.executable, "-I", "-S", str(_LAUNCHER), config, str(status_w), *command],
                    cwd=box,
                    env=self._environment(box),
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=err,
                    pass_fds=(status_w,),
                    start_new_session=True,  # its own process group: killable as a whole
                )
            except OSError:
                os.close(status_r)
                if not box.is_dir():  # deleted between the check above and now
                    raise SandboxNotFoundError(f"sandbox {sandbox_id} was deleted") from None
                raise
            finally:
                os.close(status_w)
            try:
                self._track(sandbox_id, proc.pid)
                timed_out = not self._wait_exit(proc.pid, wall)
            finally:
                # The leader has exited (or must die now) but is not reaped yet, so its group
                # id cannot have been reused: this is the timeout's kill and it also ends
                # whatever the command left running in the background.
                _kill_group(proc.pid)
                exit_code = proc.wait()
                seconds = time.monotonic() - started
                with os.fdopen(status_r, "rb") as status_pipe:
                    status = status_pipe.read()
                self._untrack(sandbox_id, proc.pid)
            isolated, note = _isolation(status)
            return ExecResult(
                exit_code=exit_code,
                stdout=_bounded(out),
                stderr=_bounded(err),
                timed_out=timed_out,
                network_isolated=isolated,
                note=note,
                seconds=round(seconds, 6),
            )

    @staticmethod
    def _environment(box: Path) -> dict[str, str]:
        """A clean environment: nothing of the parent's (no secrets, no FORKLAB_*)."""
        return {
            "PATH": "/usr/local/bin:/usr/bin:/bin",
            "HOME": str(box),
            "TMPDIR": str(box),
            "PYTHONPATH": str(box),
            "LC_ALL": "C.UTF-8",
        }

    @staticmethod
    def _wait_exit(pid: int, seconds: float) -> bool:
        """Wait until ``pid`` exits, without reaping it; False on timeout."""
        pidfd = os.pidfd_open(pid)
        try:
            ready, _, _ = select.select([pidfd], [], [], max(seconds, 0.0))
            return bool(ready)
        finally:
            os.close(pidfd)

    def _track(self, sandbox_id: str, pid: int) -> None:
        """Record the running pid; if the sandbox is being deleted meanwhile, kill it."""
        with self._locked():
            entry = self._read(sandbox_id)
            if entry is not None and not entry.deleting:
                self._write(entry.model_copy(update={"pid": pid, "pid_start": _process_start(pid)}))
                return
        _kill_group(pid)

    def _untrack(self, sandbox_id: str, pid: int) -> None:
        with self._locked():
            entry = self._read(sandbox_id)
            if entry is not None and entry.pid == pid and not entry.deleting:
                self._write(entry.model_copy(update={"pid": None, "pid_start": None}))

    def delete(self, sandbox_id: str) -> None:
        path = self._entry_path(sandbox_id)
        with self._locked():
            try:
                entry = self._read(sandbox_id)
            except ValueError:  # includes pydantic's ValidationError
                entry = None  # unreadable: nothing to kill, but still removed below
            if entry is not None:
                entry = entry.model_copy(update={"deleting": True})
                self._write(entry)
        if entry is not None:
            _stop(entry)
        try:
            self.workspaces.remove(sandbox_id)  # unmounts before the folder goes
        except WorkspaceError as exc:
            raise SandboxError(str(exc)) from None
        shutil.rmtree(self._boxes / sandbox_id, ignore_errors=True)
        if (self._boxes / sandbox_id).exists():
            raise SandboxError(f"could not remove the folder of sandbox {sandbox_id}; retry")
        with self._locked():
            path.unlink(missing_ok=True)

    def list(self, labels: dict[str, str]) -> list[str]:
        """Registered sandboxes whose labels match, plus every leftover the registry cannot
        vouch for (an unreadable entry, a folder without an entry): those belong to no one
        and are listed whatever the labels, so cleanup removes them."""
        found: set[str] = set()
        for path in self._registry.glob("lsb-*.json"):
            sandbox_id = path.stem
            if not _ID.fullmatch(sandbox_id):
                continue
            try:
                entry = self._read(sandbox_id)
            except ValueError:  # includes pydantic's ValidationError
                found.add(sandbox_id)
                continue
            if entry is not None and labels.items() <= entry.labels.items():
                found.add(sandbox_id)
        for box in [*self._boxes.iterdir(), *map(Path, self.workspaces.ids())]:
            if _ID.fullmatch(box.name) and not self._entry_path(box.name).exists():
                found.add(box.name)
        return sorted(found)

    # --- workspaces (copy-on-write; see workspace.py) -----------------------------------
    def import_workspace(self, folder: Path) -> LayerInfo:
        """Seal a copy of a host folder as a layer a sandbox's workspace can start from."""
        try:
            return self.workspaces.layers.import_tree(folder, owner=self.workspaces.owner)
        except WorkspaceError as exc:
            raise SandboxError(str(exc)) from None

    def attach_workspace(self, sandbox_id: str, layer: str | None) -> WorkspaceInfo:
        """Give the sandbox a workspace at ``<box>/workspace`` over ``layer`` (verified
        first; None: empty). Its writes go to its own upper layer."""
        _, box = self._live(sandbox_id)
        try:
            return self.workspaces.attach(sandbox_id, box / WORKSPACE_DIR, layer)
        except WorkspaceError as exc:
            raise SandboxError(str(exc)) from None

    def freeze_workspace(self, sandbox_id: str) -> LayerInfo:
        """Seal the sandbox's workspace as it is now (nothing may be running in it)."""
        self._live(sandbox_id)
        try:
            return self.workspaces.freeze(sandbox_id)
        except WorkspaceError as exc:
            raise SandboxError(str(exc)) from None

    def fork(self, sandbox_id: str, children: Sequence[dict[str, str]]) -> WorkspaceFork:
        """Freeze the sandbox's workspace and create one child sandbox per label set, each
        with the parent's snapshot and limits and its own writable layer over the frozen
        one. The parent keeps running on the same content, unchanged."""
        entry, _ = self._live(sandbox_id)
        started = time.perf_counter()
        made: list[str] = []
        try:
            for labels in children:
                made.append(self.create(entry.snapshot_id, labels, entry.limits))
            layer, infos = self.workspaces.fork(
                sandbox_id, [(child, self._boxes / child / WORKSPACE_DIR) for child in made]
            )
        except BaseException as exc:
            for child in made:
                self.delete(child)
            if isinstance(exc, WorkspaceError):
                raise SandboxError(str(exc)) from None
            raise
        return WorkspaceFork(
            parent=sandbox_id,
            layer=layer,
            children=tuple(infos),
            seconds=round(time.perf_counter() - started, 6),
        )

    def workspace_manifest(self, sandbox_id: str) -> WorkspaceManifest:
        """Every file the sandbox's workspace holds now, with size, md5 and sha256."""
        self._live(sandbox_id)
        try:
            return self.workspaces.manifest(sandbox_id)
        except WorkspaceError as exc:
            raise SandboxError(str(exc)) from None
