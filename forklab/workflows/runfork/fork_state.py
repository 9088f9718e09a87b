"""What the fork interceptor keeps per workflow run (``ForkState``: the marker, the
inherited prefix, the calls made so far), the run's fork marker as its memo carries it
(``current_fork``), and the signals a fork is given at its fork point."""

from __future__ import annotations

from typing import Any

from temporalio import workflow
from temporalio.api.common.v1 import Payload
from temporalio.exceptions import ApplicationError
from temporalio.worker import WorkflowInboundInterceptor

from forklab.contracts.errors import ForkErrorType
from forklab.workflows.runfork.fork_memo import memo_value
from forklab.workflows.runfork.fork_signals import deliver_signals
from forklab.workflows.runfork.parent_side_effects import ParentSideEffects
from forklab.workflows.runfork.prefix_messages import Redelivery
from forklab.workflows.runfork.team_messages import Hold, held_team

with workflow.unsafe.imports_passed_through():
    from pydantic import ValidationError

    from forklab.contracts.runfork import MARKER_MEMO_KEY, ForkMarker
    from forklab.experiments.runfork.call_match import PrefixMatcher
    from forklab.experiments.runfork.overrides import ForkSignal, InputOverride
    from forklab.experiments.runfork.prefix_messages import MessageQueue
    from forklab.experiments.runfork.steps import Step
    from forklab.experiments.validation_text import first_error


class ForkState:
    """Per workflow run: the marker, the inherited prefix, the calls made so far."""

    def __init__(self) -> None:
        self.marker: ForkMarker | None = None
        #: the inherited steps, handed out by what each call is (None: nothing inherited)
        self.matcher: PrefixMatcher | None = None
        #: the inherited steps as fetched (an experiment's tool faults read their results)
        self.inherited: list[Step] = []
        #: the signals, updates, timer fires and child outcomes the parent received inside
        #: the prefix, to hand over again
        self.messages = MessageQueue([])
        #: the prefix is loaded (or there is none) and the fork-point signals are set
        self.loaded = False
        #: hands the prefix's messages, timers and children over (None: there are none)
        self.redelivery: Redelivery | None = None
        #: inherited calls an approximate boundary served with another input than the
        #: parent's (one sentence each)
        self.drift: list[str] = []
        #: the build running this fork, when it is not one that recorded the prefix
        self.changed_build: str | None = None
        #: the parent's random seed and clock, while the prefix is handed over
        self.side_effects: ParentSideEffects | None = None
        self.seed: int | None = None
        self.clock: dict[int, int] = {}
        #: the call still to run with the operator's input (None: none, or done)
        self.input_override: InputOverride | None = None
        #: signals still to deliver at the fork point, and where to deliver them
        self.signals: list[ForkSignal] = []
        self.inbound: WorkflowInboundInterceptor | None = None
        self.recorded: dict[tuple[str, str], Step] = {}
        #: steps of the chain before this run
        self.base = 0
        #: the fork's receipt as its start carried it (``RECEIPT_HEADER``), carried on to
        #: every later run of its chain, as the memo is: a fork of this fork inside a later
        #: run reads its lineage there
        self.receipt_header: Payload | None = None
        #: the prefix page the fork's start carries (``PREFIX_PAGE_HEADER``; None: none):
        #: read there once the first fetch has verified the marker that signs it
        self.passed_page: Payload | None = None
        self.calls = 0
        self.lineage_root = ""
        #: results (JSON) of each tool's live calls on this fork, oldest first: what an
        #: injected ``stale_data`` fault answers with
        self.tool_results: dict[str, list[Any]] = {}
        #: a team fork's member until its coordinator releases it (None: not read yet)
        self.hold: Hold | None = None
        #: the workflow ids of the children this run started (a team member may signal
        #: them: they are its own, in its fork world)
        self.children: set[str] = set()

    def held(self) -> Hold:
        """The run's hold, read once from its marker (released at once for a run that is
        no team fork's member to be released)."""
        if self.hold is None:
            self.hold = Hold(held_team())
        return self.hold

    def at_fork_point(self) -> bool:
        """Every inherited result, message and fork-point signal has been handed over."""
        return (
            self.loaded
            and (self.matcher is None or self.matcher.all_delivered)
            and not self.messages.owed
            and not self.signals
        )

    def next_index(self) -> int:
        """The next call's place in the chain's scheduling order."""
        self.calls += 1
        return self.base + self.calls


def current_fork() -> ForkMarker | None:
    """The fork marker of the running workflow (None for a run that is not a fork), for
    workflow code that reads the fork's intervention after the boundary.

    The memo is whatever the starter wrote, so a marker that is not one fails the run
    (non-retryable): a validation error would otherwise fail the workflow task, which
    Temporal retries for ever, leaving the run open and stuck."""
    raw = memo_value(MARKER_MEMO_KEY)
    if raw is None:
        return None
    try:
        return ForkMarker.model_validate(raw)
    except ValidationError as exc:
        raise ApplicationError(
            f"memo {MARKER_MEMO_KEY!r} is not a fork marker ({first_error(exc)}); "
            "start forks with `forklab fork`",
            type=ForkErrorType.marker_invalid,
            non_retryable=True,
        ) from None


async def deliver_pending_signals(state: ForkState) -> None:
    """Delivers the fork-point signals not delivered yet (once: the list is emptied)."""
    pending, state.signals = state.signals, []
    if pending and state.inbound is not None:
        await deliver_signals(state.inbound, pending)
