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
    #: a timer that fired: the fork's matching timer fires here without being started
    timer = "timer"
    #: a child workflow that closed: the fork's matching child gets its recorded outcome
    #: here without being started
    child = "child workflow"
    #: a signal the run sent another workflow, acknowledged: the fork's matching send (the
    #: k-th of that name) is not sent again, and completes here
    sent_signal = "signal sent"


class PrefixMessage(BaseModel):
    """Something besides an activity result that reached the parent inside the prefix, as
    its history recorded it: a signal, an accepted update, a timer that fired, a child
    workflow's outcome. (Timers and children are "messages" in that a fork hands them over
    at their place among the inherited results, as it does signals.)"""

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
    #: timers: the duration asked for (ns); children: None
    duration_ns: int | None = None
    #: children: the k-th child of that workflow type (``name``) the run started; signals
    #: sent: the k-th signal of that name it sent: how the fork's own is recognised. (A
    #: timer is the oldest one of its duration still waiting: timers of one duration fire
    #: in the order they were started.)
    ordinal: int | None = None
    #: children: the child's workflow id on the parent; signals sent: the workflow signalled
    child_id: str | None = None
    #: children: the recorded result payload, or the failure (a serialised ``Failure``)
    result_b64: str | None = None
    failure_b64: str | None = None
    #: the time (ns) of the parent's workflow task it reached the workflow in: what
    #: ``workflow.now()`` said there
    time_ns: int | None = None


def timer_name(duration_ns: int) -> str:
    """How a timer of ``duration_ns`` is named (in ``forklab steps`` too)."""
    return f"{duration_ns / 1e9:g}s"


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

    def owes_timer(self, duration_ns: int) -> bool:
        """Whether a timer of this duration is still to fire from the prefix."""
        return any(
            m.kind is MessageKind.timer and m.duration_ns == duration_ns
            for m in self._messages[self._next :]
        )

    def owes_child(self, workflow_type: str, ordinal: int) -> bool:
        """Whether the ``ordinal``-th child of ``workflow_type`` closed inside the prefix."""
        return self._owes(MessageKind.child, workflow_type, ordinal)

    def owes_sent_signal(self, name: str, ordinal: int) -> bool:
        """Whether the ``ordinal``-th signal ``name`` the run sent was acknowledged inside
        the prefix."""
        return self._owes(MessageKind.sent_signal, name, ordinal)

    def _owes(self, kind: MessageKind, name: str, ordinal: int) -> bool:
        return any(
            m.kind is kind and m.name == name and m.ordinal == ordinal
            for m in self._messages[self._next :]
        )


class Ordinals:
    """Counts the k-th child of a workflow type a run starts. ``take``: the ordinals of
    children it did not start itself (served from its prefix), so the ones it did start,
    in the order it started them, get the others."""

    def __init__(self) -> None:
        self._taken: dict[str, set[int]] = {}
        self._last: dict[str, int] = {}

    def take(self, name: str, ordinal: int) -> None:
        self._taken.setdefault(name, set()).add(ordinal)

    def next(self, name: str, skip_taken: bool = True) -> int:
        k = self._last.get(name, 0) + 1
        while skip_taken and k in self._taken.get(name, set()):
            k += 1
        self._last[name] = k
        return k
