"""Workflows that receive messages, written the way Temporal's samples are (samples-python
``hello/hello_signal.py`` and ``hello/hello_update.py``), with an activity per message so
a run has steps between its messages. Each activity counts its executions per workflow id
in :class:`sample_workflows.Calls`."""

from __future__ import annotations

import asyncio
from datetime import timedelta

from pydantic import BaseModel
from temporalio import activity, workflow
from temporalio.exceptions import ApplicationError, ChildWorkflowError

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


class SleepInput(BaseModel):
    rounds: int = 4
    seconds: float = 0.3


@workflow.defn(name="SleepForDays")
class SleepForDaysWorkflow:
    """samples-python ``sleep_for_days``: send a mail, sleep, again; the sleeps take the
    three shapes a workflow waits in (``workflow.sleep``, ``asyncio.sleep``, a
    ``wait_condition`` that times out)."""

    def __init__(self) -> None:
        self.done = False

    @workflow.run
    async def run(self, inp: SleepInput) -> list[str]:
        sent: list[str] = []
        for i in range(inp.rounds):
            sent.append(
                await workflow.execute_activity(
                    "compose_greeting",
                    f"mail {i}",
                    result_type=str,
                    start_to_close_timeout=_TIMEOUT,
                )
            )
            if i % 3 == 0:
                await workflow.sleep(inp.seconds)
            elif i % 3 == 1:
                await asyncio.sleep(inp.seconds)
            else:
                try:
                    await workflow.wait_condition(lambda: self.done, timeout=inp.seconds)
                except TimeoutError:
                    sent.append("timed out")
        return sent


@workflow.defn(name="ComposeGreetingChild")
class ComposeGreetingChild:
    """samples-python ``hello_child_workflow``'s child; ``fail`` makes it fail."""

    @workflow.run
    async def run(self, name: str) -> str:
        if name == "fail":
            raise ApplicationError("the child refused", type="ChildRefused", non_retryable=True)
        return await workflow.execute_activity(
            "compose_greeting", name, result_type=str, start_to_close_timeout=_TIMEOUT
        )


@workflow.defn(name="GreetingParent")
class GreetingParentWorkflow:
    """A parent between activities: one child completes, one fails (and the parent goes
    on), child ids derived from the parent's workflow id as samples do."""

    @workflow.run
    async def run(self, name: str) -> list[str]:
        out = [
            await workflow.execute_activity(
                "reserve", name, result_type=str, start_to_close_timeout=_TIMEOUT
            )
        ]
        wid = workflow.info().workflow_id
        out.append(
            await workflow.execute_child_workflow(
                ComposeGreetingChild.run, name, id=f"{wid}-child-1"
            )
        )
        out.append(
            await workflow.execute_activity(
                "reserve", out[-1], result_type=str, start_to_close_timeout=_TIMEOUT
            )
        )
        try:
            await workflow.execute_child_workflow(
                ComposeGreetingChild.run, "fail", id=f"{wid}-child-2"
            )
        except ChildWorkflowError as err:
            out.append(f"child failed: {err.cause}")
        out.append(
            await workflow.execute_activity(
                "confirm", out, result_type=str, start_to_close_timeout=_TIMEOUT
            )
        )
        return out


@workflow.defn(name="SlowChildParent")
class SlowChildParentWorkflow:
    """Starts a child that is still running while the parent's next steps complete."""

    @workflow.run
    async def run(self, name: str) -> str:
        await workflow.execute_activity(
            "reserve", name, result_type=str, start_to_close_timeout=_TIMEOUT
        )
        child = await workflow.start_child_workflow(
            SleepForDaysWorkflow.run,
            SleepInput(rounds=1, seconds=1.5),
            id=f"{workflow.info().workflow_id}-slow",
        )
        await workflow.execute_activity(
            "reserve", "b", result_type=str, start_to_close_timeout=_TIMEOUT
        )
        await child
        return await workflow.execute_activity(
            "confirm", [], result_type=str, start_to_close_timeout=_TIMEOUT
        )


@workflow.defn(name="IdDerived")
class IdDerivedWorkflow:
    """An activity input derived from the workflow id (an order number, as samples derive
    child ids): a fork, whose workflow id is its own, asks with another input."""

    @workflow.run
    async def run(self) -> str:
        first = await workflow.execute_activity(
            "reserve",
            f"{workflow.info().workflow_id}-order",
            result_type=str,
            start_to_close_timeout=_TIMEOUT,
        )
        return await workflow.execute_activity(
            "confirm", [first], result_type=str, start_to_close_timeout=_TIMEOUT
        )


