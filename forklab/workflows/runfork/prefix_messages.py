"""Redelivering the signals and updates a fork's parent received inside the prefix.

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
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from temporalio import workflow
from temporalio.api.common.v1 import Payload
from temporalio.bridge.proto.workflow_activation import SignalWorkflow
from temporalio.exceptions import ApplicationError
from temporalio.worker import HandleSignalInput, HandleUpdateInput

from forklab.contracts.errors import ForkErrorType

with workflow.unsafe.imports_passed_through():
    from forklab.experiments.runfork.prefix_messages import (
        MessageKind,
        MessageQueue,
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


async def _redeliver(queue: MessageQueue, handed_over: Callable[[], int]) -> None:
    while queue.pending is not None:
        await workflow.wait_condition(lambda: queue.due(handed_over()) is not None)
        msg = queue.pending
        if msg is None:
            return
        deliver(msg)
        queue.delivered()


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


def start_redelivery(queue: MessageQueue, handed_over: Callable[[], int]) -> None:
    """Redelivers ``queue``'s messages in order, each once ``handed_over()`` (the last
    inherited step handed over, chain-wide) reaches its position and the workflow waits."""
    if queue.pending is not None:
        loop = _loop()
        _top_level(loop, _redeliver(queue, handed_over), "forklab: redeliver the prefix's messages")
