"""A fork that stops on its way to the fork point fails instead of waiting for ever.

Inherited results are handed over in the parent's completion order (``call_match``), so
a served call waits until the fork has asked for every inherited call the parent saw
complete before it. The parent's code asks for the next one as soon as the results
before it have arrived. A fork whose code took another path before the fork point (an
intervention read early, a live call's other result) may never ask for it, and then
waits on something that never comes: a later inherited result, or signals given at the
fork point, which arrive only once every inherited result has. Nothing in history would
ever wake it.

So while inherited results are owed, the fork's main coroutine runs beside a watch. The
watch wakes when the next result in the parent's order has not been asked for and none
of the fork's own calls is outstanding, then lets the workflow run until everything it
can do now is done (``SETTLE_PASSES`` passes of the workflow's condition checks, each run
only after every ready coroutine has). If the fork has still not asked for it, it never
will: the run fails as ``fork_prefix_diverged``, naming the step.

A message, timer fire or child outcome of the prefix that is due to be handed over
(``prefix_messages.Redelivery``) counts as progress on its way: the workflow may be
waiting for it before it asks. Only an exact boundary is watched: under ``approximate``
the fork's calls may not line up with the parent's at all.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable, Coroutine
from typing import Any

from temporalio import workflow
from temporalio.exceptions import ApplicationError
from temporalio.worker import (
    StartActivityInput,
    StartLocalActivityInput,
    WorkflowOutboundInterceptor,
)

from forklab.contracts.errors import ForkErrorType

with workflow.unsafe.imports_passed_through():
    from forklab.experiments.runfork.call_match import PrefixMatcher, stalled_message

#: Condition passes the fork is given to ask for the next inherited call once nothing of
#: its own is outstanding. Code of the parent's shape asks in the pass its results
#: arrive in; a few more cover waits on the workflow's own conditions in between.
SETTLE_PASSES = 8


class LiveCalls(WorkflowOutboundInterceptor):
    """Counts the activities (and local activities) the run has started that have not
    finished: while one is out, its result may still lead the workflow to its next call."""

    def __init__(self, next: WorkflowOutboundInterceptor) -> None:
        super().__init__(next)
        self.out = 0

    def _count(self, handle: workflow.ActivityHandle[Any]) -> workflow.ActivityHandle[Any]:
        self.out += 1

        def done(_: asyncio.Future[Any]) -> None:
            self.out -= 1

        handle.add_done_callback(done)
        return handle

    def start_activity(self, input: StartActivityInput) -> workflow.ActivityHandle[Any]:
        return self._count(super().start_activity(input))

    def start_local_activity(self, input: StartLocalActivityInput) -> workflow.ActivityHandle[Any]:
        return self._count(super().start_local_activity(input))


async def _stalled(
    matcher: PrefixMatcher, live: LiveCalls, handing_over: Callable[[], bool]
) -> str:
    """Returns, with the sentence to fail with, once the fork has stopped short of asking
    for the next inherited call; runs until cancelled otherwise. While ``handing_over()``
    a message, timer fire or child outcome of the prefix is on its way to the workflow,
    which may be what it waits for before it asks."""

    def waiting() -> bool:
        return matcher.next_unasked() is not None and live.out == 0 and not handing_over()

    def moved(mark: int) -> bool:
        return matcher.progress != mark or waiting()

    while True:
        await workflow.wait_condition(waiting)
        mark = matcher.progress
        for _ in range(SETTLE_PASSES):
            await workflow.wait_condition(lambda: True)  # after every ready coroutine ran
            if matcher.progress != mark or not waiting():
                break
        else:
            step = matcher.next_unasked()
            assert step is not None
            return stalled_message(step)
        if matcher.progress == mark:  # a call of its own is out: wait for it to end
            await workflow.wait_condition(functools.partial(moved, mark))


async def watched(
    main: Coroutine[Any, Any, Any],
    matcher: PrefixMatcher,
    live: LiveCalls,
    handing_over: Callable[[], bool],
) -> Any:
    """``main`` (the workflow's run), failed as ``fork_prefix_diverged`` if it stops
    short of its fork point. A cancellation of the run reaches ``main`` as it would
    without the watch."""
    run = asyncio.ensure_future(main)
    watch = asyncio.ensure_future(_stalled(matcher, live, handing_over))
    try:
        await workflow.wait([run, watch], return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:
        watch.cancel()
        run.cancel()
        return await run
    if not run.done():
        run.cancel()
        raise ApplicationError(
            watch.result(), type=ForkErrorType.prefix_diverged, non_retryable=True
        )
    watch.cancel()
    return run.result()
