"""The guard's held-out batch, started in its box as the analysis starts.

Which episodes and worlds the guard's validation runs is known from the spec alone
(``forklab.experiments.experiment.analysis.held_out_plan.held_out_request``), so the box
need not wait until the training outcomes are read and the report is built up to the
guard: it runs beside those single-threaded steps, on the CPU they leave idle.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from types import TracebackType

from forklab.activities.sandbox.confine import kill_group
from forklab.activities.sandbox.workload_calls import WorkloadCalls
from forklab.contracts.experiment import BatchStatus, Progress
from forklab.experiments.experiment.analysis.guard import HeldOutRunner
from forklab.experiments.experiment.analysis.held_out_plan import (
    guard_world,
    held_out_request,
    holdout_size,
)
from forklab.experiments.experiment.bundle import BundleFile
from forklab.experiments.experiment.columnar import ColumnBatch
from forklab.experiments.experiment.spec import ExperimentSpec
from forklab.runtime.file_format import WorldPlan


def _complete(progress: Progress, world: str) -> bool:
    done = {
        b.chunk.index
        for b in progress.batches
        if b.world == world and b.status is BatchStatus.completed
    }
    return len(done) == progress.chunks


class HeldOutAhead:
    """A context whose ``runner`` answers the guard's held-out request from a batch started
    on entry, and runs any other request when it is made. The batch starts only when the
    spec has a guard world with an intervention and it and the baseline completed every
    chunk (else the report has no guard to validate: ``guard_policy``). On exit, a batch
    nobody asked for is killed and waited for."""

    def __init__(
        self,
        calls: WorkloadCalls,
        files: list[BundleFile],
        code_digest: str,
        spec: ExperimentSpec,
        progress: Progress,
    ) -> None:
        self._calls = calls
        self._files = files
        self._digest = code_digest
        self._spec = spec
        self._request: tuple[range, list[WorldPlan]] | None = None
        world = guard_world(spec)
        if (
            world is not None
            and world.intervention is not None
            and all(_complete(progress, name) for name in (spec.baseline.name, world.name))
        ):
            self._request = held_out_request(spec, world, holdout_size(spec))
        self._pool: ThreadPoolExecutor | None = None
        self._future: Future[ColumnBatch] | None = None
        self._lock = threading.Lock()
        self._boxes: list[int] = []
        self._closing = False
        self._taken = False

    def __enter__(self) -> HeldOutAhead:
        if self._request is not None:
            self._pool = ThreadPoolExecutor(1, thread_name_prefix="held-out")
            self._future = self._pool.submit(self._run)
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._pool is None:
            return
        if not self._taken:
            with self._lock:
                self._closing = True
                for pgid in self._boxes:
                    kill_group(pgid)
        self._pool.shutdown(wait=True)

    def _run(self) -> ColumnBatch:
        assert self._request is not None
        episodes, plans = self._request
        return self._calls.held_out(
            self._spec, episodes, plans, self._files, self._digest, self._started
        )

    def _started(self, pgid: int) -> None:
        with self._lock:
            self._boxes.append(pgid)
            if self._closing:  # the analysis ended before the box started
                kill_group(pgid)

    def _ahead(
        self, spec: ExperimentSpec, episodes: Sequence[int], plans: Sequence[WorldPlan]
    ) -> bool:
        request = self._request
        return (
            request is not None
            and spec == self._spec
            and list(episodes) == list(request[0])
            and list(plans) == request[1]
        )

    @property
    def runner(self) -> HeldOutRunner:
        def run(
            spec: ExperimentSpec, episodes: Sequence[int], plans: Sequence[WorldPlan]
        ) -> ColumnBatch:
            if self._future is not None and self._ahead(spec, episodes, plans):
                self._taken = True
                return self._future.result()
            return self._calls.held_out(spec, episodes, plans, self._files, self._digest)

        return run
