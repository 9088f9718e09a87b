"""How the fork interceptor runs ForkLab's own activities (``forklab.verify_fork``,
``forklab.fetch_prefix``, ``forklab.step_decision``): their timeout and retry policy."""

from __future__ import annotations

from datetime import timedelta

from temporalio.common import RetryPolicy

FORK_ACTIVITY_TIMEOUT = timedelta(minutes=2)
FORK_RETRY = RetryPolicy(maximum_attempts=5, maximum_interval=timedelta(seconds=10))
