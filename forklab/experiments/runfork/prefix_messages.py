"""Signals and updates a parent received inside a fork's prefix, and where a fork hands
them over again.

A workflow sees its inputs in activations: one per workflow task, holding every event
that reached the run since the last task started. The SDK applies an activation's signals
and updates before its activity results, so a message reaches the workflow's code after
the results of earlier activations and before those of its own. Its **position** is
therefore the number of steps handed over before it: the steps whose results reached the
run in earlier activations. A fork redelivers each inherited message once that many
inherited results have been handed over and the workflow has gone on to wait for
something (as the parent's did before its next workflow task), and hands over the next
result only after it: every message lands between the same two inherited results as on
the parent.

Pure: ``history_events`` computes positions from a history, the fork interceptor's
``prefix_messages`` delivers.
"""

from __future__ import annotations

from enum import StrEnum

from pydantic import BaseModel, ConfigDict, Field


class MessageKind(StrEnum):
    signal = "signal"
    #: an update the parent accepted: its handler runs again on the fork with the recorded
    #: arguments; its caller got its answer from the parent, so the fork's result goes
    #: nowhere
    update = "update"


class PrefixMessage(BaseModel):
    """A signal or accepted update as the parent's history recorded it."""

    model_config = ConfigDict(frozen=True)

    kind: MessageKind
    name: str
    #: steps (chain-wide numbers) handed over to the workflow before this message
    position: int = Field(ge=0)
    #: each argument's ``Payload``, serialised and base64-encoded, as recorded
    args_b64: list[str] = Field(default_factory=list)
    #: the message's header payloads, serialised and base64-encoded
    headers_b64: dict[str, str] = Field(default_factory=dict)
    #: the update's id (updates only)
    update_id: str | None = None


def inside(messages: list[PrefixMessage], lo: int, hi: int) -> list[PrefixMessage]:
    """The messages handed over after step ``lo`` at the earliest and before step ``hi + 1``:
    those a page of steps ``lo + 1..hi`` carries (``lo`` is the step before the page)."""
    return [m for m in messages if lo <= m.position < hi]


class MessageQueue:
    """A fork's inherited messages in the parent's order, handed out as the inherited
    results reach the points where the parent received them."""

    def __init__(self, messages: list[PrefixMessage]) -> None:
        self._messages = list(messages)
        self._next = 0

    def due(self, handed_over: int) -> PrefixMessage | None:
        """The next message, if it is due once ``handed_over`` steps (chain-wide) have
        been handed over; None when it is not yet (or none is left)."""
        if self._next < len(self._messages) and self._messages[self._next].position <= handed_over:
            return self._messages[self._next]
        return None

    def delivered(self) -> None:
        self._next += 1

    def clear_before(self, step: int) -> bool:
        """Whether every message the parent received before step ``step``'s result has
        been handed over (the step's result may go now)."""
        return self._next >= len(self._messages) or self._messages[self._next].position >= step

    @property
    def owed(self) -> int:
        """Messages not redelivered yet."""
        return len(self._messages) - self._next

    @property
    def pending(self) -> PrefixMessage | None:
        return self._messages[self._next] if self._next < len(self._messages) else None
