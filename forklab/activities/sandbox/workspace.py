"""Copy-on-write workspaces: sealed layers, overlay mounts, and the copy fallback.

Layout under ``root``::

    layers/<digest>/t/             the layer's files (an overlayfs lower directory)
    layers/<digest>/manifest.json  its LayerManifest; sha256 of the canonical form == <digest>
    layers/<digest>/seal.json      inode, ctime, size and mode of every path, taken at sealing
    workspaces/<id>/upper, work    a mounted workspace's writable layer and overlayfs scratch
    workspaces/<id>/state.json     which layers it sits on and how it is materialised

A workspace is mounted at a target folder (for a sandbox, ``<box>/workspace``) as
overlayfs: its sealed layers below, read-only, its own ``upper`` on top. Freezing it
unmounts it, seals ``upper`` as a new layer over the old top (only the bytes written since
the last freeze are hashed) and mounts it again over the new stack with an empty upper:
the content is unchanged and the frozen layer can be shared by any number of children,
each with its own upper. Overlayfs never writes to a lower directory, so the parent's
files and every sealed layer stay as they were whatever a child does.

Where the kernel refuses the mount (no ``CAP_SYS_ADMIN``, a filesystem overlayfs cannot
stack on), the workspace is materialised as a copy of its stack instead: reflinks
(``FICLONE``, copy-on-write at block level) where the filesystem has them, full copies
where it does not. Hard links are never used: a child writing in place through a hard
link would change the sealed layer under every sibling. ``WorkspaceInfo.mode`` and
``note`` say which happened.

Verification before use (``verify``) is cheap: the manifest is re-hashed and must give
the layer's digest, and every path is ``lstat``-ed and must match the seal (same set of
paths, inode, size, mode and ctime). Any write, truncation, chmod, rename, addition or
removal in the layer since sealing changes a ctime or the set of paths, and ctime cannot
be set from user space (only by changing the system clock). ``verify(full=True)`` also
re-hashes every file's content.

Collecting unused layers (``Workspaces.gc``) is safe against a fork, attach, pin or seal
made at the same moment on the same host: those take the store's lock (``LayerLock``,
``flock`` on ``<root>/layers.lock``) shared, from the moment they look at a layer until
their reference to it is on disk (a workspace's ``state.json``, a pin); ``gc`` takes it
exclusive for its mark and sweep. So gc either sees the reference, or the operation runs
after the sweep and finds the layer gone (a clear error, nothing half-made), never in
between. The kernel drops the lock of a process that dies, so a crashed holder cannot
block the store.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import errno
import fcntl
import functools
import hashlib
import os
import re
import shutil
import stat
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Sequence
from contextvars import ContextVar
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, ValidationError

from forklab.activities.stores.artifacts import run_name
from forklab.experiments.workspace import (
    EntryKind,
    FileRecord,
    LayerEntry,
    LayerManifest,
    WorkspaceManifest,
)
from forklab.runtime.files import WorkspaceContentError, check_folder, check_path

Mode = Literal["overlay", "reflink", "copy"]
_FICLONE = 0x40049409
_MNT_DETACH = 2
#: mount(2) flags of a workspace: what a sandbox leaves there (a setuid file of its own
#: uid, a device node) never acts as such on the host, whoever reaches the mount.
_MS_NOSUID, _MS_NODEV = 2, 4
_OPAQUE_XATTR = "trusted.overlay.opaque"
#: The legacy mount(2) call takes its options in one page.
_OPTIONS_LIMIT = 4000
_CHUNK = 1 << 20


class WorkspaceError(RuntimeError):
    """A workspace or layer operation failed; the message says what and how to fix it."""


class LayerCorruptedError(WorkspaceError):
    """A sealed layer no longer matches its digest or its seal: it must not be used."""


class ContentRefusedError(WorkspaceError):
    """What a sandbox left in its workspace cannot be frozen or read safely (a special
    file, a path too long or not one printable line, the workspace folder replaced by a
    link): the workload's doing, so trying again would not help."""


