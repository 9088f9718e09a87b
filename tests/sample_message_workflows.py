"""Workflows that receive messages, written the way Temporal's samples are (samples-python
``hello/hello_signal.py`` and ``hello/hello_update.py``), with an activity per message so
a run has steps between its messages. Each activity counts its executions per workflow id
in :class:`sample_workflows.Calls`."""

from __future__ import annotations

import asyncio
from datetime import timedelta

from temporalio import activity, workflow

with workflow.unsafe.imports_passed_through():
    from sample_workflows import Calls

_TIMEOUT = timedelta(seconds=30)


class GreetingActivities:
    def __init__(self, calls: Calls) -> None:
        self.calls = calls

    @activity.defn(name="compose_greeting")
    async def compose_greeting(self, name: str) -> str:
        self.calls.count()
        return f"Hello, {name}"

    @activity.defn(name="reserve")
    async def reserve(self, item: str) -> str:
        self.calls.count()
        return f"R-{item}"

    @activity.defn(name="confirm")
    async def confirm(self, reserved: list[str]) -> str:
        self.calls.count()
        return "confirmed " + ",".join(reserved)

    def all(self) -> list[object]:
        return [self.compose_greeting, self.reserve, self.confirm]


@workflow.defn(name="GreetingSignals")
class GreetingSignalsWorkflow:
    """``hello_signal``: greetings queued by a signal, each composed by an activity, until
    ``exit``. The order the handler saw them is the result's order."""

    def __init__(self) -> None:
        self._pending: asyncio.Queue[str] = asyncio.Queue()
        self._exit = False

    @workflow.run
    async def run(self) -> list[str]:
        greetings: list[str] = []
        while True:
            await workflow.wait_condition(lambda: not self._pending.empty() or self._exit)
            while not self._pending.empty():
                name = self._pending.get_nowait()
                greetings.append(
                    await workflow.execute_activity(
                        "compose_greeting", name, result_type=str, start_to_close_timeout=_TIMEOUT
                    )
                )
            if self._exit:
                return greetings

    @workflow.signal
    async def submit_greeting(self, name: str) -> None:
        await self._pending.put(name)

    @workflow.signal
    def exit(self) -> None:
        self._exit = True


@workflow.defn(name="OrderUpdates")
class OrderUpdatesWorkflow:
    """``hello_update``, with work in the handler: ``add_item`` reserves the item through
    an activity and answers with the reservation; ``close`` ends the order, which the
    workflow confirms through an activity once every handler has finished."""

    def __init__(self) -> None:
        self.reserved: list[str] = []
        self.closed = False

    @workflow.run
    async def run(self) -> str:
        await workflow.wait_condition(lambda: self.closed)
        await workflow.wait_condition(workflow.all_handlers_finished)
        return await workflow.execute_activity(
            "confirm", self.reserved, result_type=str, start_to_close_timeout=_TIMEOUT
        )

    @workflow.update
    async def add_item(self, item: str) -> str:
        reserved = await workflow.execute_activity(
            "reserve", item, result_type=str, start_to_close_timeout=_TIMEOUT
        )
        self.reserved.append(reserved)
        return reserved

    @workflow.update
    def close(self) -> str:
        self.closed = True
        return f"closed with {len(self.reserved)}"


@workflow.defn(name="OrderUpdates")
class OrderUpdatesWithoutAdd:
    """The same workflow type, its ``add_item`` handler gone (a changed build)."""

    def __init__(self) -> None:
        self.closed = False

    @workflow.run
    async def run(self) -> str:
        await workflow.wait_condition(lambda: self.closed)
        return await workflow.execute_activity(
            "confirm", [], result_type=str, start_to_close_timeout=_TIMEOUT
        )

    @workflow.update
    def close(self) -> str:
        self.closed = True
        return "closed"
