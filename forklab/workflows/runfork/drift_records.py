"""An inherited call served although the fork asked with another input: said at the fork
point, and recorded in the fork's own history.

An approximate boundary (or ``--allow-build-change`` on another build) matches inherited
calls by activity type, so the fork may be served the parent's result for a call it made
with another input. The receipt was written before the fork ran and never changes, so the
fork records each such call where an append-only record of it belongs: its own history,
as a ``forklab.record_drift`` activity whose input is the :class:`DriftRecord` (both
digests), which ``forklab trail`` reads. Forks recorded before it replay without the
record (the ``forklab-record-drift`` patch).
"""

from __future__ import annotations

from datetime import timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy

with workflow.unsafe.imports_passed_through():
    from forklab.contracts.runfork import RECORD_DRIFT
    from forklab.experiments.runfork.approximations import DriftRecord
    from forklab.experiments.runfork.steps import Step

DRIFT_PATCH = "forklab-record-drift"


def noted_drift(step: Step, fork_input_sha256: str) -> str:
    """Records that inherited ``step`` was served to a call asking with
    ``fork_input_sha256``; returns the sentence the fork point lists."""
    record = DriftRecord(
        step=step.index,
        activity_type=step.activity_type,
        parent_input_sha256=step.input_sha256,
        fork_input_sha256=fork_input_sha256,
    )
    if workflow.patched(DRIFT_PATCH):
        # not awaited: the record is its scheduling, and the served result must reach the
        # workflow at its place among the inherited ones, not one round trip later
        workflow.start_activity(
            RECORD_DRIFT,
            record,
            result_type=DriftRecord,
            start_to_close_timeout=timedelta(minutes=2),
            retry_policy=RetryPolicy(maximum_attempts=5),
            summary=f"fork: step {step.index} ({step.activity_type[:100]}) input drift",
        )
    return (
        f"step {step.index} ({step.activity_type[:100]}) was served the parent's result "
        "although the fork's input differs from the parent's"
    )
