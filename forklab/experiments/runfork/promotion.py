"""What promoting a fork did to each sibling's run in Temporal.

Promotion is recorded in the fork registry (append-only); a sibling still running is
also closed where it runs — its cancellation requested — unless the operator asks to
leave the siblings running. Each sibling's ``closed`` row says which happened."""

from __future__ import annotations

from enum import StrEnum


class SiblingRun(StrEnum):
    #: it was running; its cancellation was requested (its workflow may still compensate)
    cancelled = "cancelled"
    #: it was running and was left running (``forklab promote --keep-running``)
    left_running = "left_running"
    #: it had already closed (completed, failed, …) or no longer exists in Temporal
    already_closed = "already_closed"


def closed_note(winner: str) -> str:
    """The note on each sibling's ``closed`` row: which promotion closed it."""
    return f"sibling {winner} promoted"
