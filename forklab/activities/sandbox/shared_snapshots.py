"""Snapshots that travel between hosts through the artifact store.

A snapshot's runner bundle lives under one worker's home (a local snapshot's folder, a
Daytona snapshot's bundle that is uploaded into each sandbox), but the worker that
resolves it and the ones that run the worlds may be on different hosts. So whoever
prepares a snapshot also publishes its bundle to the artifact store: each file under its
sha256, and the manifest ``[[relpath, sha256], ...]`` — whose canonical-JSON digest *is*
the code digest every snapshot id ends with, so the snapshot id alone names it. A host
that lacks the snapshot restores it from the store: the store re-hashes each object it
returns and the backend's ``restore_snapshot`` re-hashes the bundle against the id, so a
damaged or substituted file cannot become the snapshot the plan fingerprint approved. A
Daytona snapshot stays pinned by the image id in the snapshot id; no host resolves its
name again.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from forklab.activities.experiment.runner_bundle import code_digest
from forklab.activities.sandbox.base import (
    SandboxBackend,
    SandboxError,
    SnapshotInfo,
    snapshot_code_digest,
)
from forklab.activities.stores.artifacts import ArtifactStore
from forklab.experiments.experiment.bundle import BundleFile


class SharedSnapshots:
    """Publish snapshots as they are prepared; rebuild missing ones from the store."""

    def __init__(self, backend: SandboxBackend, store: ArtifactStore) -> None:
        self._backend = backend
        self._store = store
        self._ready: set[str] = set()

    @property
    def backend(self) -> SandboxBackend:
        """The backend the snapshots are prepared on (for its preflight, if it has one)."""
        return self._backend

    def prepare(self, files: list[BundleFile]) -> SnapshotInfo:
        """``backend.prepare_snapshot`` plus publication of the bundle to the store."""
        info = self._backend.prepare_snapshot(files)
        manifest = [[f.relpath, self._store.put_bytes(f.source.read_bytes())] for f in files]
        published = self._store.put_json(manifest)
        if published != code_digest(files):
            raise SandboxError("the bundle files changed while the snapshot was published; retry")
        self._ready.add(info.id)
        return info

    def ensure(self, snapshot_id: str) -> None:
        """Make ``snapshot_id`` available to this host's backend (once per process)."""
        if snapshot_id in self._ready:
            return  # prepared or restored here already
        manifest = self._store.get_json(snapshot_code_digest(snapshot_id))
        with tempfile.TemporaryDirectory(prefix="forklab-bundle-") as tmp:
            files = []
            for relpath, digest in manifest:
                path = Path(tmp, "files", digest)
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_bytes(self._store.get_bytes(digest))
                files.append(BundleFile(relpath, path))
            self._backend.restore_snapshot(snapshot_id, files)
        self._ready.add(snapshot_id)
