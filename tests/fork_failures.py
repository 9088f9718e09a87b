"""Reading why a fork failed: a blocked call fails as an activity, so the
``fork_tool_blocked`` error is a cause inside the workflow's failure, not its top."""

from __future__ import annotations

from temporalio.exceptions import ApplicationError, FailureError

from forklab.contracts.errors import ForkErrorType


def blocked_error(error: BaseException | None) -> ApplicationError | None:
    """The ``fork_tool_blocked`` error among ``error`` and its causes, if any."""
    while error is not None:
        if isinstance(error, ApplicationError) and error.type == ForkErrorType.tool_blocked:
            return error
        error = error.cause if isinstance(error, FailureError) else error.__cause__
    return None


def blocked_in(error: BaseException | None) -> bool:
    """Whether ``error`` or one of its causes is a ``fork_tool_blocked`` error."""
    return blocked_error(error) is not None