class LayerInfo(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    digest: str
    parent: str | None
    files: int
    bytes: int  # bytes of regular files in this layer alone
    hashed_bytes: int  # bytes read to seal it (0 when it already existed)
    seconds: float


class WorkspaceInfo(BaseModel):
    """How one workspace is materialised: ``overlay`` (copy-on-write mount), ``reflink``
    (a block-sharing copy) or ``copy`` (a full copy); ``note`` says why overlay was not
    used. ``stack`` lists its sealed layers, top first."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    id: str
    target: str
    mode: Mode
    stack: tuple[str, ...]
    note: str | None = None


class _Seal(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    stats: dict[str, tuple[int, int, int, int]]  # path -> (inode, ctime_ns, size, mode)


@functools.cache
def _libc() -> ctypes.CDLL:
    """The C library, loaded once (loading it builds a class: about a millisecond)."""
    return ctypes.CDLL(None, use_errno=True)


def _mount_overlay(lowers: list[Path], upper: Path, work: Path, target: Path) -> None:
    # ``volatile``: no sync of the upper filesystem at unmount (on a busy disk that sync
    # took hundreds of milliseconds per freeze). A sealed layer is therefore not fsynced;
    # after a host crash ``LayerStore.verify(full=True)`` tells whether it survived.
    options = f"lowerdir={':'.join(map(str, lowers))},upperdir={upper},workdir={work},volatile"
    if len(options) > _OPTIONS_LIMIT:
        raise WorkspaceError(
            f"the workspace stack of {len(lowers)} layers is too deep to mount under {target}; "
            "use a shorter sandbox root or fork from an earlier layer"
        )
    flags = _MS_NOSUID | _MS_NODEV
    if _libc().mount(b"overlay", str(target).encode(), b"overlay", flags, options.encode()) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err), str(target))


def _unmount(target: Path, detach: bool = True) -> None:
    """Unmount ``target``; without ``detach`` a mount still in use fails (``EBUSY``)."""
    if _libc().umount2(str(target).encode(), _MNT_DETACH if detach else 0) != 0:
        err = ctypes.get_errno()
        if err not in (errno.EINVAL, errno.ENOENT):  # not a mount point (any more)
            raise OSError(err, os.strerror(err), str(target))


_OCTAL = re.compile(rb"\\([0-7]{3})")


def mount_point(field: bytes) -> str:
    """A mount point as ``/proc/self/mountinfo`` writes it: the path's own bytes (UTF-8 or
    whatever the file system holds) with space, tab, newline and backslash as octal
    escapes (``\\040``), decoded as the file system's names are (``os.fsdecode``)."""
    return os.fsdecode(_OCTAL.sub(lambda m: bytes([int(m.group(1), 8)]), field))


def mounts_under(folder: Path) -> list[Path]:
    """Mount points at or below ``folder``, deepest first (from /proc/self/mountinfo)."""
    base = os.path.realpath(folder)
    found: list[Path] = []
    for line in Path("/proc/self/mountinfo").read_bytes().splitlines():
        point = mount_point(line.split()[4])
        if point == base or point.startswith(base + "/"):
            found.append(Path(point))
    return sorted(found, key=lambda p: len(p.parts), reverse=True)


def unmount_under(folder: Path) -> None:
    """Detach every mount at or below ``folder``: a box's delete (whatever its workspace's
    record says) and tests' teardown."""
    for point in mounts_under(folder):
        _unmount(point)


def _hash_file(path: Path, *algorithms: str) -> list[str]:
    hashers = [hashlib.new(a) for a in algorithms]
    with path.open("rb") as fh:
        while chunk := fh.read(_CHUNK):
            for h in hashers:
                h.update(chunk)
    return [h.hexdigest() for h in hashers]


def _walk(tree: Path) -> Iterator[tuple[str, Path]]:
    """(relative path, absolute path) of everything under ``tree``, parents first, sorted."""
    stack = [("", str(tree))]
    while stack:
        rel, folder = stack.pop()
        with os.scandir(folder) as it:
            entries = sorted(it, key=lambda e: e.name)
        below = []
        for e in entries:
            child = f"{rel}{e.name}"
            yield child, Path(e.path)
            if e.is_dir(follow_symlinks=False):
                below.append((child + "/", e.path))
        stack.extend(reversed(below))


#: The most paths one freeze or manifest walks. The worker holds an entry per path (about
#: 1.6 KiB each: 100,001 empty files peaked at 259 MiB), and a sandbox can make empty
#: files without filling its disk quota; past this the workspace is refused, before the
#: worker (and every other run's activities on it) runs out of memory.
MAX_LAYER_ENTRIES = 500_000


def _checked_walk(tree: Path, limit: int = MAX_LAYER_ENTRIES) -> Iterator[tuple[str, Path]]:
    """``_walk`` of a tree a sandbox wrote: ``tree`` must be a real folder (a link would
    lead the worker to host files), every path must pass ``check_path`` before the walk
    goes below it (a tree nested thousands deep is refused before its paths get too long
    for the host to reach), and there are at most ``limit`` paths."""
    try:
        check_folder(tree)
        for count, (rel, path) in enumerate(_walk(tree), start=1):
            if count > limit:
                raise ContentRefusedError(
                    f"workspace holds more than {limit:,} paths; keep fewer files in it "
                    "(a build's output or a cache can live outside the workspace)"
                )
            check_path(rel)
            yield rel, path
    except WorkspaceContentError as exc:
        raise ContentRefusedError(str(exc)) from None


def _is_opaque(path: Path) -> bool:
    try:
        return os.getxattr(path, _OPAQUE_XATTR, follow_symlinks=False) == b"y"
    except OSError:
        return False


