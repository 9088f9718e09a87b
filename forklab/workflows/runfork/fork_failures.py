"""The failures a fork raises on its own account: a prefix it diverged from, a marker or
prefix it refuses, a call its policies block. Each is non-retryable: a failed workflow
task would be retried for ever, leaving the run open and stuck."""

from __future__ import annotations

from temporalio.exceptions import ApplicationError

from forklab.contracts.errors import ForkErrorType
from forklab.workflows.runfork.fork_state import ForkState


def diverged(state: ForkState, why: str) -> ApplicationError:
    """A divergence, naming the builds when the fork's is not the parent's."""
    marker = state.marker
    if state.changed_build is not None and marker is not None:
        why += (
            f"; the fork runs build {state.changed_build} and the parent's prefix was "
            f"recorded by {marker.parent_build}: its workflow code changed"
        )
        if not marker.allow_build_change:
            why += (
                " (fork with --allow-build-change to be served the parent's results approximately)"
            )
    return ApplicationError(why, type=ForkErrorType.prefix_diverged, non_retryable=True)


def refused(why: str, error: ForkErrorType = ForkErrorType.marker_unverified) -> ApplicationError:
    return ApplicationError(why, type=error, non_retryable=True)


def tool_blocked(message: str) -> ApplicationError:
    return ApplicationError(message, type=ForkErrorType.tool_blocked, non_retryable=True)
