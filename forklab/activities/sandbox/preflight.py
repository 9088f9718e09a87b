"""What a remote sandbox backend checks before approval, spending no compute.

A backend that runs worlds on someone else's machines can be refused by them after the
approval (wrong region, a stale snapshot, a quota too small for the planned concurrency).
``Preflight`` lets the capacity check ask first; the local backend does not need it.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from forklab.activities.sandbox.base import SandboxError


class SandboxUnavailableError(SandboxError):
    """The provider failed in a way that may pass (rate limit, 5xx, timeout): retry."""


@runtime_checkable
class Preflight(Protocol):
    def preflight(self, snapshot_id: str, peak_sandboxes: int) -> list[str]:
        """Why the plan cannot run (empty: it can): snapshot state, region, quota.
        Raises ``SandboxUnavailableError`` when the provider could not be asked."""
        ...

    def provenance(self, snapshot_id: str) -> str:
        """One line for the report: what every world started from."""
        ...