def _entry(
    rel: str, path: Path, st: os.stat_result, whiteouts: bool = True
) -> tuple[LayerEntry, int]:
    """The manifest entry of one path and the bytes read to make it. ``whiteouts=False``
    (a copied workspace, which is a whole tree: overlayfs made none of its files) refuses
    a whiteout like any other special file."""
    mode = stat.S_IMODE(st.st_mode)
    who = {"uid": st.st_uid, "gid": st.st_gid}
    if stat.S_ISREG(st.st_mode):
        if st.st_nlink > 1:
            st = _unshare(path, st)
        (sha,) = _hash_file(path, "sha256")
        entry = LayerEntry(
            path=rel, kind=EntryKind.file, mode=mode, size=st.st_size, sha256=sha, **who
        )
        return entry, st.st_size
    if stat.S_ISDIR(st.st_mode):
        return LayerEntry(
            path=rel, kind=EntryKind.dir, mode=mode, opaque=_is_opaque(path), **who
        ), 0
    if stat.S_ISLNK(st.st_mode):
        return LayerEntry(
            path=rel, kind=EntryKind.symlink, mode=0, target=os.readlink(path), **who
        ), 0
    if stat.S_ISCHR(st.st_mode) and st.st_rdev == 0 and whiteouts:
        return LayerEntry(path=rel, kind=EntryKind.whiteout, mode=0, **who), 0
    raise ContentRefusedError(
        f"workspace path {rel!r} is a {stat.filemode(st.st_mode)[0]!r}-type special file; "
        "a workspace may hold only files, folders and symlinks"
    )


def _unshare(path: Path, st: os.stat_result) -> os.stat_result:
    """Give a file that has other hard links an inode of its own, with the same bytes,
    mode and owner. Sealed as it was, the layer's file would stay writable through a link
    its sandbox kept outside the workspace (the copy fallback moves the folder itself into
    the store): writes there would change the layer under every workspace using it."""
    tmp = path.with_name(f".forklab-unshare-{time.monotonic_ns()}")
    shutil.copyfile(path, tmp, follow_symlinks=False)
    os.chown(tmp, st.st_uid, st.st_gid)
    os.chmod(tmp, stat.S_IMODE(st.st_mode))  # after chown, which clears setuid bits
    os.utime(tmp, ns=(st.st_atime_ns, st.st_mtime_ns))
    os.replace(tmp, path)
    return os.lstat(path)


def remove_tree(folder: Path) -> None:
    """Delete ``folder`` and everything below it, however deep (``shutil.rmtree`` recurses
    once per level and raises ``RecursionError`` on a tree a sandbox nested thousands of
    folders deep); a missing folder is fine."""
    with contextlib.suppress(FileNotFoundError, NotADirectoryError):
        _flatten(folder)
    if folder.is_symlink():
        folder.unlink()
    else:
        shutil.rmtree(folder, ignore_errors=True)


def _flatten(folder: Path) -> None:
    """Move every folder below ``folder`` up to ``folder`` itself (renames relative to open
    folders: no long path is ever formed), so that nothing is nested more than one deep."""
    top = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    try:
        pending = [e.name for e in os.scandir(top) if e.is_dir(follow_symlinks=False)]
        moved = 0
        while pending:
            name = pending.pop()
            try:
                here = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=top)
            except OSError:
                continue
            try:
                with contextlib.suppress(OSError):
                    os.fchmod(here, 0o700)  # a read-only folder (a non-root worker's case)
                for e in list(os.scandir(here)):
                    if e.is_dir(follow_symlinks=False):
                        moved += 1
                        while _exists(f".flat-{moved}", top):  # the tree's own names
                            moved += 1
                        os.rename(e.name, f".flat-{moved}", src_dir_fd=here, dst_dir_fd=top)
                        pending.append(f".flat-{moved}")
            finally:
                os.close(here)
    finally:
        os.close(top)


def _exists(name: str, folder_fd: int) -> bool:
    try:
        os.lstat(name, dir_fd=folder_fd)
    except FileNotFoundError:
        return False
    return True


def _stats(tree: Path) -> dict[str, tuple[int, int, int, int]]:
    stats: dict[str, tuple[int, int, int, int]] = {}
    for rel, path in _walk(tree):
        st = os.lstat(path)
        # overlayfs makes every whiteout a hard link to one inode in its work folder, whose
        # link count (and so ctime) moves when that folder goes. A whiteout has no content;
        # its inode, type and mode are still sealed.
        whiteout = stat.S_ISCHR(st.st_mode) and st.st_rdev == 0
        stats[rel] = (st.st_ino, 0 if whiteout else st.st_ctime_ns, st.st_size, st.st_mode)
    return stats


#: The store locks this thread or task holds (lock file → exclusive?): a nested hold (a
#: fork's freeze and attaches; an attach's seal of the empty layer) takes the lock once.
_HELD: ContextVar[dict[str, bool]] = ContextVar("forklab_layer_locks", default={})  # noqa: B039


