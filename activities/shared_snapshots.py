"""Local snapshots that travel between hosts through the artifact store.

A local snapshot lives under one worker's home, but the worker that resolves it and the
ones that run the worlds may be on different hosts. So whoever prepares a snapshot also
publishes its bundle to the artifact store: each file under its sha256, and the manifest
``[[relpath, sha256], ...]`` — whose canonical-JSON digest *is* the code digest, so the
snapshot id alone names it. A host that lacks the snapshot rebuilds it from the store;
``prepare_snapshot`` re-hashes the copies, so a damaged or substituted file cannot become
the snapshot the plan fingerprint approved.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from activities.artifacts import ArtifactStore
from activities.sandbox.base import SandboxBackend, SandboxError, SnapshotInfo
from activities.sandbox.local import SNAPSHOT_PREFIX
from experiments.bundle import BundleFile, code_digest


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
        if snapshot_id in self._ready or not snapshot_id.startswith(SNAPSHOT_PREFIX):
            return  # prepared here already, or a backend whose snapshots are shared anyway
        manifest = self._store.get_json(snapshot_id.removeprefix(SNAPSHOT_PREFIX))
        with tempfile.TemporaryDirectory(prefix="forklab-bundle-") as tmp:
            files = []
            for relpath, digest in manifest:
                path = Path(tmp, "files", digest)
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_bytes(self._store.get_bytes(digest))
                files.append(BundleFile(relpath, path))
            info = self._backend.prepare_snapshot(files)
        if info.id != snapshot_id:
            raise SandboxError(
                f"the bundle stored for snapshot {snapshot_id} rebuilds as {info.id}; "
                "the artifact store is inconsistent, start the experiment again"
            )
        self._ready.add(snapshot_id)
