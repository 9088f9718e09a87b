"""Signals a fork's workflow receives at its fork point (``forklab fork --signal``).

They are not sent through Temporal: the fork interceptor hands them to the workflow's own
handlers from the marker, right after the last inherited result (or at the start when
nothing is inherited). The marker is in the fork's memo, so a replay delivers them at the
same point, and the workflow sees them before it goes on from the boundary.
"""

from __future__ import annotations

import functools

from temporalio import workflow
from temporalio.common import _type_hints_from_func
from temporalio.exceptions import ApplicationError
from temporalio.worker import HandleSignalInput, WorkflowInboundInterceptor

from forklab.contracts.errors import ForkErrorType

with workflow.unsafe.imports_passed_through():
    from forklab.experiments.runfork.overrides import ForkSignal


async def deliver_signals(inbound: WorkflowInboundInterceptor, signals: list[ForkSignal]) -> None:
    """Each signal to the workflow's handler through ``inbound`` (the interceptors after
    ForkLab's), its argument decoded as a real signal's would be; a name the workflow has
    no handler for fails the fork."""
    converter = workflow.payload_converter()
    for sig in signals:
        handler = workflow.get_signal_handler(sig.name)
        if handler is None:
            raise ApplicationError(
                f"the workflow has no signal {sig.name!r} to deliver at the fork point",
                type=ForkErrorType.marker_invalid,
                non_retryable=True,
            )
        # a handler method comes bound (a partial over the workflow object): its
        # argument types are those of the method, past ``self``
        types, _ = _type_hints_from_func(
            handler.func if isinstance(handler, functools.partial) else handler
        )
        hints = types[: len(sig.args)] if types else None
        args = converter.from_payloads(converter.to_payloads(sig.args), hints) if sig.args else []
        await inbound.handle_signal(HandleSignalInput(signal=sig.name, args=args, headers={}))
