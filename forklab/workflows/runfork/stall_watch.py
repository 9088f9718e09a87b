"""A fork that stops on its way to the fork point fails instead of waiting for ever.

Inherited results are handed over in the parent's completion order (``call_match``),
and the signals, updates, timer fires and child outcomes of the prefix between them
(``prefix_messages``): a served call waits until everything the parent saw before it has
been handed over, and a timer fire or child outcome until the fork has started that
timer or child. The parent's code asks for the next one as soon as what came before it
has arrived. A fork whose code took another path before the fork point (an intervention
read early, a live call's other result, a changed build) may never ask for it, and then
waits on something that never comes: a later inherited result, or signals given at the
fork point, which arrive only once every inherited result has. Nothing in history would
ever wake it.

So while the fork owes anything of its prefix, its main coroutine runs beside a watch.
The watch wakes when the next thing owed cannot be handed over (an inherited call not
asked for, a due timer fire whose timer the fork has not started, a due child outcome
whose child it has not started) and none of the fork's own calls or children is out,
then lets the workflow run until everything it can do now is done (``SETTLE_PASSES``
passes of the workflow's condition checks, each run only after every ready coroutine
has). If it still cannot be handed over, it never will: the run fails as
``fork_prefix_diverged``, naming what was owed and the step (``experiments/runfork/owed.py``).
A due signal or update is always handed over (a name without a handler is buffered, as on
the parent), so it never stalls a fork. Under ``approximate`` the fork's calls are
matched by type, and watched alike.
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
    StartChildWorkflowInput,
    StartLocalActivityInput,
    WorkflowOutboundInterceptor,
)

from forklab.workflows.runfork.prefix_messages import Redelivery

with workflow.unsafe.imports_passed_through():
    from forklab.experiments.runfork.call_match import PrefixMatcher, stalled_message
    from forklab.experiments.runfork.owed import message_not_taken

#: Condition passes the fork is given to ask for the next inherited call once nothing of
#: its own is outstanding. Code of the parent's shape asks in the pass its results
#: arrive in; a few more cover waits on the workflow's own conditions in between.
SETTLE_PASSES = 8


class LiveCalls(WorkflowOutboundInterceptor):
    """Counts the activities, local activities and child workflows the run has started
    that have not finished: while one is out, its result may still lead the workflow to
    its next call. (Children served from the prefix never reach it.)"""

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

    async def start_child_workflow(
        self, input: StartChildWorkflowInput
    ) -> workflow.ChildWorkflowHandle[Any, Any]:
        self.out += 1  # from the start on: the start itself is a wait of the fork's own
        try:
            handle = await super().start_child_workflow(input)
        except BaseException:
            self.out -= 1
            raise

        def done(_: asyncio.Future[Any]) -> None:
            self.out -= 1

        handle.add_done_callback(done)
        return handle


class Owed:
    """What a fork owes its prefix: the inherited calls (``matcher``) and the messages,
    timer fires and child outcomes (``redelivery``), either None when there are none."""

    def __init__(self, matcher: PrefixMatcher | None, redelivery: Redelivery | None) -> None:
        self.matcher = matcher
        self.redelivery = redelivery

    def any(self) -> bool:
        return (self.matcher is not None and not self.matcher.all_delivered) or (
            self.redelivery is not None and self.redelivery.queue.owed > 0
        )

    def progress(self) -> int:
        """Moves whenever the fork gets nearer its fork point."""
        calls = self.matcher.progress if self.matcher is not None else 0
        messages = self.redelivery.queue.owed if self.redelivery is not None else 0
        return calls - messages

    def stuck(self) -> str | None:
        """Why the next thing owed cannot be handed over now (None: it can, or the fork is
        on its way to asking for it)."""
        r = self.redelivery
        if r is not None and (msg := r.due()) is not None:
            return None if r.ready_now() else message_not_taken(msg)
        step = self.matcher.next_unasked() if self.matcher is not None else None
        return stalled_message(step) if step is not None else None


async def _stalled(owed: Owed, live: LiveCalls) -> str:
    """Returns, with the sentence to fail with, once the fork has stopped short of taking
    the next thing it owes; runs until cancelled otherwise."""

    def waiting() -> bool:
        return live.out == 0 and owed.stuck() is not None

    def moved(mark: int) -> bool:
        return owed.progress() != mark or waiting()

    while True:
        await workflow.wait_condition(waiting)
        mark = owed.progress()
        for _ in range(SETTLE_PASSES):
            await workflow.wait_condition(lambda: True)  # after every ready coroutine ran
            if owed.progress() != mark or not waiting():
                break
        else:
            why = owed.stuck()
            assert why is not None
            return why
        if owed.progress() == mark:  # a call of its own is out: wait for it to end
            await workflow.wait_condition(functools.partial(moved, mark))


async def watched(
    main: Coroutine[Any, Any, Any],
    owed: Owed,
    live: LiveCalls,
    diverged: Callable[[str], ApplicationError],
) -> Any:
    """``main`` (the workflow's run), failed with ``diverged(why)`` (a
    ``fork_prefix_diverged``, naming the builds when the fork's is another) if it stops
    short of its fork point. A cancellation of the run reaches ``main`` as it would
    without the watch."""
    run = asyncio.ensure_future(main)
    watch = asyncio.ensure_future(_stalled(owed, live))
    try:
        await workflow.wait([run, watch], return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:
        watch.cancel()
        run.cancel()
        return await run
    if not run.done():
        run.cancel()
        raise diverged(watch.result())
    watch.cancel()
    return run.result()
