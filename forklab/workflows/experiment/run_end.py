"""How a run of an experiment workflow (workload or cohort) ends other than by completing:
``Stop``, an early end with a final status, and ``cause``, the sentence an activity
failure ends it with. Both workflows end alike, so one definition serves them."""

from __future__ import annotations

from temporalio.exceptions import ActivityError, ApplicationError

from forklab.workflows.experiment.messages import Status


class Stop(Exception):
    """Ends the run early with a final status (refused, rejected, expired, failed)."""

    def __init__(self, status: Status, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


def cause(err: BaseException) -> str:
    """The innermost message of an activity failure: the sentence a person can act on."""
    while isinstance(err, ActivityError) and err.cause is not None:
        err = err.cause
    return str(err.message if isinstance(err, ApplicationError) else err)
