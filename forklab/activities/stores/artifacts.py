"""The content-addressed artifact store: large data (checkpoints, per-episode outcomes,
reports) lives here and travels through Temporal as its sha256 digest.

Two backends share one contract (:class:`ArtifactStore`): a folder on this host
(:class:`LocalArtifactStore`, the default) and an S3-compatible bucket
(``forklab.activities.stores.artifacts_s3.S3ArtifactStore``) that workers on many hosts share.
Either way a blob is written whole or not at all, and every read re-hashes what it got, so a damaged
blob is reported, never returned.

Blobs are kept: they are the evidence a report and the ledger point to.
"""

from __future__ import annotations

import hashlib
import json
import re
from abc import ABC, abstractmethod
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from forklab.activities.files import atomic_write
from forklab.runtime.canon import canonical_json, sha256_hex

_DIGEST = re.compile(r"[0-9a-f]{64}")


class ArtifactError(RuntimeError):
    """An artifact is missing, damaged, or was asked for by a malformed digest."""


def check_digest(digest: str) -> str:
    if not _DIGEST.fullmatch(digest):
        raise ArtifactError(
            f"artifact digest {digest!r} is not a sha256 hex digest (64 lowercase hex digits)"
        )
    return digest


def run_name(owner: str) -> str:
    """The name of run ``owner`` (a run key) wherever a path or key must name it: a hash,
    so that no run key, which holds a workflow id anyone may choose, names a path. A host's
    pins of the run's workspace layers and the store's mark of its end use it whole."""
    return hashlib.sha256(owner.encode()).hexdigest()


class ArtifactStore(ABC):
    """Blobs named by their sha256. Subclasses move bytes; this class names and checks them."""

    @property
    @abstractmethod
    def location(self) -> str:
        """Where the blobs are, for messages (never with credentials)."""

    @abstractmethod
    def _read(self, digest: str) -> bytes | None:
        """The stored bytes, or None when there is no such blob."""

    @abstractmethod
    def _write(self, digest: str, data: bytes) -> None:
        """Store ``data`` under ``digest`` whole (a reader never sees part of it)."""

    @abstractmethod
    def _write_mark(self, name: str) -> None:
        """Store the empty end mark of the run named ``name``."""

    @abstractmethod
    def _has_mark(self, name: str) -> bool:
        """Whether the run named ``name`` has an end mark."""

    def put_bytes(self, data: bytes) -> str:
        """Store ``data`` and return its digest; storing the same bytes again is a no-op
        (and repairs a damaged copy)."""
        digest = sha256_hex(data)
        self._write(digest, data)
        return digest

    def put_json(self, value: Any) -> str:
        """Store ``value`` as canonical JSON, so equal values share one digest."""
        return self.put_bytes(canonical_json(value).encode())

    def get_bytes(self, digest: str) -> bytes:
        data = self._read(check_digest(digest))
        if data is None:
            raise ArtifactError(
                f"artifact {digest} is missing from {self.location}; "
                "check that every worker and the CLI use one artifact store (FORKLAB_ARTIFACTS)"
            )
        actual = sha256_hex(data)
        if actual != digest:
            raise ArtifactError(
                f"artifact {digest} is corrupt in {self.location} (it hashes to {actual}); "
                "delete that blob and re-run the step that produced it"
            )
        return data

    def get_json(self, digest: str) -> Any:
        return json.loads(self.get_bytes(digest))

    def mark_ended(self, owner: str) -> None:
        """Record that run ``owner`` has ended (its cleanup ran). A run pins the workspace
        layers it uses on every host that ran one of its chunks, and its cleanup, on one
        host, releases only that host's pins; the other hosts drop theirs when they next
        collect layers and find this mark (``ended``). One empty blob per run, kept: a host
        may collect long after the run."""
        self._write_mark(run_name(owner))

    def ended(self, names: Iterable[str]) -> set[str]:
        """Which of ``names`` (``run_name``s, e.g. the runs a host pins layers for) are
        marked ended; a name that is no ``run_name`` is never asked for."""
        return {name for name in names if _DIGEST.fullmatch(name) and self._has_mark(name)}


class LocalArtifactStore(ArtifactStore):
    """Blobs at ``root/<first two hex>/<remaining hex>``, written to a temporary file in the
    same folder and renamed into place."""

    def __init__(self, root: Path) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)

    @property
    def location(self) -> str:
        return str(self.root)

    def path(self, digest: str) -> Path:
        check_digest(digest)
        return self.root / digest[:2] / digest[2:]

    def _read(self, digest: str) -> bytes | None:
        try:
            return self.path(digest).read_bytes()
        except FileNotFoundError:
            return None

    def _write(self, digest: str, data: bytes) -> None:
        path = self.path(digest)
        if path.is_file() and sha256_hex(path.read_bytes()) == digest:
            return
        atomic_write(path, data)

    def mark_path(self, name: str) -> Path:
        """``root/ended/<name>``; ``ended`` is no two-hex blob folder."""
        return self.root / "ended" / name

    def _write_mark(self, name: str) -> None:
        atomic_write(self.mark_path(name), b"")

    def _has_mark(self, name: str) -> bool:
        return self.mark_path(name).is_file()