@workflow.defn(name="ReserveTwice")
class ReserveTwiceWorkflow:
    @workflow.run
    async def run(self) -> str:
        a = await workflow.execute_activity(
            "reserve", "a", result_type=str, start_to_close_timeout=_TIMEOUT
        )
        b = await workflow.execute_activity(
            "reserve", "b", result_type=str, start_to_close_timeout=_TIMEOUT
        )
        return await workflow.execute_activity(
            "confirm", [a, b], result_type=str, start_to_close_timeout=_TIMEOUT
        )


@workflow.defn(name="ReserveTwice")
class ReserveTwiceChanged:
    """A later build of ``ReserveTwice``: its first reservation asks for another item."""

    @workflow.run
    async def run(self) -> str:
        a = await workflow.execute_activity(
            "reserve", "a2", result_type=str, start_to_close_timeout=_TIMEOUT
        )
        b = await workflow.execute_activity(
            "reserve", "b", result_type=str, start_to_close_timeout=_TIMEOUT
        )
        return await workflow.execute_activity(
            "confirm", [a, b], result_type=str, start_to_close_timeout=_TIMEOUT
        )


@workflow.defn(name="SideEffects")
class SideEffectsWorkflow:
    """Activity inputs made of ``workflow.uuid4()``, ``workflow.random()`` and
    ``workflow.now()``, drawn between the steps; one more id after the last step."""

    @workflow.run
    async def run(self) -> list[str]:
        out = []
        for item in (
            str(workflow.uuid4()),
            str(workflow.random().randint(0, 10**9)),
            workflow.now().isoformat(),
        ):
            out.append(
                await workflow.execute_activity(
                    "reserve", item, result_type=str, start_to_close_timeout=_TIMEOUT
                )
            )
        out.append(str(workflow.uuid4()))
        return out


@workflow.defn(name="OrderUpdates")
class OrderUpdatesBrokenAdd:
    """The same workflow type, its ``add_item`` now broken (a changed build): it raises
    an error that is no workflow failure, which fails the workflow task on a real run."""

    def __init__(self) -> None:
        self.closed = False

    @workflow.run
    async def run(self) -> str:
        await workflow.wait_condition(lambda: self.closed)
        return "closed"

    @workflow.update
    def add_item(self, item: str) -> str:
        raise RuntimeError(f"no stock for {item}")

    @workflow.update
    def close(self) -> str:
        self.closed = True
        return "closed"


class NotifyInput(BaseModel):
    #: the workflow told of each reservation (a ``GreetingSignals`` run)
    receiver: str
    items: list[str]
    #: a signal that fails (its target is not running) is caught and the run goes on
    tolerate_failure: bool = False


@workflow.defn(name="NotifyReservations")
class NotifyReservationsWorkflow:
    """Reserves each item and tells another workflow of it by a signal (the SDK's
    ``get_external_workflow_handle(...).signal``), then confirms: with two items, a step,
    a signal sent, a step, a signal sent, a step."""

    @workflow.run
    async def run(self, inp: NotifyInput) -> str:
        reserved: list[str] = []
        receiver = workflow.get_external_workflow_handle(inp.receiver)
        for item in inp.items:
            reserved.append(
                await workflow.execute_activity(
                    "reserve", item, result_type=str, start_to_close_timeout=_TIMEOUT
                )
            )
            try:
                await receiver.signal("submit_greeting", reserved[-1])
            except Exception:
                if not inp.tolerate_failure:
                    raise
                reserved.append("unsent")
        return await workflow.execute_activity(
            "confirm", reserved, result_type=str, start_to_close_timeout=_TIMEOUT
        )


@workflow.defn(name="CancelsAnother")
class CancelsAnotherWorkflow:
    """Reserves, asks another workflow to cancel
    (``get_external_workflow_handle(...).cancel()``), reserves again and confirms."""

    @workflow.run
    async def run(self, receiver: str) -> str:
        first = await workflow.execute_activity(
            "reserve", "a", result_type=str, start_to_close_timeout=_TIMEOUT
        )
        await workflow.get_external_workflow_handle(receiver).cancel()
        second = await workflow.execute_activity(
            "reserve", "b", result_type=str, start_to_close_timeout=_TIMEOUT
        )
        return await workflow.execute_activity(
            "confirm", [first, second], result_type=str, start_to_close_timeout=_TIMEOUT
        )
