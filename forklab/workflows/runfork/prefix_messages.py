"""Redelivering the signals and updates a fork's parent received inside the prefix, and
the fires, outcomes and acknowledgements of the timers, children and signals it sent there.

Each message reaches the workflow's own handler through the same paths a real one takes
(the worker's interceptor chain, the handler's argument types, a dynamic handler when the
workflow has no named one), at the point the parent received it: once the inherited
results before it have been handed over and the workflow has gone on to wait for
something, before the next inherited result (``experiments/runfork/prefix_messages.py``).
The messages arrive in the ``forklab.fetch_prefix`` result in the fork's own history, so a
replay redelivers them at the same points.

A signal goes through the SDK's own signal path, so the fork treats it as the parent's
SDK did: a name with no handler (named or dynamic) is buffered until one is set, and
arguments that do not decode are dropped with the SDK's warning — what any sender could
make a parent receive, handled on the fork as on the parent, never wedging it.

A message sent to the fork itself (a live one) waits, before its handler runs, until the
fork is at its fork point: every inherited result and message handed over. On the parent
it came after them; delivered earlier it would land inside the prefix, out of place.

An update runs its handler with the recorded arguments, not its validator (the parent
accepted it); its result goes nowhere, since its caller got the parent's answer. A handler
that fails as a workflow failure would is the update's failure, as on the parent; the
workflow goes on. An update the fork cannot hand over as the parent did (the parent
accepted it, and the fork's code has no handler for it, cannot decode its arguments, or
raises something else) fails the fork at once, naming the update and the step, instead of
failing its workflow task for ever.

The Python SDK has no public call to hand a workflow a message that did not come from the
server; this module uses the workflow event loop's own signal path, handler table and
argument conversion (``temporalio.worker._workflow_instance``), and only here.
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import logging
from collections import deque
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar, cast

from temporalio import workflow
from temporalio.api.common.v1 import Payload
from temporalio.api.failure.v1 import Failure
from temporalio.bridge.proto.workflow_activation import SignalWorkflow
from temporalio.converter import DefaultFailureConverter
from temporalio.exceptions import ApplicationError, ChildWorkflowError, RetryState
from temporalio.worker import HandleSignalInput, HandleUpdateInput, StartChildWorkflowInput

from forklab.contracts.errors import ForkErrorType
from forklab.workflows.runfork.parent_side_effects import ParentSideEffects

with workflow.unsafe.imports_passed_through():
    from forklab.experiments.runfork.prefix_messages import (
        MessageKind,
        MessageQueue,
        Ordinals,
        PrefixMessage,
    )

#: Forks recorded since messages are redelivered (and live ones held until the fork
#: point); forks recorded before it replay without either.
MESSAGES_PATCH = "forklab-prefix-messages"
#: The header that tells the fork interceptor a message is a redelivered one (removed
#: before the workflow's interceptors and handler see it).
REDELIVERED_HEADER = "forklab-redelivered"

_Input = TypeVar("_Input", HandleSignalInput, HandleUpdateInput)


class _NoEventGroupNote(logging.Filter):
    """A redelivered signal has no event of its own in the fork's history; the SDK then
    groups its handler's commands under no event group and says so at warning level, once
    per signal. That is expected here, not a fault worth a log line."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "implicit Event Group for signal with invalid originating" not in str(record.msg)


logging.getLogger("temporalio.workflow").addFilter(_NoEventGroupNote())


def _payload(b64: str) -> Payload:
    return Payload.FromString(base64.b64decode(b64))


def _failed(msg: PrefixMessage, why: str) -> ApplicationError:
    return ApplicationError(
        f"the parent's {msg.kind.value} {msg.name[:100]!r} (after step {msg.position}) cannot "
        f"be redelivered to the fork: {why}",
        type=ForkErrorType.prefix_diverged,
        non_retryable=True,
    )


def _loop() -> Any:
    """The running workflow's event loop (the SDK's workflow instance)."""
    return asyncio.get_running_loop()


def _handler_args(loop: Any, msg: PrefixMessage, defn: Any) -> list[Any]:
    try:
        return list(
            loop._process_handler_args(
                msg.name,
                [_payload(a) for a in msg.args_b64],
                defn.name,
                defn.arg_types,
                defn.dynamic_vararg,
            )
        )
    except Exception as exc:  # whatever the payload converter raises on these bytes
        raise _failed(
            msg, f"its arguments do not decode as the handler's ({type(exc).__name__})"
        ) from None


def _update_definition(loop: Any, msg: PrefixMessage) -> Any:
    defn = loop._updates.get(msg.name) or loop._updates.get(None)
    if defn is None:
        raise _failed(msg, "the workflow has no update handler of that name")
    return defn


def _top_level(loop: Any, coro: Coroutine[Any, Any, None], name: str) -> None:
    """Runs ``coro`` as the SDK runs a handler: a failure exception fails the workflow."""
    loop.create_task(loop._run_top_level_workflow_function(coro), name=name)