def _flock(path: Path, exclusive: bool) -> int:
    """Open ``path`` and wait for its lock; the open file (to close) holds it."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _close_when_acquired(waiting: asyncio.Future[int]) -> None:
    """Release a lock whose waiter was cancelled, as soon as it is acquired."""
    if not waiting.cancelled() and waiting.exception() is None:
        os.close(waiting.result())


class LayerLock:
    """The lock of one layer store: shared while an operation starts referencing a layer
    (from checking it exists to recording the reference), exclusive while ``gc`` marks and
    sweeps. ``flock`` on a lock file: whoever dies, the kernel releases its hold."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def _nested(self, exclusive: bool) -> bool:
        """True when this thread or task holds the lock already (no second hold)."""
        held = _HELD.get().get(str(self.path))
        if held is None:
            return False
        if exclusive and not held:  # waiting for ourselves would never end
            raise WorkspaceError(f"{self.path}: exclusive hold asked under a shared one")
        return True

    @contextlib.contextmanager
    def _held(self, fd: int, exclusive: bool) -> Iterator[None]:
        """Mark the lock held by this thread or task while ``fd`` holds it; close it after."""
        token = _HELD.set({**_HELD.get(), str(self.path): exclusive})
        try:
            yield
        finally:
            _HELD.reset(token)
            os.close(fd)

    @contextlib.contextmanager
    def hold(self, exclusive: bool = False) -> Iterator[None]:
        if self._nested(exclusive):
            yield
            return
        with self._held(_flock(self.path, exclusive), exclusive):
            yield

    @contextlib.asynccontextmanager
    async def hold_async(self, exclusive: bool = False) -> AsyncIterator[None]:
        """``hold`` for async code: the wait runs in a thread, the event loop goes on."""
        if self._nested(exclusive):
            yield
            return
        waiting = asyncio.get_running_loop().run_in_executor(None, _flock, self.path, exclusive)
        try:
            fd = await asyncio.shield(waiting)
        except asyncio.CancelledError:  # the lock comes later: let it go at once
            waiting.add_done_callback(_close_when_acquired)
            raise
        with self._held(fd, exclusive):
            yield


def layer_lock(root: Path) -> LayerLock:
    """The lock of the layer store under ``root`` (what ``Workspaces(root)`` uses)."""
    return LayerLock(root / "layers.lock")


def _identity(path: Path) -> tuple[int, int, int]:
    st = os.stat(path)
    return st.st_ino, st.st_ctime_ns, st.st_size


