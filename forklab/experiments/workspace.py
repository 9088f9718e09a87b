"""Workspace state, as data: layer manifests, evidence manifests, their diff, and the
checkpoint of a workload that carries files.

A *layer* is one read-only level of a copy-on-write workspace: the files a sandbox wrote
since the layer below it was frozen (plus overlayfs whiteouts for what it deleted). A
layer is named by the sha256 of its canonical manifest, and the manifest names the layer
below (``parent``), so one digest pins the whole stack of files a child sees — a Merkle
chain, like a git commit over its tree and parent.

An *evidence manifest* is the flat view a reader wants: every regular file of the
workspace as the sandbox sees it, with size, md5 and sha256. Two of them diff into what
diverged. Everything here is pure: reading the files is the activities' job.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from forklab.runtime.canon import digest
from forklab.runtime.files import checkpoint_digest

_HEX64 = r"^[0-9a-f]{64}$"


class EntryKind(StrEnum):
    file = "file"
    dir = "dir"
    symlink = "symlink"
    #: overlayfs's mark for "deleted in this layer" (a 0/0 character device).
    whiteout = "whiteout"


class LayerEntry(BaseModel):
    """One path of a layer. ``sha256`` is set for files, ``target`` for symlinks;
    ``opaque`` marks a directory that hides everything below it (overlayfs). The owner is
    part of it: the same bytes owned by another uid are another layer."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    path: str
    kind: EntryKind
    mode: int = Field(ge=0, le=0o7777)
    uid: int = Field(ge=0)
    gid: int = Field(ge=0)
    size: int = Field(0, ge=0)
    sha256: str | None = Field(None, pattern=_HEX64)
    target: str | None = None
    opaque: bool = False


class LayerManifest(BaseModel):
    """What a layer holds, sorted by path. Its digest is the layer's name."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    #: the manifest format's version: a stored manifest of another version is refused
    version: Literal[1] = 1
    parent: str | None = Field(None, pattern=_HEX64)
    entries: tuple[LayerEntry, ...]

    def digest(self) -> str:
        """sha256 of the canonical JSON: covers every path, kind, mode, owner, size,
        content digest, symlink target and whiteout of this layer, and the parent's digest."""
        return digest(self.model_dump(mode="json"))

    @property
    def bytes(self) -> int:
        return sum(e.size for e in self.entries if e.kind is EntryKind.file)


class FileRecord(BaseModel):
    """One regular file of a workspace as its sandbox sees it."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    path: str
    size: int = Field(ge=0)
    md5: str
    sha256: str = Field(pattern=_HEX64)


class WorkspaceManifest(BaseModel):
    """Every regular file of one workspace at one moment, sorted by path."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    files: tuple[FileRecord, ...]

    def by_path(self) -> dict[str, FileRecord]:
        return {f.path: f for f in self.files}

    def digest(self) -> str:
        return digest(self.model_dump(mode="json"))

    @property
    def bytes(self) -> int:
        return sum(f.size for f in self.files)


class ManifestDiff(BaseModel):
    """What changed from one manifest to another (paths, sorted)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    added: tuple[str, ...]
    removed: tuple[str, ...]
    changed: tuple[str, ...]
    unchanged: int = Field(ge=0)

    @property
    def diverged(self) -> bool:
        return bool(self.added or self.removed or self.changed)


def diff_manifests(before: WorkspaceManifest, after: WorkspaceManifest) -> ManifestDiff:
    """Compare by content (sha256 and size), not by time stamps."""
    old, new = before.by_path(), after.by_path()
    changed = [
        p
        for p in old.keys() & new.keys()
        if (old[p].sha256, old[p].size) != (new[p].sha256, new[p].size)
    ]
    return ManifestDiff(
        added=tuple(sorted(new.keys() - old.keys())),
        removed=tuple(sorted(old.keys() - new.keys())),
        changed=tuple(sorted(changed)),
        unchanged=len(old.keys() & new.keys()) - len(changed),
    )


class WorkspaceCheckpoint(BaseModel):
    """The checkpoint of a workload that carries files: its JSON state and the workspace
    layer frozen at the same boundary. ``layer`` is None for a workload without files.

    ``digest`` is what a fork inherits and what validity checks compare: two worlds
    started from the same checkpoint only if both the state and every file agree.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    state_sha256: str = Field(pattern=_HEX64)
    layer: str | None = Field(None, pattern=_HEX64)

    @property
    def digest(self) -> str:
        return checkpoint_digest(self.state_sha256, self.layer)


class WorkspaceEvidence(BaseModel):
    """One sandbox's workspace, as the host read it once its runner succeeded: for a
    prefix chunk, at the branch (``layer`` is what it was frozen into); for a world batch,
    at the end (``layer`` is what it was forked from)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    layer: str = Field(pattern=_HEX64)
    manifest: WorkspaceManifest