def deliver(msg: PrefixMessage) -> None:
    """Hands ``msg`` to the workflow's handler, in a task of its own as the SDK does."""
    loop = _loop()
    headers = {k: _payload(v) for k, v in msg.headers_b64.items()}
    headers[REDELIVERED_HEADER] = Payload()
    if msg.kind is MessageKind.signal:
        job = SignalWorkflow(
            signal_name=msg.name, input=[_payload(a) for a in msg.args_b64], headers=headers
        )
        loop._apply_signal_workflow(job)
        return
    args = _handler_args(loop, msg, _update_definition(loop, msg))
    update = HandleUpdateInput(id=msg.update_id or "", update=msg.name, args=args, headers=headers)
    _top_level(loop, _run_update(loop, msg, update), f"forklab update: {msg.name}")


async def _run_update(loop: Any, msg: PrefixMessage, update: HandleUpdateInput) -> None:
    workflow._set_current_update_info(workflow.UpdateInfo(id=update.id, name=update.update))
    try:
        await loop._inbound.handle_update_handler(update)
    except Exception as exc:
        if loop.workflow_is_failure_exception(exc):
            return  # the update failed for its caller on the parent too; the run goes on
        raise _failed(msg, f"its handler raised {type(exc).__name__}") from None


async def held_until_fork_point(input: _Input, at_fork_point: Callable[[], bool] | None) -> _Input:
    """A message's handler input once it may run: a redelivered one at once (its header
    removed); a live one on a fork that inherits, once ``at_fork_point()`` (None: the run
    inherits nothing, nothing is held)."""
    if REDELIVERED_HEADER in input.headers:
        headers = {k: v for k, v in input.headers.items() if k != REDELIVERED_HEADER}
        return dataclasses.replace(input, headers=headers)
    if at_fork_point is not None and not at_fork_point():
        await workflow.wait_condition(at_fork_point)
    return input


class _ServedTimer(asyncio.TimerHandle):
    """A timer the workflow started inside the prefix while one of its duration is still
    to fire there: no command is sent. It fires when the parent's timer fired, or, once no
    inherited timer of its duration is left to fire, it becomes a real timer."""

    def __init__(
        self, loop: Any, delay: float, options: Any, callback: Any, args: Any, context: Any
    ) -> None:
        super().__init__(loop.time() + delay, callback, args, loop, context)
        self._on = (loop, options, callback, tuple(args), context)
        self._delay = delay
        self.real: Any = None

    def fire(self) -> None:
        loop, _, callback, args, context = self._on
        loop.call_soon(callback, *args, context=context)

    def start_real(self, real_timer: Any) -> None:
        _, options, callback, args, context = self._on
        # its whole duration (the clock of a prefix is the parent's, not a measure of
        # how long this timer has waited)
        self.real = real_timer(self._delay, options, callback, *args, context=context)

    def cancel(self) -> None:
        # no command to cancel: the SDK's own cancel would look for one
        if self.real is not None:
            self.real.cancel()
        self._cancelled = True


class _InheritedChild(workflow.ChildWorkflowHandle[Any, Any]):
    """A child workflow that closed inside the prefix: not started again; its recorded
    result (or failure) arrives at its place among the inherited results."""

    def __init__(self, outcome: Coroutine[Any, Any, Any], child_id: str) -> None:
        super().__init__(outcome)
        self._child_id = child_id

    @property
    def id(self) -> str:
        return self._child_id

    @property
    def first_execution_run_id(self) -> str | None:
        return None

    async def signal(self, *args: Any, **kwargs: Any) -> None:
        raise ApplicationError(
            f"child workflow {self._child_id[:100]!r} closed on the parent inside the fork's "
            "prefix: it cannot be signalled",
            type=ForkErrorType.prefix_diverged,
            non_retryable=True,
        )