class LayerStore:
    """Sealed, content-addressed layers under ``root/layers``.

    ``cache``: a layer's manifest (re-hashed to its digest) and seal are read and checked
    once per process and kept, keyed by the identity of the two files (inode, ctime, size):
    replacing or rewriting either changes its ctime, so the check is redone. The walk that
    compares the layer's files with the seal is never cached: it runs on every use.
    ``max_entries``: the most paths a freeze or a manifest walks (``MAX_LAYER_ENTRIES``).
    """

    def __init__(
        self, root: Path, cache: bool = True, max_entries: int = MAX_LAYER_ENTRIES
    ) -> None:
        self.max_entries = max_entries
        self.root = root / "layers"
        self.root.mkdir(parents=True, exist_ok=True)
        os.chmod(self.root, 0o700)  # reachable by the worker's user only
        self.lock = layer_lock(root)
        self.cache = cache
        self._checked: dict[str, tuple[object, LayerManifest, _Seal]] = {}

    def tree(self, digest: str) -> Path:
        return self.root / digest / "t"

    def _check_digest(self, digest: str) -> Path:
        if len(digest) != 64 or any(c not in "0123456789abcdef" for c in digest):
            raise WorkspaceError(f"layer {digest!r} is not a sha256 hex digest")
        folder = self.root / digest
        if not (folder / "seal.json").is_file():
            raise WorkspaceError(f"layer {digest} does not exist under {self.root}")
        return folder

    def manifest(self, digest: str) -> LayerManifest:
        return self._sealed(digest)[0]

    def _sealed(self, digest: str) -> tuple[LayerManifest, _Seal]:
        """The layer's manifest, checked to hash to ``digest``, and its seal."""
        folder = self._check_digest(digest)
        try:
            key = (_identity(folder / "manifest.json"), _identity(folder / "seal.json"))
            hit = self._checked.get(digest) if self.cache else None
            if hit is not None and hit[0] == key:
                return hit[1], hit[2]
            manifest = LayerManifest.model_validate_json((folder / "manifest.json").read_bytes())
            seal = _Seal.model_validate_json((folder / "seal.json").read_bytes())
        except (OSError, ValidationError) as exc:
            raise WorkspaceError(
                f"layer {digest}: manifest or seal unreadable ({exc.__class__.__name__})"
            ) from None
        if manifest.digest() != digest:
            raise LayerCorruptedError(f"layer {digest}: its manifest does not hash to its name")
        if self.cache:
            self._checked[digest] = (key, manifest, seal)
        return manifest, seal

    def verify(self, digest: str, full: bool = False) -> LayerManifest:
        """Check the layer against its manifest and seal (see the module docstring)."""
        manifest, seal = self._sealed(digest)
        now = _stats(self.tree(digest))
        if now != seal.stats or set(now) != {e.path for e in manifest.entries}:
            changed = sorted(
                p for p in now.keys() | seal.stats.keys() if now.get(p) != seal.stats.get(p)
            )
            raise LayerCorruptedError(
                f"layer {digest} was modified after sealing (first difference: "
                f"{changed[0] if changed else 'manifest paths'}); do not use it"
            )
        if full:
            for e in manifest.entries:
                if e.kind is EntryKind.file:
                    (sha,) = _hash_file(self.tree(digest) / e.path, "sha256")
                    if sha != e.sha256:
                        raise LayerCorruptedError(f"layer {digest}: content of {e.path!r} changed")
        return manifest

    def stack(self, digest: str) -> list[str]:
        """The layer and all below it, top first, each verified."""
        chain: list[str] = []
        current: str | None = digest
        while current is not None:
            chain.append(current)
            current = self.verify(current).parent
        return chain

    def seal(self, staging: Path, parent: str | None, whiteouts: bool = True) -> LayerInfo:
        """Move ``staging`` (a folder on the same filesystem) into the store as a layer over
        ``parent``. The folder is consumed; an identical layer already stored is reused,
        and counts as sealed now for ``gc``'s grace period (its caller is about to pin or
        mount it). ``whiteouts=False``: a whiteout in it is refused (a copied tree)."""
        with self.lock.hold():
            return self._seal(staging, parent, whiteouts)

    def _seal(self, staging: Path, parent: str | None, whiteouts: bool = True) -> LayerInfo:
        started = time.perf_counter()
        entries: list[LayerEntry] = []
        hashed = 0
        for rel, path in _checked_walk(staging, self.max_entries):
            entry, read = _entry(rel, path, os.lstat(path), whiteouts)
            entries.append(entry)
            hashed += read
        manifest = LayerManifest(parent=parent, entries=tuple(entries))
        digest = manifest.digest()
        text = manifest.model_dump_json()  # before ``staging`` is moved: nothing to undo
        final = self.root / digest
        if (final / "seal.json").is_file():
            try:
                self.verify(digest)
            except WorkspaceError:  # a damaged copy: set it aside, the fresh one replaces it
                os.rename(final, self.root / f".damaged-{digest}-{time.monotonic_ns()}")
        if (final / "seal.json").is_file():
            shutil.rmtree(staging)
            os.utime(final)  # the folder's time is its age for ``gc``
        else:
            box = Path(tempfile.mkdtemp(dir=self.root, prefix=".seal-"))
            try:
                os.rename(staging, box / "t")
                (box / "manifest.json").write_text(text)
                (box / "seal.json").write_text(_Seal(stats=_stats(box / "t")).model_dump_json())
                try:
                    os.rename(box, final)
                except OSError:  # another sealer won the race with the same content
                    if not (final / "seal.json").is_file():
                        raise
            finally:
                shutil.rmtree(box, ignore_errors=True)
        return LayerInfo(
            digest=digest,
            parent=parent,
            files=sum(e.kind is EntryKind.file for e in entries),
            bytes=manifest.bytes,
            hashed_bytes=hashed,
            seconds=round(time.perf_counter() - started, 6),
        )

    def import_tree(
        self, source: Path, parent: str | None = None, owner: int | None = None
    ) -> LayerInfo:
        """Seal a copy of a host folder (the workspace a sandbox starts from); with
        ``owner``, every copied path belongs to that uid and gid."""
        if not source.is_dir():
            raise WorkspaceError(f"workspace folder {source} does not exist or is no folder")
        with self.lock.hold():  # gc takes a staging folder for a leftover otherwise
            staging = Path(tempfile.mkdtemp(dir=self.root, prefix=".import-"))
            try:
                shutil.copytree(source, staging / "t", symlinks=True)
                _chown_tree(staging / "t", owner)
                return self.seal(staging / "t", parent)
            finally:
                shutil.rmtree(staging, ignore_errors=True)

    def empty(self) -> str:
        """The digest of the empty layer (the base of a workspace given no files)."""
        with self.lock.hold():
            staging = Path(tempfile.mkdtemp(dir=self.root, prefix=".empty-"))
            return self.seal(staging, None).digest


def _chown_tree(tree: Path, owner: int | None) -> None:
    """Give ``tree`` and everything below it to ``owner`` (uid and gid); None: leave it."""
    if owner is None:
        return
    os.chown(tree, owner, owner, follow_symlinks=False)
    for _, path in _walk(tree):
        os.chown(path, owner, owner, follow_symlinks=False)


def _clone(source: Path, dest: Path) -> bool:
    """Copy one file, sharing its blocks when the filesystem can; True when it did."""
    with source.open("rb") as src, dest.open("wb") as dst:
        try:
            fcntl.ioctl(dst.fileno(), _FICLONE, src.fileno())
            cloned = True
        except OSError:
            shutil.copyfileobj(src, dst, _CHUNK)
            cloned = False
    shutil.copystat(source, dest)
    return cloned


