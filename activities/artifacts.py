"""The content-addressed artifact store: large data (checkpoints, per-episode outcomes,
reports) lives here and travels through Temporal as its sha256 digest.

Blobs are stored at ``root/<first two hex>/<remaining hex>``. A write goes to a temporary
file in the same folder and is renamed into place, so a reader never sees half a blob;
every read re-hashes what it got, so a damaged file is reported, never returned.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from activities.files import atomic_write
from experiments.runtime.canon import canonical_json, sha256_hex

_DIGEST = re.compile(r"[0-9a-f]{64}")


class ArtifactError(RuntimeError):
    """An artifact is missing, damaged, or was asked for by a malformed digest."""


class ArtifactStore:
    def __init__(self, root: Path) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)

    def path(self, digest: str) -> Path:
        if not _DIGEST.fullmatch(digest):
            raise ArtifactError(
                f"artifact digest {digest!r} is not a sha256 hex digest (64 lowercase hex digits)"
            )
        return self.root / digest[:2] / digest[2:]

    def put_bytes(self, data: bytes) -> str:
        """Store ``data`` and return its digest; storing the same bytes again is a no-op
        (and repairs a damaged copy)."""
        digest = sha256_hex(data)
        path = self.path(digest)
        if path.is_file() and sha256_hex(path.read_bytes()) == digest:
            return digest
        atomic_write(path, data)
        return digest

    def put_json(self, value: Any) -> str:
        """Store ``value`` as canonical JSON, so equal values share one digest."""
        return self.put_bytes(canonical_json(value).encode())

    def get_bytes(self, digest: str) -> bytes:
        path = self.path(digest)
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            raise ArtifactError(
                f"artifact {digest} is missing from {self.root}; "
                "check that every worker uses the same artifact folder"
            ) from None
        actual = sha256_hex(data)
        if actual != digest:
            raise ArtifactError(
                f"artifact {digest} is corrupt ({path} hashes to {actual}); "
                "delete that file and re-run the step that produced it"
            )
        return data

    def get_json(self, digest: str) -> Any:
        return json.loads(self.get_bytes(digest))
