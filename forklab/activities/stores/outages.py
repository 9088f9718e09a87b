"""Riding out a shared store's outage: retry a unit of work with backoff for a bounded
window, then give up with a transient error that Temporal retries in turn.

An object store or a database that is down makes the activity wait, not fail: a short
outage is absorbed inside the attempt (no sandbox re-runs, no budget spent twice); a longer
one fails the attempt with :class:`StoreUnavailableError`, which stays retryable.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from typing import TypeVar

_T = TypeVar("_T")
#: Backoff between attempts: doubles from the first value up to the cap, with jitter.
FIRST_PAUSE_SECONDS = 0.2
MAX_PAUSE_SECONDS = 5.0


class StoreUnavailableError(RuntimeError):
    """A shared store could not be reached within its retry window (transient)."""


def ride_out(
    work: Callable[[], _T],
    transient: Callable[[BaseException], bool],
    window_seconds: float,
    what: str,
) -> _T:
    """Run ``work`` until it succeeds; while it raises errors that ``transient`` accepts,
    wait and try again for up to ``window_seconds``. ``work`` must be idempotent."""
    deadline = time.monotonic() + window_seconds
    pause = FIRST_PAUSE_SECONDS
    while True:
        try:
            return work()
        except Exception as exc:
            if not transient(exc):
                raise
            if time.monotonic() + pause > deadline:
                raise StoreUnavailableError(
                    f"{what} is unreachable ({type(exc).__name__}: {exc}); "
                    f"retried for {window_seconds:g} s, Temporal retries the activity"
                ) from exc
        time.sleep(pause * random.uniform(0.5, 1.0))
        pause = min(pause * 2, MAX_PAUSE_SECONDS)
