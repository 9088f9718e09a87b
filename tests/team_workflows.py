"""A parent that starts a child workflow, shaped like Temporal's samples (``hello_child_workflow``
with an activity before and after, and a child that waits for a signal from outside), and a
workflow with calls in parallel, for the team reader's tests. Loaded by the tests' worker only."""

from __future__ import annotations

import asyncio
from datetime import timedelta

from temporalio import activity, workflow


@activity.defn(name="compose_greeting")
async def compose_greeting(name: str) -> str:
    return f"Hello, {name}!"


@workflow.defn(name="GreetingChild")
class GreetingChild:
    def __init__(self) -> None:
        self._go = False

    @workflow.signal
    def go(self) -> None:
        self._go = True

    @workflow.run
    async def run(self, name: str) -> str:
        first = await workflow.execute_activity(
            compose_greeting, name, start_to_close_timeout=timedelta(seconds=10)
        )
        await workflow.wait_condition(lambda: self._go, timeout=timedelta(minutes=5))
        second = await workflow.execute_activity(
            compose_greeting, first, start_to_close_timeout=timedelta(seconds=10)
        )
        return second


@workflow.defn(name="GreetingParent")
class GreetingParent:
    @workflow.run
    async def run(self, name: str) -> str:
        who = await workflow.execute_activity(
            compose_greeting, name, start_to_close_timeout=timedelta(seconds=10)
        )
        answer: str = await workflow.execute_child_workflow(
            GreetingChild.run, who, id=f"{workflow.info().workflow_id}-child"
        )
        return await workflow.execute_activity(
            compose_greeting, answer, start_to_close_timeout=timedelta(seconds=10)
        )


@activity.defn(name="pause")
async def pause(seconds: float) -> float:
    await asyncio.sleep(seconds)
    return seconds


@workflow.defn(name="ParallelListener")
class ParallelListener:
    """Two calls in parallel, the first scheduled finishing last, and a signal that
    arrives between their completions: the call scheduled second is step 1."""

    def __init__(self) -> None:
        self.heard = 0

    @workflow.signal
    def hear(self) -> None:
        self.heard += 1

    @workflow.run
    async def run(self, slow: float) -> int:
        timeout = timedelta(seconds=30)
        await asyncio.gather(
            workflow.execute_activity(pause, slow, start_to_close_timeout=timeout),
            workflow.execute_activity(pause, 0.0, start_to_close_timeout=timeout),
        )
        return self.heard
