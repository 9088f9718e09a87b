"""A fork's prefix sees its parent's ``workflow.random()`` and ``workflow.now()``.

The seed of the parent's random stream and the time of each of its workflow tasks come
with the prefix (``experiments/runfork/side_effects.py``); the fork reseeds its stream
with the parent's before its workflow code runs (so ``workflow.uuid4()`` and
``workflow.random()`` draw what the parent drew, and go on drawing the parent's stream
after the boundary), and while it hands inherited results over, its clock reads the time
of the parent's workflow task that handed the same result over. At the fork point the
clock is the fork's own again.

The Python SDK has no public call for either; this module sets the workflow event loop's
random generator and activation time (``temporalio.worker._workflow_instance``), and only
here. Both are deterministic on replay: the values come from the fork's own history.
"""

from __future__ import annotations

import asyncio
from typing import Any


def _loop() -> Any:
    return asyncio.get_running_loop()


class ParentSideEffects:
    """The parent's random seed and workflow task times, applied to a fork's prefix."""

    def __init__(self, seed: int | None, clock: dict[int, int]) -> None:
        self._seed = seed
        self._clock = clock
        #: the time this set, and the fork's own time it replaced
        self._set: int | None = None
        self._own = 0

    def begin(self, position: int) -> None:
        """Before the workflow code runs: the parent's seed, and its first task's time."""
        loop = _loop()
        if self._seed is not None:
            loop._random.seed(self._seed)
            loop._current_seed = self._seed
        self.at(position)

    def at(self, position: int) -> None:
        """The clock of the parent's task that handed step ``position`` over."""
        self.at_time(self._clock.get(position))

    def at_time(self, time_ns: int | None) -> None:
        if time_ns is None:
            return
        loop = _loop()
        if loop._time_ns != self._set:  # a new activation: keep its own time
            self._own = loop._time_ns
        loop._time_ns = time_ns
        self._set = time_ns

    def end(self) -> None:
        """The fork point: the fork's own clock again."""
        loop = _loop()
        if self._set is not None and loop._time_ns == self._set:
            loop._time_ns = self._own
        self._set = None
