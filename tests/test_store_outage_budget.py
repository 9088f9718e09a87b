"""A store outage is not compute (issue 35, point 8): an object store that goes away while
a world group runs makes the attempt wait, within the worker's own bound
(``store_retry_seconds``), and an attempt that gives up waiting is charged the seconds its
sandbox ran, not its whole reservation.

A real S3 server (moto) behind a proxy the test cuts off, an in-process worker whose
artifact store is that S3, and a watcher that samples the run's boxes every 50 ms: the
budget the run spent must stay within what its boxes were seen running."""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from orchestration_lab import Lab, lab_settings, make_spec
from stores_lab import S3_ENV, Proxy, make_bucket, moto_server
from temporalio.client import WorkflowHandle, WorkflowHistory
from temporalio.testing import WorkflowEnvironment

from forklab.activities.sandbox.local import LocalSandboxBackend
from forklab.workers.experiment.worker import build_worker, cpu_pool
from forklab.workflows.experiment.messages import Status

#: How long one call waits out the outage before its attempt gives up.
RETRY_SECONDS = 3.0
#: The outage at least: longer than one wait (it lasts until an attempt gave up).
OUTAGE_SECONDS = 5.0
SAMPLE_SECONDS = 0.05


def _gave_up(history: WorkflowHistory) -> bool:
    return any(
        "unreachable" in e.activity_task_failed_event_attributes.failure.message
        for e in history.events
        if e.HasField("activity_task_failed_event_attributes")
    )


async def _until_an_attempt_gave_up(handle: WorkflowHandle[Any, Any], deadline: float) -> None:
    """Waits until an attempt of the run failed on the unreachable store."""
    end = time.monotonic() + deadline
    while not _gave_up(await handle.fetch_history()):
        assert time.monotonic() < end, "no attempt gave up on the unreachable store"
        await asyncio.sleep(0.2)


class BoxWatcher:
    """Samples the run's boxes every 50 ms; ``seconds`` is how long they were seen running."""

    def __init__(self, backend: LocalSandboxBackend, experiment: str) -> None:
        self.backend, self.labels = backend, {"forklab.experiment": experiment}
        self.seen: dict[str, tuple[float, float]] = {}
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._watch, daemon=True)
        self.thread.start()

    def _watch(self) -> None:
        while not self.stop.is_set():
            now = time.monotonic()
            for box in self.backend.list(self.labels):
                first, _ = self.seen.get(box, (now, now))
                self.seen[box] = (first, now)
            time.sleep(SAMPLE_SECONDS)

    def seconds(self) -> float:
        return sum(last - first + SAMPLE_SECONDS for first, last in self.seen.values())


async def test_an_object_store_outage_during_worlds_is_not_charged_as_compute(
    temporal_env: WorkflowEnvironment,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for key, value in S3_ENV.items():
        monkeypatch.setenv(key, value)
    bucket = f"forklab-{uuid.uuid4().hex[:8]}"
    with moto_server() as s3:
        make_bucket(s3, bucket)
        host, _, port = s3.removeprefix("http://").partition(":")
        proxy = Proxy(host, int(port))
        base = lab_settings(temporal_env, tmp_path / "home")
        settings = base.model_copy(
            update={
                "artifacts": f"s3://{bucket}/forklab",
                "s3_endpoint": f"http://{proxy.address}",
                "store_retry_seconds": RETRY_SECONDS,
            }
        )
        lab = Lab(client=temporal_env.client, settings=settings)
        spec = make_spec(params={"sandbox_sleep": 0.05})
        # a process pool of its own, started after the store's credentials are set: the
        # session's pool (started earlier) would read the store without them
        with cpu_pool() as cpu:
            async with build_worker(temporal_env.client, settings, cpu):
                handle, key = await lab.start(spec, batch_episodes=12)
                await lab.approve(handle, key)
                watcher = BoxWatcher(lab.backend, spec.id)
                try:
                    group = {
                        "forklab.experiment": spec.id,
                        "forklab.world": "baseline+boost+placebo",
                    }
                    deadline = time.monotonic() + 120
                    while not lab.backend.list(group):
                        assert time.monotonic() < deadline, "no world group started"
                        await asyncio.sleep(0.02)
                    proxy.down()  # the group's results (and the next group's inputs) wait
                    # at least OUTAGE_SECONDS, and until an attempt gave up waiting: a fixed
                    # outage can fall between two store calls on a loaded machine
                    await asyncio.sleep(OUTAGE_SECONDS)
                    await _until_an_attempt_gave_up(handle, deadline=120)
                    proxy.up()
                    result = await asyncio.wait_for(handle.result(), timeout=240)
                finally:
                    watcher.stop.set()
                    watcher.thread.join()
                    proxy.down()
        assert result.status is Status.completed, result.error
        assert [(w.name, w.status, w.episodes) for w in result.worlds] == [
            (name, "completed", 24) for name in ("baseline", "boost", "placebo")
        ]
        history = await handle.fetch_history()
        waited = [
            e.activity_task_failed_event_attributes.failure
            for e in history.events
            if e.HasField("activity_task_failed_event_attributes")
        ]
        assert any("unreachable" in f.message for f in waited), [f.message for f in waited]
        # what ran: the boxes seen (each sample adds at most 50 ms), plus a beat's rounding
        ran = watcher.seconds()
        spent = result.budget.spent_world_seconds
        assert spent <= ran + 0.5, (spent, ran, [f.message for f in waited])
