"""Heartbeats for long activities: a worker that dies is noticed within the heartbeat
timeout, and a cancellation reaches the activity at its next beat."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from temporalio import activity

from forklab.contracts.experiment import HEARTBEAT_SECONDS

_T = TypeVar("_T")


async def heartbeat_until(job: Awaitable[_T], details: Callable[[], Any] = lambda: None) -> _T:
    """Await ``job`` while heartbeating ``details()`` every ``HEARTBEAT_SECONDS``."""
    task = asyncio.ensure_future(job)
    while True:
        activity.heartbeat(details())
        done, _ = await asyncio.wait({task}, timeout=HEARTBEAT_SECONDS)
        if done:
            return task.result()