class Redelivery:
    """Hands the prefix's messages, timers and children over in the parent's order, each
    once ``handed_over()`` (the last inherited step handed over, chain-wide) reaches its
    position and the workflow waits; timers and children once the fork asked for them."""

    def __init__(
        self,
        queue: MessageQueue,
        handed_over: Callable[[], int],
        side_effects: ParentSideEffects | None = None,
    ) -> None:
        self.queue = queue
        self._handed_over = handed_over
        self._side_effects = side_effects
        self._timers: dict[int, deque[_ServedTimer]] = {}
        self._children: dict[tuple[str, int], asyncio.Future[PrefixMessage]] = {}
        self._ordinals = Ordinals()
        self._sent: dict[tuple[str, int], asyncio.Future[PrefixMessage]] = {}
        self._sent_ordinals = Ordinals()
        self._real_timer: Any = None

    def start(self) -> None:
        loop = _loop()
        self._real_timer = loop._timer_impl
        loop._timer_impl = self._timer  # workflow.sleep, asyncio.sleep, timeouts
        _top_level(loop, self._run(), "forklab: redeliver the prefix's messages")

    def _timer(
        self, delay: float, options: Any, callback: Any, *args: Any, context: Any = None
    ) -> asyncio.TimerHandle:
        ns = int(delay * 1e9)
        if not self.queue.owes_timer(ns):
            return cast(
                asyncio.TimerHandle,
                self._real_timer(delay, options, callback, *args, context=context),
            )
        served = _ServedTimer(_loop(), delay, options, callback, args, context)
        self._timers.setdefault(ns, deque()).append(served)
        return served

    def _waiting_timer(self, ns: int) -> _ServedTimer | None:
        waiting = self._timers.get(ns)
        while waiting and waiting[0].cancelled():
            waiting.popleft()
        return waiting[0] if waiting else None

    def child(
        self, input: StartChildWorkflowInput
    ) -> workflow.ChildWorkflowHandle[Any, Any] | None:
        """The handle of a child that closed inside the prefix (None: start it)."""
        ordinal = self._ordinals.next(input.workflow, skip_taken=False)
        if not self.queue.owes_child(input.workflow, ordinal):
            return None
        outcome: asyncio.Future[PrefixMessage] = _loop().create_future()
        self._children[(input.workflow, ordinal)] = outcome
        return _InheritedChild(_child_outcome(outcome, input), input.id)

    def sent_signal(self, name: str) -> Coroutine[Any, Any, None] | None:
        """What the fork's send of signal ``name`` awaits instead of sending it, when the
        parent's matching send (the k-th of that name) was acknowledged inside the prefix:
        it completes there. None: send it."""
        ordinal = self._sent_ordinals.next(name, skip_taken=False)
        if not self.queue.owes_sent_signal(name, ordinal):
            return None
        acknowledged: asyncio.Future[PrefixMessage] = _loop().create_future()
        self._sent[(name, ordinal)] = acknowledged
        return _acknowledged(acknowledged)

    def _ready(self, msg: PrefixMessage) -> bool:
        if self.queue.due(self._handed_over()) is None:
            return False
        if msg.kind is MessageKind.timer:
            return self._waiting_timer(msg.duration_ns or 0) is not None
        if msg.kind is MessageKind.child:
            return (msg.name, msg.ordinal or 0) in self._children
        if msg.kind is MessageKind.sent_signal:
            return (msg.name, msg.ordinal or 0) in self._sent
        return True

    def due(self) -> PrefixMessage | None:
        """The next message, once it is due (the steps before it handed over)."""
        return self.queue.due(self._handed_over())

    def ready_now(self) -> bool:
        """The next message is due and can be handed over now."""
        msg = self.queue.pending
        return msg is not None and self._ready(msg)

    async def _run(self) -> None:
        while (msg := self.queue.pending) is not None:
            await workflow.wait_condition(lambda m=msg: self._ready(m))  # type: ignore[misc]
            if self._side_effects is not None:  # the parent's clock when it got this
                self._side_effects.at_time(msg.time_ns)
            if msg.kind is MessageKind.timer:
                ns = msg.duration_ns or 0
                timer = self._waiting_timer(ns)
                assert timer is not None
                self._timers[ns].popleft()
                timer.fire()
            elif msg.kind is MessageKind.child:
                self._children.pop((msg.name, msg.ordinal or 0)).set_result(msg)
            elif msg.kind is MessageKind.sent_signal:
                self._sent.pop((msg.name, msg.ordinal or 0)).set_result(msg)
            else:
                deliver(msg)
            self.queue.delivered()
            self._start_real_timers()

    def _start_real_timers(self) -> None:
        """Timers still waiting whose duration has no inherited timer left to fire start
        for real (the parent's was still running at the boundary, or was cancelled)."""
        for ns, waiting in self._timers.items():
            if waiting and not self.queue.owes_timer(ns):
                for timer in waiting:
                    if not timer.cancelled():
                        timer.start_real(self._real_timer)
                waiting.clear()


async def _acknowledged(acknowledged: asyncio.Future[PrefixMessage]) -> None:
    await acknowledged


async def _child_outcome(
    outcome: asyncio.Future[PrefixMessage], input: StartChildWorkflowInput
) -> Any:
    msg = await outcome
    converter = workflow.payload_converter()
    if msg.failure_b64 is not None:
        failure = Failure.FromString(base64.b64decode(msg.failure_b64))
        error = ChildWorkflowError(
            "child workflow execution failed",
            namespace=workflow.info().namespace,
            workflow_id=input.id,
            run_id="",
            workflow_type=input.workflow,
            initiated_event_id=0,
            started_event_id=0,
            retry_state=RetryState.NON_RETRYABLE_FAILURE,
        )
        error.__cause__ = DefaultFailureConverter().from_failure(failure, converter)
        raise error
    if msg.result_b64 is None:
        return None
    payload = _payload(msg.result_b64)
    return (
        converter.from_payload(payload, input.ret_type)
        if input.ret_type
        else converter.from_payload(payload)
    )