def _materialise(store: LayerStore, stack: list[str], target: Path) -> bool:
    """Write the union of ``stack`` (top first) into the empty folder ``target``, applying
    whiteouts and opaque folders as overlayfs would. True when every file was reflinked."""
    all_cloned = True
    for digest in reversed(stack):
        tree = store.tree(digest)
        for entry in store.manifest(digest).entries:
            dest = target / entry.path
            if entry.kind is EntryKind.whiteout or (
                dest.is_symlink() or (dest.exists() and entry.kind is not EntryKind.dir)
            ):
                if dest.is_dir() and not dest.is_symlink():
                    shutil.rmtree(dest)
                elif dest.is_symlink() or dest.exists():
                    dest.unlink()
            if entry.kind is EntryKind.dir:
                if entry.opaque and dest.is_dir():
                    shutil.rmtree(dest)
                dest.mkdir(exist_ok=True)
                os.chmod(dest, entry.mode)
            elif entry.kind is EntryKind.symlink:
                os.symlink(entry.target or "", dest)
            elif entry.kind is EntryKind.file:
                all_cloned = _clone(tree / entry.path, dest) and all_cloned
            if entry.kind is not EntryKind.whiteout and os.geteuid() == 0:
                os.chown(dest, entry.uid, entry.gid, follow_symlinks=False)
    return all_cloned


