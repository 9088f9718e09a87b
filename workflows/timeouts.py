"""Every timeout and retry policy the experiment workflow uses, named in one place."""

from __future__ import annotations

from datetime import timedelta

from temporalio.common import RetryPolicy

#: The rehearsal runs the workload in a box on the worker; it is bounded by its sample.
REHEARSE_TIMEOUT = timedelta(minutes=10)
#: Short activities: snapshot, capacity, token, ledger, progress records.
SHORT_TIMEOUT = timedelta(minutes=2)
#: Analysis reads every batch's columns back from the artifact store.
ANALYSE_TIMEOUT = timedelta(minutes=10)
#: One sandbox batch (prefix or world); the budget reservation caps the exec inside it.
BATCH_START_TO_CLOSE = timedelta(hours=1)
#: Sandbox activities, the rehearsal and the analysis heartbeat every
#: ``activities.heartbeat.HEARTBEAT_SECONDS``; a worker silent for longer than this is
#: presumed dead and the activity moves to another attempt.
BATCH_HEARTBEAT_TIMEOUT = timedelta(seconds=10)
#: The readout bounds its model call itself (worker setting, 30 s by default, at most 600 s)
#: and always answers; this only covers the artifact reads and writes around it.
READOUT_TIMEOUT = timedelta(minutes=11)
#: The evidence log bounds its own sending (``activities.evidence_log.SEND_BUDGET_SECONDS``).
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
#: A batch spends budget, so it gets fewer attempts; each one is charged (see activities).
BATCH_RETRY = RetryPolicy(
    initial_interval=timedelta(seconds=1),
    backoff_coefficient=2.0,
    maximum_interval=timedelta(seconds=10),
    maximum_attempts=3,
)
#: Cleanup keeps trying: leaving sandboxes behind is the one outcome it must not have.
CLEANUP_RETRY = RetryPolicy(
    initial_interval=timedelta(seconds=1),
    backoff_coefficient=2.0,
    maximum_interval=timedelta(seconds=15),
    maximum_attempts=10,
)
