"""Local sandboxes: one confined process per command, with a scratch folder per sandbox.

Layout under ``root``::

    snapshots/<code digest>/   the bundle files, copied once, read-only, re-verified on use
    registry/<id>.json         labels, limits and the running pid; written BEFORE the folder
    boxes/<id>/                the sandbox's scratch folder: uploads and what the command writes
    bytecode/<pid>-<token>/    each snapshot's modules compiled by worker process <pid>
                               (``bytecode.py``), mounted read-only in its boxes
    registry.lock              serialises registry updates across threads and processes

How a command is confined (see ``jail.py``, ``launch.py`` and docs/sandboxes.md): inside
bubblewrap, it sees its snapshot read-only at ``/code``, its scratch folder at ``/work``,
the system read-only and nothing else; it has its own PID and network namespaces, a
cleared environment, rlimits on memory, CPU, processes, file size and open files, its own
uid when the worker is root, a wall-clock timeout, and it dies with the worker. On a host
without a working bwrap the command runs as a confined process instead (its own session,
a private network namespace when permitted, the same rlimits and uid) and every result
says so, with what that fallback does not protect.
"""

from __future__ import annotations

import fcntl
import os
import re
import secrets
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from datetime import UTC, datetime
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from forklab.activities.experiment.runner_bundle import code_digest
from forklab.activities.files import atomic_write
from forklab.activities.sandbox.base import (
    ExecResult,
    Limits,
    SandboxBackend,
    SandboxError,
    SandboxNotFoundError,
    SnapshotCorruptedError,
    SnapshotInfo,
    WorkspaceRefusedError,
    read_box_file,
)
from forklab.activities.sandbox.bytecode import BytecodeCache, mount_points, pycache_folders
from forklab.activities.sandbox.confine import kill_group, run_confined
from forklab.activities.sandbox.jail import (
    SCRATCH_INSIDE,
    Mount,
    bubblewrap,
    interpreter,
    sandbox_uid,
)
from forklab.activities.sandbox.workspace import (
    ContentRefusedError,
    GcResult,
    LayerCorruptedError,
    LayerInfo,
    WorkspaceError,
    WorkspaceFork,
    WorkspaceInfo,
    Workspaces,
    remove_tree,
    unmount_under,
)
from forklab.experiments.experiment.bundle import BundleFile
from forklab.experiments.workspace import WorkspaceManifest

#: Where a sandbox's workspace appears, relative to its working folder.
WORKSPACE_DIR = "workspace"
SNAPSHOT_PREFIX = "local:"
#: A layer sealed less than this long ago is never collected: between its seal and its
#: pin or mount, nothing refers to it yet.
LAYER_GRACE_SECONDS = 60.0
_ID = re.compile(r"lsb-[0-9a-f]{16}")
_DIGEST = re.compile(r"[0-9a-f]{64}")
#: Where a sandbox sees its snapshot (read-only) under bubblewrap.
CODE_INSIDE = "/code"


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
    uid: int | None = None  # the sandbox's own uid (worker running as root), else None
    deleting: bool = False


def _process_start(pid: int) -> int | None:
    """The process's start time from /proc, or None when no such process exists."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    # Field 22; the command name (field 2) may contain spaces, so split after its ')'.
    return int(stat.rpartition(")")[2].split()[19])


def _stop(entry: RegistryEntry) -> None:
    """Kill the recorded command's process group, unless its pid now names another process."""
    if entry.pid is None:
        return
    start = _process_start(entry.pid)
    if start is None or start == entry.pid_start:
        # Leader gone: members of its group may remain, and the group id cannot have been
        # reused while they exist.
        kill_group(entry.pid)


def snapshot_digest(folder: Path) -> str:
    """The code digest of every file under ``folder`` (an added file changes it too)."""
    files = sorted(p for p in folder.rglob("*") if p.is_file() or p.is_symlink())
    return code_digest([BundleFile(p.relative_to(folder).as_posix(), p) for p in files])


def _freeze(folder: Path) -> None:
    """Make a snapshot read-only on disk (files 0444, folders 0555)."""
    for path in folder.rglob("*"):
        path.chmod(0o555 if path.is_dir() else 0o444)
    folder.chmod(0o555)


