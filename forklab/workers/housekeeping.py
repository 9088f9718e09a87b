"""What a worker does between runs: free the disk of workspace layers no run needs.

A run's cleanup releases its pins on the host it runs on and collects there; the other
hosts that pinned layers for it drop those pins when they next collect (they read the
run's end mark in the shared store). A host that runs nothing more would keep them, so
the worker also collects on its own every ``Settings.collect_seconds`` while it runs.
Its lines go to the worker's output, as the worker's other lines do.
"""

from __future__ import annotations

import asyncio
import sys

from forklab.activities.sandbox.base import SandboxBackend, WorkspaceBackend
from forklab.workers.config import Settings
from forklab.workers.stores import artifact_store

_MIB = 1 << 20


def collect_once(backend: WorkspaceBackend, settings: Settings) -> None:
    """Drop the pins of runs the store marks as ended, then collect (in this thread).
    Housekeeping: a failure is reported and the next round tries again."""
    try:
        # the store is opened only when some run pins layers here
        ended = backend.release_ended_runs(lambda runs: artifact_store(settings).ended(runs))
        if ended:
            runs = "1 ended run" if len(ended) == 1 else f"{len(ended)} ended runs"
            print(f"housekeeping: released the pins of {runs}", flush=True)
    except Exception as exc:  # the store out of reach: collect what this host knows
        print(f"housekeeping: runs that ended elsewhere not checked: {exc}", file=sys.stderr)
    try:
        result = backend.collect_layers()
    except Exception as exc:
        print(f"housekeeping: layer collection failed: {exc}", file=sys.stderr)
        return
    if result.removed:
        n = len(result.removed)
        layers = "1 workspace layer" if n == 1 else f"{n} workspace layers"
        print(f"housekeeping: collected {layers} ({result.bytes_freed / _MIB:.1f} MiB)", flush=True)


async def collect_until(stop: asyncio.Event, settings: Settings, backend: SandboxBackend) -> None:
    """Collect every ``settings.collect_seconds`` until ``stop`` is set (never when it is
    0, or when the backend keeps no workspace layers)."""
    if not settings.collect_seconds or not isinstance(backend, WorkspaceBackend):
        return
    while True:
        try:
            await asyncio.wait_for(stop.wait(), settings.collect_seconds)
            return
        except TimeoutError:
            await asyncio.to_thread(collect_once, backend, settings)
