"""Every timeout and retry policy the experiment workflow uses, named in one place."""

from __future__ import annotations

from datetime import timedelta

from temporalio.common import RetryPolicy

from forklab.contracts.experiment import HEARTBEAT_SECONDS

#: The rehearsal runs the workload in a box on the worker; it is bounded by its sample.
REHEARSE_TIMEOUT = timedelta(minutes=10)
#: Short activities: snapshot, capacity, token, ledger, progress records.
SHORT_TIMEOUT = timedelta(minutes=2)
#: Taking over a chunk the rehearsal ran: one small index read, cached per worker. Short,
#: because an attempt whose worker was killed is retried only when this runs out: with
#: ``SHORT_TIMEOUT`` the run stood still for two minutes (seen in tests/test_chaos.py).
HANDOVER_TIMEOUT = timedelta(seconds=30)
#: Analysis reads every batch's columns back from the artifact store.
ANALYSE_TIMEOUT = timedelta(minutes=10)
#: One sandbox batch (prefix or world); the budget reservation caps the exec inside it.
BATCH_START_TO_CLOSE = timedelta(hours=1)
#: Sandbox activities, the rehearsal and the analysis heartbeat every
#: ``forklab.contracts.experiment.HEARTBEAT_SECONDS``; a worker silent for longer than this is
#: presumed dead and the activity moves to another attempt.
BATCH_HEARTBEAT_TIMEOUT = timedelta(seconds=10)
#: The readout bounds its model call itself (worker setting, 30 s by default, at most 600 s)
#: and always answers; this only covers the artifact reads and writes around it.
READOUT_TIMEOUT = timedelta(minutes=11)
#: The evidence log bounds its own sending
#: (``forklab.activities.experiment.evidence_log.SEND_BUDGET_SECONDS``).
EVIDENCE_LOG_TIMEOUT = timedelta(minutes=2)
#: Cleanup must finish even when everything else went wrong.
CLEANUP_TIMEOUT = timedelta(minutes=5)

#: Transient faults (a worker died, a sandbox could not be created) are retried.
TRANSIENT_RETRY = RetryPolicy(
    initial_interval=timedelta(seconds=1),
    backoff_coefficient=2.0,
    maximum_interval=timedelta(seconds=20),
    maximum_attempts=5,
)
#: Sandbox units (prefix chunks, world batches) are retried by the workflow itself, one
#: activity execution per attempt, so each attempt gets a fresh, honestly charged
#: reservation (see ``forklab.workflows.experiment.attempts``).
ONE_ATTEMPT = RetryPolicy(maximum_attempts=1)
#: Attempts a sandbox unit gets before it fails.
UNIT_ATTEMPTS = 3
#: The longest a worker waits before it sends a heartbeat to the server (it throttles them).
HEARTBEAT_THROTTLE = timedelta(seconds=2)
#: How stale an attempt's last recorded heartbeat can be when its worker died: one beat
#: interval (``forklab.contracts.experiment.HEARTBEAT_SECONDS``) plus the throttle.
DEAD_ATTEMPT_LAG = HEARTBEAT_SECONDS + HEARTBEAT_THROTTLE.total_seconds()
#: Cleanup keeps trying: leaving sandboxes behind is the one outcome it must not have.
CLEANUP_RETRY = RetryPolicy(
    initial_interval=timedelta(seconds=1),
    backoff_coefficient=2.0,
    maximum_interval=timedelta(seconds=15),
    maximum_attempts=10,
)
