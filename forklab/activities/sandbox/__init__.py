"""Sandboxes: the interface (``base``) and the default local backend (``local``)."""

from forklab.activities.sandbox.base import (
    ExecResult,
    Limits,
    SandboxBackend,
    SandboxError,
    SandboxNotFoundError,
    SnapshotCorruptedError,
    SnapshotInfo,
)
from forklab.activities.sandbox.local import LocalSandboxBackend

__all__ = [
    "ExecResult",
    "Limits",
    "LocalSandboxBackend",
    "SandboxBackend",
    "SandboxError",
    "SandboxNotFoundError",
    "SnapshotCorruptedError",
    "SnapshotInfo",
]