def _remove_tree(folder: Path) -> None:
    """Remove a tree, read-only ones (a frozen snapshot) too, even as a non-root user, and
    one a command nested thousands of folders deep (``remove_tree`` flattens it first)."""
    if not folder.exists():
        return
    with suppress(OSError):
        folder.chmod(0o755)
    remove_tree(folder)


def _check_relpath(relpath: str, what: str) -> None:
    parts = Path(relpath).parts
    if not relpath or Path(relpath).is_absolute() or ".." in parts:
        raise SandboxError(
            f"{what} {relpath!r} must be a relative path inside the sandbox without '..'"
        )


class LocalSandboxBackend(SandboxBackend):
    """Sandboxes as confined local processes; see the module docstring."""

    name = "local"

    def __init__(self, root: Path, overlay: bool = True, bytecode: bool = True) -> None:
        self.root = root
        self._snapshots = root / "snapshots"
        self._registry = root / "registry"
        self._boxes = root / "boxes"
        for folder in (self._snapshots, self._registry, self._boxes):
            folder.mkdir(parents=True, exist_ok=True)
        # One unprivileged uid for this backend's boxes when the worker is root (None
        # otherwise): their workspaces belong to it, so a forked child can write what its
        # parent wrote. Another backend root (another worker home) gets another uid.
        self.uid = sandbox_uid(str(root.resolve()))
        # Copy-on-write workspaces; ``overlay=False`` forces the copy fallback.
        self.workspaces = Workspaces(root, overlay=overlay, owner=self.uid)
        # Modules compiled once per snapshot by this process (``bytecode=False``: every
        # box compiles them from source, as the benchmark shows).
        self._bytecode = BytecodeCache(root / "bytecode") if bytecode else None

    @property
    def dies_with_worker(self) -> bool:
        """Whether a box dies with the worker process that runs it (bubblewrap works here);
        without it, a dead worker's command may run on until its wall limit."""
        return bubblewrap()[0] is not None

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
        if final.is_dir() and snapshot_digest(final) != digest:
            # Tampered with since it was made: set it aside and make it again from the bundle.
            aside = self._snapshots / f".corrupt-{digest[:16]}-{secrets.token_hex(4)}"
            with suppress(OSError):
                os.rename(final, aside)
            _remove_tree(aside)
        if not final.is_dir():
            tmp = Path(tempfile.mkdtemp(dir=self._snapshots, prefix=".tmp-"))
            try:
                for f in files:
                    (tmp / f.relpath).parent.mkdir(parents=True, exist_ok=True)
                    shutil.copyfile(f.source, tmp / f.relpath)
                if snapshot_digest(tmp) != digest:
                    raise SandboxError(
                        "the bundle files changed while the snapshot was being prepared; retry"
                    )
                mount_points(tmp)
                _freeze(tmp)
                try:
                    os.rename(tmp, final)  # atomic; fails if another preparer won the race
                except OSError:
                    if not final.is_dir():
                        raise
            finally:
                _remove_tree(tmp)
        return SnapshotInfo(
            id=SNAPSHOT_PREFIX + digest, backend=self.name, code_digest=digest, files=len(files)
        )

    def restore_snapshot(self, snapshot_id: str, files: list[BundleFile]) -> None:
        info = self.prepare_snapshot(files)
        if info.id != snapshot_id:
            raise SandboxError(
                f"the bundle stored for snapshot {snapshot_id} rebuilds as {info.id}; "
                "the artifact store is inconsistent, start the experiment again"
            )

    def _snapshot_dir(self, snapshot_id: str) -> Path:
        """The snapshot's folder, after checking that its files still hash to its id."""
        digest = snapshot_id.removeprefix(SNAPSHOT_PREFIX)
        if not (snapshot_id.startswith(SNAPSHOT_PREFIX) and _DIGEST.fullmatch(digest)):
            raise SandboxError(
                f"snapshot id {snapshot_id!r} is not a local snapshot ('local:' + sha256 hex)"
            )
        folder = self._snapshots / digest
        if not folder.is_dir():
            raise SandboxError(
                f"snapshot {snapshot_id} does not exist under {self._snapshots}; "
                "call prepare_snapshot with the bundle first"
            )
        found = snapshot_digest(folder)
        if found != digest:
            raise SnapshotCorruptedError(
                f"snapshot {snapshot_id} was modified after it was made (its files now hash "
                f"to {found[:16]}); its worlds cannot be trusted, so the run stops here"
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

    def _write(self, entry: RegistryEntry, durable: bool = True) -> None:
        """``durable=False`` for what only a running worker needs (the pid of the command
        running now, the mark of a deletion under way): after the machine went down no
        command runs, and a sandbox's folder is listed with or without its entry."""
        atomic_write(self._entry_path(entry.id), entry.model_dump_json().encode(), durable)

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
        self._snapshot_dir(snapshot_id)  # exists and is intact
        sandbox_id = "lsb-" + secrets.token_hex(8)
        entry = RegistryEntry(
            id=sandbox_id,
            labels=labels,
            snapshot_id=snapshot_id,
            limits=limits,
            created_at=datetime.now(UTC),
            uid=self.uid,
        )
        # Registered first: a crash from here on leaves a listed, deletable sandbox.
        with self._locked():
            self._write(entry)
        try:
            box = self._boxes / sandbox_id
            box.mkdir()
            if entry.uid is not None:
                os.chown(box, entry.uid, entry.uid)
        except BaseException:
            self.delete(sandbox_id)
            raise
        return sandbox_id

    def upload(self, sandbox_id: str, relpath: str, data: bytes) -> None:
        entry, box = self._live(sandbox_id)
        path = self._inside(box, relpath)
        atomic_write(path, data, durable=False)  # a sandbox does not outlive its machine
        if entry.uid is not None:  # the sandbox's own uid may read, replace and remove it
            for made in [path, *path.relative_to(box.resolve()).parents]:
                target = made if made.is_absolute() else box.resolve() / made
                if target != box.resolve():
                    os.chown(target, entry.uid, entry.uid)

    def download(self, sandbox_id: str, relpath: str) -> bytes:
        _, box = self._live(sandbox_id)
        path = self._inside(box, relpath)  # resolved: a link may only lead inside the box
        try:
            return read_box_file(path, follow=True)
        except (FileNotFoundError, IsADirectoryError):
            raise SandboxError(
                f"sandbox {sandbox_id} has no file {relpath!r}; did the command write it?"
            ) from None
        except OSError as exc:
            raise SandboxError(
                f"sandbox {sandbox_id}'s {relpath!r} cannot be read ({exc.strerror})"
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
        code = self._snapshot_dir(entry.snapshot_id)  # re-verified before every use
        command = [str(interpreter()), "-S", "-B", *argv[1:]] if argv[0] == "python" else argv
        mounts = [Mount(code, CODE_INSIDE)]
        # (without bubblewrap the code is not at CODE_INSIDE, where the bytecode says it is)
        if self._bytecode is not None and bubblewrap()[0] is not None:
            digest = entry.snapshot_id.removeprefix(SNAPSHOT_PREFIX)
            bytecode = self._bytecode.folder(digest, code, CODE_INSIDE)
            for cache, rel in pycache_folders(bytecode, code):
                mounts.append(Mount(cache, f"{CODE_INSIDE}/{rel}"))
        try:
            return run_confined(
                command,
                mounts=mounts,
                scratch=box,
                env=self._environment(SCRATCH_INSIDE, CODE_INSIDE),
                fallback_env=self._environment(str(box), str(code)),
                limits=entry.limits,
                uid=entry.uid,
                timeout=timeout,
                on_start=lambda pid: self._track(sandbox_id, pid),
                on_exit=lambda pid: self._untrack(sandbox_id, pid),
            )
        except OSError:
            if not box.is_dir():  # deleted between the check above and now
                raise SandboxNotFoundError(f"sandbox {sandbox_id} was deleted") from None
            raise

    @staticmethod
    def _environment(box: str, code: str) -> dict[str, str]:
        """A clean environment: nothing of the parent's (no secrets, no FORKLAB_*)."""
        return {
            "PATH": "/usr/local/bin:/usr/bin:/bin",
            "HOME": box,
            "TMPDIR": box,
            "PYTHONPATH": code,
            "LC_ALL": "C.UTF-8",
        }

    def _track(self, sandbox_id: str, pid: int) -> None:
        """Record the running pid; if the sandbox is being deleted meanwhile, kill it."""
        with self._locked():
            entry = self._read(sandbox_id)
            if entry is not None and not entry.deleting:
                update = {"pid": pid, "pid_start": _process_start(pid)}
                self._write(entry.model_copy(update=update), durable=False)
                return
        kill_group(pid)

    def _untrack(self, sandbox_id: str, pid: int) -> None:
        with self._locked():
            entry = self._read(sandbox_id)
            if entry is not None and entry.pid == pid and not entry.deleting:
                self._write(entry.model_copy(update={"pid": None, "pid_start": None}), False)

    def delete(self, sandbox_id: str) -> None:
        path = self._entry_path(sandbox_id)
        with self._locked():
            try:
                entry = self._read(sandbox_id)
            except ValueError:  # includes pydantic's ValidationError
                entry = None  # unreadable: nothing to kill, but still removed below
            if entry is not None:
                entry = entry.model_copy(update={"deleting": True})
                self._write(entry, durable=False)
        if entry is not None:
            _stop(entry)
        try:
            self.workspaces.remove(sandbox_id)  # unmounts before the folder goes
        except WorkspaceError as exc:
            raise SandboxError(str(exc)) from None
        # A mount in the box that its workspace's record does not name (the record lost)
        # would keep the folder forever: nothing mounted in a box outlives it.
        try:
            unmount_under(self._boxes / sandbox_id)
        except OSError as exc:
            raise SandboxError(
                f"could not unmount {exc.filename} in sandbox {sandbox_id} ({exc.strerror}); retry"
            ) from None
        _remove_tree(self._boxes / sandbox_id)
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

    def has_layer(self, digest: str) -> bool:
        return (
            _DIGEST.fullmatch(digest) is not None
            and (self.workspaces.layers.root / digest / "seal.json").is_file()
        )

    def attach_workspace(self, sandbox_id: str, layer: str | None) -> WorkspaceInfo:
        """Give the sandbox a workspace at ``<box>/workspace`` over ``layer`` (verified
        first; None: empty). Its writes go to its own upper layer."""
        _, box = self._live(sandbox_id)
        try:
            return self.workspaces.attach(sandbox_id, box / WORKSPACE_DIR, layer)
        except LayerCorruptedError as exc:
            raise SnapshotCorruptedError(
                f"workspace {exc}; the worlds forked from it cannot be trusted, so the run "
                "stops here"
            ) from None
        except WorkspaceError as exc:
            raise SandboxError(str(exc)) from None

    def pin_layer(self, run_key: str, digest: str) -> None:
        """Keep ``digest`` (and what it sits on) until the run ``run_key`` releases it."""
        try:
            self.workspaces.pin(run_key, digest)
        except WorkspaceError as exc:
            raise SandboxError(str(exc)) from None

    def release_layers(self, run_key: str) -> None:
        self.workspaces.release(run_key)

    def release_ended_runs(self, ended: Callable[[Sequence[str]], set[str]]) -> Sequence[str]:
        """Drop the pins of the runs that have ended elsewhere (``Workspaces.release_ended``):
        a run's cleanup releases the pins of the host it runs on only."""
        return self.workspaces.release_ended(ended)

    def collect_layers(self, min_age_seconds: float = LAYER_GRACE_SECONDS) -> GcResult:
        """Remove the layers no run pins and no workspace sits on (``Workspaces.gc``)."""
        return self.workspaces.gc(min_age_seconds)

    def workspace_folder(self, sandbox_id: str) -> Path:
        """The host folder where the sandbox's workspace is mounted (or copied)."""
        self._live(sandbox_id)
        try:
            return Path(self.workspaces.info(sandbox_id).target)
        except WorkspaceError as exc:
            raise SandboxError(str(exc)) from None

    def freeze_workspace(self, sandbox_id: str) -> LayerInfo:
        """Seal the sandbox's workspace as it is now (nothing may be running in it)."""
        self._live(sandbox_id)
        try:
            return self.workspaces.freeze(sandbox_id)
        except WorkspaceError as exc:
            raise _sandbox_error(exc) from None

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
                raise _sandbox_error(exc) from None
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
            raise _sandbox_error(exc) from None


def _sandbox_error(exc: WorkspaceError) -> SandboxError:
    """The backend's error for a workspace's: refused content keeps its own type."""
    if isinstance(exc, ContentRefusedError):
        return WorkspaceRefusedError(f"sandbox workspace: {exc}")
    return SandboxError(str(exc))