class _State(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    target: str
    mode: Mode
    stack: tuple[str, ...]
    note: str | None = None


def _write_state(folder: Path, state: _State) -> None:
    """Replace ``state.json`` atomically. Not fsynced: after a host crash the mounts are
    gone anyway, and ``remove`` copes with a missing or stale record."""
    tmp = folder / ".state.json.tmp"
    tmp.write_text(state.model_dump_json())
    os.replace(tmp, folder / "state.json")


class Workspaces:
    """Mounted (or copied) workspaces over layers of one ``LayerStore``.

    ``overlay=False`` forces the copy fallback (tests and hosts that forbid mounts);
    ``cache=False`` re-reads and re-hashes every layer's manifest on each use (see
    ``LayerStore``; the benchmark shows both).
    ``owner``: the uid (and gid) sandboxed commands run as when the worker is root; each
    workspace's own layer (and a copy's files) belong to it, so that those commands can
    write. Sealed layers keep the owner of whoever wrote them, which is the same uid.
    """

    def __init__(
        self, root: Path, overlay: bool = True, owner: int | None = None, cache: bool = True
    ) -> None:
        if any(c in str(root.resolve()) for c in ":,\\"):
            raise WorkspaceError(
                f"workspace root {root} contains ':', ',' or '\\', which overlayfs options "
                "cannot carry; choose another folder"
            )
        self.layers = LayerStore(root, cache)
        self.root = root / "workspaces"
        self.root.mkdir(parents=True, exist_ok=True)
        self.overlay = overlay
        self.owner = owner

    def _folder(self, ws_id: str) -> Path:
        return self.root / ws_id

    def _state(self, ws_id: str) -> _State:
        try:
            return _State.model_validate_json((self._folder(ws_id) / "state.json").read_bytes())
        except FileNotFoundError:
            raise WorkspaceError(f"{ws_id} has no workspace; attach one first") from None

    def _info(self, ws_id: str, state: _State) -> WorkspaceInfo:
        return WorkspaceInfo(id=ws_id, **state.model_dump())

    def info(self, ws_id: str) -> WorkspaceInfo:
        return self._info(ws_id, self._state(ws_id))

    def attach(self, ws_id: str, target: Path, base: str | None) -> WorkspaceInfo:
        """Materialise layer ``base`` (and those below it, each verified; None: empty) at
        ``target``."""
        with self.layers.lock.hold():  # from the check until state.json names the stack
            return self._attach(
                ws_id, target, self.layers.stack(base if base is not None else self.layers.empty())
            )

    def _attach(self, ws_id: str, target: Path, stack: list[str]) -> WorkspaceInfo:
        folder = self._folder(ws_id)
        if folder.exists():
            raise WorkspaceError(f"{ws_id} already has a workspace")
        folder.mkdir()
        try:
            state = self._materialise(folder, target, stack)
        except BaseException:
            self.remove(ws_id)
            raise
        return self._info(ws_id, state)

    def _materialise(self, folder: Path, target: Path, stack: list[str]) -> _State:
        target.mkdir(parents=True, exist_ok=True)
        note = None
        if self.overlay:
            for sub in ("upper", "work"):
                (folder / sub).mkdir(exist_ok=True)
            if self.owner is not None:  # the mount's root takes its owner (not what is in it)
                os.chown(folder / "upper", self.owner, self.owner)
            # Recorded before mounting, so that remove() finds (and unmounts) a mount whose
            # worker was killed before it could say so.
            state = _State(target=str(target), mode="overlay", stack=tuple(stack))
            _write_state(folder, state)
            try:
                _mount_overlay(
                    [self.layers.tree(d) for d in stack], folder / "upper", folder / "work", target
                )
                return state
            except OSError as exc:
                note = f"overlay mount not permitted ({exc.strerror}); the workspace was copied"
        else:
            note = "overlay disabled by configuration; the workspace was copied"
        # Recorded before copying, so that remove() finds a half-made copy too.
        pending = _State(target=str(target), mode="copy", stack=tuple(stack), note=note)
        _write_state(folder, pending)
        cloned = _materialise(self.layers, stack, target)
        if self.owner is not None:  # the copy's root, as an overlay's root is its upper's
            os.chown(target, self.owner, self.owner)
        state = pending.model_copy(update={"mode": "reflink" if cloned else "copy"})
        _write_state(folder, state)
        return state

    def freeze(self, ws_id: str) -> LayerInfo:
        """Seal the workspace's current content as a layer; the workspace stays as it was,
        now sitting on that layer. Call it only while nothing runs in the workspace."""
        with self.layers.lock.hold():
            return self._freeze(ws_id)

    def _freeze(self, ws_id: str) -> LayerInfo:
        folder = self._folder(ws_id)
        state = self._state(ws_id)
        target = Path(state.target)
        if state.mode == "overlay":
            try:
                _unmount(target, detach=False)
            except OSError as exc:
                raise WorkspaceError(
                    f"cannot freeze workspace {ws_id}: {exc.strerror}; is a command still "
                    "running in it?"
                ) from None
            try:
                # Set aside, not deleted: deleting a folder is slow on a busy disk, and
                # ``remove`` deletes the workspace's folder anyway.
                os.rename(folder / "work", folder / f"stale-work-{time.monotonic_ns()}")
                layer = self.layers.seal(folder / "upper", parent=state.stack[0])
            except BaseException:
                if (folder / "upper").is_dir():  # not consumed: mount it back as it was
                    self._materialise(folder, target, list(state.stack))
                raise
        else:
            # A copy has no record of what changed: the whole tree becomes one layer. It is
            # moved into the store and copied back for the parent.
            layer = self._freeze_copy(target)
        # The new layer's seal was taken from its files a moment ago; what it sits on is
        # verified again, as before any use.
        below = self.layers.stack(layer.parent) if layer.parent is not None else []
        self._materialise(folder, target, [layer.digest, *below])
        return layer

    def _freeze_copy(self, target: Path) -> LayerInfo:
        """Seal a copied workspace's whole tree; on failure its folder is put back."""
        try:
            check_folder(target)
        except WorkspaceContentError as exc:
            raise ContentRefusedError(str(exc)) from None
        staging = Path(tempfile.mkdtemp(dir=self.layers.root, prefix=".freeze-"))
        os.rename(target, staging / "t")
        try:
            return self.layers.seal(staging / "t", parent=None, whiteouts=False)
        except BaseException:
            if (staging / "t").is_dir():  # not consumed: the workspace as it was
                os.rename(staging / "t", target)
            raise
        finally:
            shutil.rmtree(staging, ignore_errors=True)

    def fork(
        self, ws_id: str, children: list[tuple[str, Path]]
    ) -> tuple[LayerInfo, list[WorkspaceInfo]]:
        """Freeze ``ws_id`` and attach one workspace per (id, target) over the frozen layer.
        The stack is verified once, by the freeze, for the parent and every child."""
        with self.layers.lock.hold():
            return self._fork(ws_id, children)

    def _fork(
        self, ws_id: str, children: list[tuple[str, Path]]
    ) -> tuple[LayerInfo, list[WorkspaceInfo]]:
        layer = self._freeze(ws_id)
        stack = list(self._state(ws_id).stack)
        made: list[WorkspaceInfo] = []
        try:
            for child, target in children:
                made.append(self._attach(child, target, stack))
        except BaseException:
            for info in made:
                self.remove(info.id)
            raise
        return layer, made

    def manifest(self, ws_id: str) -> WorkspaceManifest:
        """Every regular file the workspace shows now, with md5 and sha256 (evidence)."""
        target = Path(self._state(ws_id).target)
        files = []
        for rel, path in _checked_walk(target, self.layers.max_entries):
            st = os.lstat(path)
            if stat.S_ISREG(st.st_mode):
                md5, sha = _hash_file(path, "md5", "sha256")
                files.append(FileRecord(path=rel, size=st.st_size, md5=md5, sha256=sha))
        return WorkspaceManifest(files=tuple(files))

    def own_bytes(self, ws_id: str) -> int:
        """Disk the workspace holds of its own: its folder (upper layer, overlayfs scratch,
        record) and, for a copy, the copied tree. Shared sealed layers are not counted."""
        state = self._state(ws_id)
        trees = [self._folder(ws_id)] + ([] if state.mode == "overlay" else [Path(state.target)])
        return sum(os.lstat(p).st_blocks * 512 for tree in trees for _, p in _walk(tree))

    def remove(self, ws_id: str) -> None:
        """Unmount and delete the workspace; idempotent, also for half-made ones."""
        folder = self._folder(ws_id)
        try:
            state: _State | None = self._state(ws_id)
        except (WorkspaceError, ValidationError):
            state = None
        if state is not None:
            target = Path(state.target)
            unmount_under(target)
            if state.mode != "overlay":
                remove_tree(target)
            elif target.is_dir():
                target.rmdir()  # the empty mount point
        remove_tree(folder)
        if folder.exists():
            raise WorkspaceError(f"could not remove workspace {ws_id}; retry")

    def ids(self) -> list[str]:
        return sorted(p.name for p in self.root.iterdir() if p.is_dir())

    # --- pins and garbage collection --------------------------------------------------
    @property
    def _all_pins(self) -> Path:
        return self.layers.root.parent / "pins"

    def _pins(self, owner: str) -> Path:
        return self._all_pins / run_name(owner)

    def pin(self, owner: str, digest: str) -> None:
        """Keep layer ``digest`` and the layers below it while ``owner`` (a run) holds it:
        one empty file per layer, so concurrent pins of one run need no lock of their own."""
        with self.layers.lock.hold():
            self.layers.manifest(digest)  # exists, and is what its name says
            folder = self._pins(owner)
            folder.mkdir(parents=True, exist_ok=True)
            (folder / digest).touch()

    def release(self, owner: str) -> None:
        """Drop every pin ``owner`` holds (its layers go at the next ``gc``)."""
        shutil.rmtree(self._pins(owner), ignore_errors=True)

    def pinned_runs(self) -> list[str]:
        """The names (``run_name``) of the runs that pin layers here."""
        pins = self._all_pins
        return sorted(p.name for p in pins.iterdir() if p.is_dir()) if pins.is_dir() else []

    def release_ended(self, ended: Callable[[Sequence[str]], set[str]]) -> list[str]:
        """Drop the pins of every run here that ``ended`` (given their names) says has
        ended, e.g. by the artifact store's end marks; returns their names."""
        runs = self.pinned_runs()
        gone = sorted(ended(runs) & set(runs)) if runs else []
        for name in gone:
            shutil.rmtree(self._all_pins / name, ignore_errors=True)
        return gone

    def live_layers(self, keep: Iterable[str] = ()) -> set[str]:
        """Layers something still needs: each pinned layer, each layer a workspace sits
        on and each layer of ``keep``, with every layer below them."""
        tops: set[str] = set(keep)
        pins = self._all_pins
        if pins.is_dir():
            tops |= {p.name for owner in pins.iterdir() for p in owner.iterdir()}
        for ws_id in self.ids():
            try:
                tops |= set(self._state(ws_id).stack)
            except (WorkspaceError, ValidationError):
                continue  # half-made: its layers are pinned or young, or already gone
        live: set[str] = set()
        for top in tops:
            current: str | None = top
            while current is not None and current not in live:
                live.add(current)
                try:
                    current = self.layers.manifest(current).parent
                except WorkspaceError:
                    current = None  # gone or damaged: nothing below it to keep
        return live

    def gc(self, min_age_seconds: float = 600.0, keep: Iterable[str] = ()) -> GcResult:
        """Remove every layer nothing needs (see ``live_layers``; ``keep``: more layers
        the caller knows are needed) that was sealed (or sealed again) at least
        ``min_age_seconds`` ago — its sealer may not have pinned or mounted it yet — and
        set-aside leftovers (damaged layers, interrupted seals) as old. Holds the store's
        lock exclusive while it marks and moves the unneeded layers aside: no fork,
        attach, pin or seal runs in between (``keep``, read by a caller before, is only
        safe when it holds the lock too). The slow part, deleting, comes after."""
        with self.layers.lock.hold(exclusive=True):
            live = self.live_layers(keep)
            doomed = self._set_aside(live, min_age_seconds)
            kept = sum(1 for f in self.layers.root.iterdir() if not f.name.startswith("."))
        freed = sum(_delete(aside) for _, aside in doomed)
        return GcResult(
            kept=kept, live=len(live), removed=tuple(n for n, _ in doomed), bytes_freed=freed
        )

    def _set_aside(self, live: set[str], min_age_seconds: float) -> list[tuple[str, Path]]:
        """Rename each layer or leftover to collect to a leftover's name, now (so that
        another gc leaves it to this one unless it is crashed and old): (name, new path)."""
        now = time.time()
        doomed: list[tuple[str, Path]] = []
        for folder in sorted(self.layers.root.iterdir()):
            name = folder.name
            try:
                age = now - os.stat(folder).st_mtime
            except FileNotFoundError:
                continue
            if name in live or age < min_age_seconds:
                continue
            aside = self.layers.root / f".collected-{name.lstrip('.')[:80]}-{time.monotonic_ns()}"
            try:
                os.rename(folder, aside)
                os.utime(aside)
            except FileNotFoundError:  # another gc took this leftover
                continue
            doomed.append((name, aside))
        return doomed


def _delete(folder: Path) -> int:
    """Delete ``folder``; the bytes it held (what another process deleted first aside)."""
    freed = 0
    try:
        for _, path in _walk(folder):
            with contextlib.suppress(FileNotFoundError):
                freed += os.lstat(path).st_blocks * 512
    except OSError:  # gone, or a leftover nested too deep to reach by path: not counted
        pass
    remove_tree(folder)
    return freed


class GcResult(BaseModel):
    """What ``Workspaces.gc`` did: layers left (``live`` of them needed), those removed
    (digests, or names of set-aside leftovers) and the disk they held."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    kept: int
    live: int
    removed: tuple[str, ...]
    bytes_freed: int


class WorkspaceFork(BaseModel):
    """What ``fork`` did: the layer it froze the parent's workspace into, one workspace
    per child over it, and the seconds from the start of the freeze until every child's
    workspace was mounted (or copied)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    parent: str
    layer: LayerInfo
    children: tuple[WorkspaceInfo, ...]
    seconds: float
