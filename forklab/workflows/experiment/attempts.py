"""What a failed attempt of a sandbox unit cost, and whether the unit may try again.

Each attempt of a unit (one prefix chunk, or one world over one chunk) is a single
activity execution; the workflow, not the server's retry policy, starts the next one, so
that every attempt runs under a reservation renewed in full and every attempt that died
is charged what it can have burnt. The charge is an upper bound from the attempt's last
heartbeat (``{"charged": seconds, "dies_with_worker": bool}``):

- no heartbeat at all before a timeout: the attempt never reached its sandbox (it beats
  before creating one), so nothing was spent;
- a sandbox that dies with its worker (bubblewrap): what the last beat reported plus the
  longest a beat can lag (one beat interval and the heartbeat throttle);
- a sandbox that may outlive its worker (the fallback, a remote backend) or a failure
  that says nothing: the whole reservation, since the command may run to its wall limit;
- an attempt that failed on its own with no sandbox running (``SETTLED_BEAT``: it gave up
  waiting for a store): what it reports, no lag — waiting is not compute.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from temporalio.exceptions import ApplicationError, FailureError, TimeoutError

from forklab.contracts.experiment import SETTLED_BEAT


@dataclass(frozen=True)
class FailedAttempt:
    burnt: float  # world-seconds to charge for the attempt (at most what it held)
    final: bool  # the failure is deterministic: another attempt would fail the same way
    sandbox_id: str | None = None  # the attempt's sandbox, when its last beat named one


def _last_beat(cause: BaseException) -> dict[str, Any] | None:
    details: Any = ()
    if isinstance(cause, TimeoutError):
        details = cause.last_heartbeat_details
    elif isinstance(cause, ApplicationError):
        details = cause.details
    if details and isinstance(details[0], dict):
        return details[0]
    return None


def failed_attempt(cause: BaseException | None, held: float, lag: float) -> FailedAttempt:
    """Account an attempt that ended with ``cause`` (an activity failure's cause) under a
    reservation of ``held`` seconds; ``lag`` is how stale its last heartbeat can be."""
    final = isinstance(cause, ApplicationError) and cause.non_retryable
    beat = _last_beat(cause) if isinstance(cause, FailureError) else None
    if beat is None:
        burnt = 0.0 if isinstance(cause, TimeoutError) else held
    elif not beat.get("dies_with_worker", False) and beat.get(SETTLED_BEAT) is not True:
        burnt = held
    else:
        try:
            charged = float(beat.get("charged", held))
        except (TypeError, ValueError):
            charged = held
        # a settled beat is the attempt's own last word, sent with no sandbox running
        late = 0.0 if beat.get(SETTLED_BEAT) is True else lag
        burnt = charged + late if math.isfinite(charged) else held  # NaN, inf: no trust
    sandbox = beat.get("sandbox_id") if beat else None
    return FailedAttempt(
        burnt=min(max(burnt, 0.0), held),
        final=final,
        sandbox_id=sandbox if isinstance(sandbox, str) and sandbox else None,
    )
