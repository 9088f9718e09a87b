"""The inbound side of the fork interceptor: a run's start (its marker verified, its
prefix loaded, its fork-point signals and redelivered messages set, the run failed if it
ends owing its prefix something), and a team member's or fork's live signals and updates
held until it may take them."""

from __future__ import annotations

import functools
from typing import Any

from temporalio import workflow
from temporalio.worker import ExecuteWorkflowInput as _ExecuteWorkflowInput
from temporalio.worker import (
    HandleSignalInput,
    HandleUpdateInput,
    WorkflowInboundInterceptor,
    WorkflowOutboundInterceptor,
)

from forklab.workflows.runfork.fork_builds import changed_build, current_build
from forklab.workflows.runfork.fork_failures import diverged
from forklab.workflows.runfork.fork_memo import memo_value
from forklab.workflows.runfork.fork_outbound import ForkOutbound
from forklab.workflows.runfork.fork_state import ForkState, current_fork, deliver_pending_signals
from forklab.workflows.runfork.parent_side_effects import ParentSideEffects
from forklab.workflows.runfork.prefix_load import (
    check_servable,
    inherits,
    load_prefix,
    verify_marker,
)
from forklab.workflows.runfork.prefix_messages import (
    MESSAGES_PATCH,
    Redelivery,
    held_until_fork_point,
)
from forklab.workflows.runfork.stall_watch import LiveCalls, Owed, watched

with workflow.unsafe.imports_passed_through():
    from forklab.contracts.runfork import (
        BASE_STEP_MEMO_KEY,
        FORK_POINT_QUERY,
        PREFIX_PAGE_HEADER,
        RECEIPT_HEADER,
        SIDE_EFFECTS_PATCH,
        TEAM_RELEASE_SIGNAL,
        ForkMarker,
        ForkPoint,
    )
    from forklab.experiments.runfork.call_match import PrefixMatcher
    from forklab.experiments.runfork.identity import lineage_root
    from forklab.experiments.runfork.owed import finished_owing
    from forklab.experiments.runfork.prefix_messages import MessageQueue
    from forklab.experiments.runfork.receipt import BoundaryMode


def _base_step(marker: ForkMarker | None) -> int:
    raw = memo_value(BASE_STEP_MEMO_KEY)
    if isinstance(raw, int):
        return raw
    return marker.base_step if marker is not None else 0


class ForkInbound(WorkflowInboundInterceptor):
    def init(self, outbound: WorkflowOutboundInterceptor) -> None:
        self._state = ForkState()
        self._state.inbound = self.next
        self._live = LiveCalls(outbound)
        super().init(ForkOutbound(self._live, self._state))

    async def execute_workflow(self, input: _ExecuteWorkflowInput) -> Any:
        state = self._state
        state.receipt_header = input.headers.get(RECEIPT_HEADER)
        state.passed_page = input.headers.get(PREFIX_PAGE_HEADER)
        await state.held().wait()  # a team fork's member runs once every member exists
        info = workflow.info()
        state.lineage_root = lineage_root(info.workflow_id, info.first_execution_run_id)
        marker = current_fork()
        state.base = _base_step(marker)
        if marker is not None:
            workflow.set_query_handler(FORK_POINT_QUERY, lambda: _fork_point(state))
            deferred = await verify_marker(marker)
            state.marker = marker
            if not deferred:
                state.lineage_root = marker.lineage_root
            state.changed_build = changed_build(marker.parent_build)
            if inherits(marker):
                prefix = await load_prefix(state, marker, deferred)
                state.lineage_root = marker.lineage_root  # verified by now
                check_servable(prefix, marker)
                matcher = state.matcher
                if matcher is not None and workflow.patched(SIDE_EFFECTS_PATCH):
                    state.side_effects = ParentSideEffects(state.seed, state.clock)
                    state.side_effects.begin(marker.base_step)
                if matcher is not None and state.messages.owed and workflow.patched(MESSAGES_PATCH):
                    state.redelivery = Redelivery(
                        state.messages,
                        lambda: matcher.last_handed_over or marker.base_step,
                        state.side_effects,
                    )
                    state.redelivery.start()
                else:  # none, or recorded before they were redelivered
                    state.messages = MessageQueue([])
            if not marker.continued:
                state.signals = list(marker.signals)
            if state.matcher is None or state.matcher.all_delivered:
                await deliver_pending_signals(state)  # nothing inherited: the fork point is now
            if marker.input_override is not None and not marker.continued:
                state.input_override = marker.input_override
                if state.matcher is None:  # keys are counted to find the overridden call
                    exact = marker.boundary is BoundaryMode.exact
                    state.matcher = PrefixMatcher([], [], exact=exact)
        state.loaded = True
        run = super().execute_workflow(input)
        owed = Owed(state.matcher, state.redelivery)
        try:
            # fails a fork that stops short of taking what it owes
            stalls = functools.partial(diverged, state)
            result = await (watched(run, owed, self._live, stalls) if owed.any() else run)
        except workflow.ContinueAsNewError:
            _check_nothing_owed(state)
            raise
        _check_nothing_owed(state)
        return result

    async def handle_signal(self, input: HandleSignalInput) -> None:
        if input.signal == TEAM_RELEASE_SIGNAL:  # ForkLab's own: it releases the hold
            await super().handle_signal(input)
            return
        await self._state.held().wait()  # a held member's handlers run nothing yet
        await super().handle_signal(await held_until_fork_point(input, self._holding()))

    async def handle_update_handler(self, input: HandleUpdateInput) -> Any:
        await self._state.held().wait()
        return await super().handle_update_handler(
            await held_until_fork_point(input, self._holding())
        )

    def _holding(self) -> Any:
        """What a live message waits for on a fork that inherits (None: nothing)."""
        if self._state.at_fork_point():
            return None
        marker = current_fork()
        if marker is None or not inherits(marker) or not workflow.patched(MESSAGES_PATCH):
            return None
        return self._state.at_fork_point


def _fork_point(state: ForkState) -> dict[str, Any]:
    build = current_build() or None
    point = ForkPoint(reached=state.at_fork_point(), drift=state.drift, build=build)
    return point.model_dump(mode="json")


def _check_nothing_owed(state: ForkState) -> None:
    """A run that ended (or continued-as-new) before its fork point owes its prefix
    something: its code is not the parent's, and what it did is no continuation of it."""
    matcher = state.matcher
    calls = matcher.owed if matcher is not None else 0
    if calls or state.messages.owed:
        first = matcher.first_owed() if matcher is not None else None
        raise diverged(state, finished_owing(first, calls, state.messages.pending))
