"""Sandboxes: the interface (``base``) and the default local backend (``local``)."""

from activities.sandbox.base import (
    ExecResult,
    Limits,
    SandboxBackend,
    SandboxError,
    SandboxNotFoundError,
    SnapshotCorruptedError,
    SnapshotInfo,
)
from activities.sandbox.local import LocalSandboxBackend

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
