"""The fork mechanism: a worker interceptor that serves a fork's first N activity calls
from its parent's recorded history and applies the fork's tool policies after that.

It depends on nothing ForkLab-specific in the workflow: any workflow whose model and tool
calls are activities (an OpenAI Agents SDK agent on ``temporalio-openai-agents``
included) can be forked. A fork is a new workflow of the same type, started with the
parent's input and a ``ForkMarker`` in its memo. At start the interceptor runs ONE
activity, ``forklab.fetch_prefix``, whose result (the parent's steps 1..N with their
results) lands in the fork's own history — so a replay after a crash serves the same
prefix without reading the parent again. Every worker that may run or replay a fork needs
this interceptor (a ``Replayer`` too).

On continue-as-new the interceptor writes the chain's step count so far into the next
run's memo (``BASE_STEP_MEMO_KEY``), so steps keep their chain-wide numbers in headers and
summaries, and a fork finds the run holding step N from first events alone. A fork's
marker stays on its later runs, marked ``continued``: they inherit nothing more, but keep
the fork's lineage root (the effect ledger's key), tool policies, model swaps and
intervention.
"""

from __future__ import annotations

import base64
import dataclasses
import functools
import json
from datetime import timedelta
from typing import Any, cast

from temporalio import workflow
from temporalio.api.common.v1 import Payload
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, ApplicationError, ChildWorkflowError, RetryState
from temporalio.worker import (
    ContinueAsNewInput,
    HandleSignalInput,
    HandleUpdateInput,
    Interceptor,
    SignalExternalWorkflowInput,
    StartActivityInput,
    StartChildWorkflowInput,
    StartLocalActivityInput,
    WorkflowInboundInterceptor,
    WorkflowInterceptorClassInput,
    WorkflowOutboundInterceptor,
)
from temporalio.worker import ExecuteWorkflowInput as _ExecuteWorkflowInput

from forklab.contracts.errors import ForkErrorType
from forklab.workflows.runfork.child_cohort import tagged
from forklab.workflows.runfork.drift_records import noted_drift
from forklab.workflows.runfork.fork_builds import changed_build, current_build
from forklab.workflows.runfork.fork_memo import memo_value, raw_memo
from forklab.workflows.runfork.fork_signals import deliver_signals
from forklab.workflows.runfork.parent_side_effects import ParentSideEffects
from forklab.workflows.runfork.prefix_messages import (
    MESSAGES_PATCH,
    Redelivery,
    held_until_fork_point,
)
from forklab.workflows.runfork.stall_watch import LiveCalls, Owed, watched
from forklab.workflows.runfork.team_messages import Hold, addressed, child_id, held_team

with workflow.unsafe.imports_passed_through():
    from pydantic import BaseModel, ValidationError

    from forklab.contracts.runfork import (
        BASE_STEP_MEMO_KEY,
        CHAIN_HEADER,
        FETCH_PREFIX,
        FORK_POINT_QUERY,
        INTERNAL_PREFIX,
        LINEAGE_HEADER,
        MARKER_MEMO_KEY,
        MODEL_FIELDS,
        MODEL_SEED_HEADER,
        RECEIPT_HEADER,
        SIDE_EFFECTS_PATCH,
        STEP_DECISION,
        STEP_HEADER,
        TEAM_HEADER,
        TEAM_RELEASE_SIGNAL,
        VERIFY_FORK,
        CohortFork,
        FetchPrefixInput,
        ForkMarker,
        ForkPoint,
        ModelSwap,
        PrefixPage,
        StepDecisionInput,
        VerifyForkInput,
    )
    from forklab.experiments.cohort.faults import CallSite, apply_faults
    from forklab.experiments.cohort.seeds import model_call_seed
    from forklab.experiments.cohort.spec import PatchMode, PatchTarget, PromptPatch
    from forklab.experiments.runfork.blocked import (
        CHILD_WORKFLOW,
        LOCAL_ACTIVITY,
        blocked_message,
    )
    from forklab.experiments.runfork.call_match import CallKey, Divergence, PrefixMatcher
    from forklab.experiments.runfork.identity import lineage_root
    from forklab.experiments.runfork.overrides import ForkSignal, InputOverride
    from forklab.experiments.runfork.owed import child_not_inherited, finished_owing
    from forklab.experiments.runfork.policy import (
        Decision,
        ToolPolicy,
        decide,
        policy_for,
        uses_records,
    )
    from forklab.experiments.runfork.prefix_messages import MessageQueue, PrefixMessage
    from forklab.experiments.runfork.receipt import BoundaryMode
    from forklab.experiments.runfork.steps import Step, StepOrigin, StepStatus, payload_digest
    from forklab.experiments.validation_text import first_error

_FORK_ACTIVITY_TIMEOUT = timedelta(minutes=2)
_FORK_RETRY = RetryPolicy(maximum_attempts=5, maximum_interval=timedelta(seconds=10))
#: Forks whose first run verifies its marker (``forklab.verify_fork``) before anything
#: else; histories recorded before it replay without that activity.
VERIFY_PATCH = "forklab-verify-fork-marker"
#: A fork's first run that inherits has its marker verified by ``forklab.fetch_prefix``
#: (the first page carries it) instead of a ``forklab.verify_fork`` before the fetch;
#: histories recorded before it replay with the separate check.
FETCH_VERIFIES_PATCH = "forklab-fetch-verifies-marker"
#: Child workflows started with a child marker (the run's lineage root and, on a fork,
#: its policies); histories recorded before it replay without the patch marker.
CHILD_PATCH = "forklab-child-marker"
#: A child of a cohort experiment's fork carries the fork's ``cohort`` part in its marker
#: and the experiment's search attribute (``child_cohort``); histories of forks recorded
#: before it started children without them.
CHILD_COHORT_PATCH = "forklab-child-cohort"
#: A fork under an exact boundary that starts a child the parent had not started while it
#: still owes its prefix something fails instead of starting it; forks recorded before
#: it started such a child.
UNSERVED_CHILD_PATCH = "forklab-unserved-child-diverges"
#: A fork's policies refuse local activities and child workflows (recorded with
#: ``forklab.step_decision``); forks recorded before it ran them.
REACH_PATCH = "forklab-policies-reach-local-and-children"


class ForkInterceptor(Interceptor):
    """Add to every worker that runs (or replays) workflows that may be forked."""

    def workflow_interceptor_class(
        self, input: WorkflowInterceptorClassInput
    ) -> type[WorkflowInboundInterceptor] | None:
        return _ForkInbound


class _ForkState:
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


def _base_step(marker: ForkMarker | None) -> int:
    raw = memo_value(BASE_STEP_MEMO_KEY)
    if isinstance(raw, int):
        return raw
    return marker.base_step if marker is not None else 0


class _ForkInbound(WorkflowInboundInterceptor):
    def init(self, outbound: WorkflowOutboundInterceptor) -> None:
        self._state = _ForkState()
        self._state.inbound = self.next
        self._live = LiveCalls(outbound)
        super().init(_ForkOutbound(self._live, self._state))

    async def execute_workflow(self, input: _ExecuteWorkflowInput) -> Any:
        state = self._state
        state.receipt_header = input.headers.get(RECEIPT_HEADER)
        await state.held().wait()  # a team fork's member runs once every member exists
        info = workflow.info()
        state.lineage_root = lineage_root(info.workflow_id, info.first_execution_run_id)
        marker = current_fork()
        state.base = _base_step(marker)
        if marker is not None:
            workflow.set_query_handler(FORK_POINT_QUERY, lambda: _fork_point(state))
            deferred = await _verify(marker)
            state.marker = marker
            if not deferred:
                state.lineage_root = marker.lineage_root
            state.changed_build = changed_build(marker.parent_build)
            if _inherits(marker):
                prefix = await _load_prefix(state, marker, deferred)
                state.lineage_root = marker.lineage_root  # verified by now
                _check_servable(prefix, marker)
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
                await _deliver_signals(state)  # nothing inherited: the fork point is now
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
            stalls = functools.partial(_diverged, state)
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
        if marker is None or not _inherits(marker) or not workflow.patched(MESSAGES_PATCH):
            return None
        return self._state.at_fork_point


def _fork_point(state: _ForkState) -> dict[str, Any]:
    build = current_build() or None
    point = ForkPoint(reached=state.at_fork_point(), drift=state.drift, build=build)
    return point.model_dump(mode="json")


def _exact(state: _ForkState, marker: ForkMarker) -> bool:
    """Whether inherited calls are matched with their inputs: under an exact boundary,
    unless the fork runs another build and was allowed to go on approximately."""
    allowed = marker.allow_build_change and state.changed_build is not None
    return marker.boundary is BoundaryMode.exact and not allowed


def _check_nothing_owed(state: _ForkState) -> None:
    """A run that ended (or continued-as-new) before its fork point owes its prefix
    something: its code is not the parent's, and what it did is no continuation of it."""
    matcher = state.matcher
    calls = matcher.owed if matcher is not None else 0
    if calls or state.messages.owed:
        first = matcher.first_owed() if matcher is not None else None
        raise _diverged(state, finished_owing(first, calls, state.messages.pending))


def _diverged(state: _ForkState, why: str) -> ApplicationError:
    """A divergence, naming the builds when the fork's is not the parent's."""
    marker = state.marker
    if state.changed_build is not None and marker is not None:
        why += (
            f"; the fork runs build {state.changed_build} and the parent's prefix was "
            f"recorded by {marker.parent_build}: its workflow code changed"
        )
        if not marker.allow_build_change:
            why += (
                " (fork with --allow-build-change to be served the parent's results approximately)"
            )
    return ApplicationError(why, type=ForkErrorType.prefix_diverged, non_retryable=True)


async def _deliver_signals(state: _ForkState) -> None:
    pending, state.signals = state.signals, []
    if pending and state.inbound is not None:
        await deliver_signals(state.inbound, pending)


def _refused(why: str, error: ForkErrorType = ForkErrorType.marker_unverified) -> ApplicationError:
    return ApplicationError(why, type=error, non_retryable=True)


async def _verify(marker: ForkMarker) -> bool:
    """Fails the run at once, before anything of the parent is read, unless the marker is
    vouched for: a later run of a fork or a child by the server (it continued-as-new from
    a run, or a run started it, whose own marker this interceptor wrote), a fork's first
    run by ``forklab.verify_fork`` (signed by an issuer this worker trusts, for this run).
    True: the check is left to the first ``forklab.fetch_prefix``, which makes it before
    it reads anything (a fork's first run that inherits)."""
    info = workflow.info()
    if marker.child_of is not None:
        parent = info.parent
        if (parent is None or parent.workflow_id != marker.child_of) and not (
            marker.continued and info.continued_run_id
        ):
            raise _refused(
                f"the fork marker names parent workflow {marker.child_of[:100]!r}, and this "
                "run was not started by it"
            )
        return False
    if marker.continued:
        if not info.continued_run_id:
            raise _refused(
                "the fork marker says this is a later run of a fork, and this run did not "
                "continue from one"
            )
        return False
    if _inherits(marker) and workflow.patched(FETCH_VERIFIES_PATCH):
        return True
    if not workflow.patched(VERIFY_PATCH):
        return False  # recorded before forks were verified
    try:
        await workflow.execute_activity(
            VERIFY_FORK,
            VerifyForkInput(marker=marker),
            result_type=VerifyForkInput,
            start_to_close_timeout=_FORK_ACTIVITY_TIMEOUT,
            retry_policy=_FORK_RETRY,
            summary=f"fork: verify the marker for {marker.parent_workflow_id[:100]}",
        )
    except ActivityError as exc:
        cause = exc.cause
        if isinstance(cause, ApplicationError) and cause.type == ForkErrorType.marker_unverified:
            raise _refused(f"fork refused: {cause.message}") from None
        raise
    return False


def _check_servable(prefix: list[Step], marker: ForkMarker) -> None:
    """Every step the fork is to be served must be in the fetched prefix with a result (or
    be a step its parent fork blocked); else the run fails now, naming the step, instead
    of failing its workflow task on that step for ever."""
    if marker.boundary is BoundaryMode.lineage_only:
        return
    by_index = {s.index: s for s in prefix}
    for index in range(marker.base_step + 1, marker.at_step + 1):
        step = by_index.get(index)
        if step is None:
            why = "is not in the parent's history"
        elif step.status is StepStatus.completed or step.status is StepStatus.blocked:
            continue
        else:
            why = f"is {step.status.value} in the parent's history ({step.activity_type[:100]})"
        raise _refused(
            f"fork refused: its prefix cannot be served: step {index} {why}",
            ForkErrorType.prefix_unservable,
        )


def _inherits(marker: ForkMarker) -> bool:
    """Whether the fork reads its parent's record: steps to serve, or recorded calls its
    policies may serve (none when it starts from a checkpoint at the boundary and every
    policy is ``live`` or ``block``)."""
    if marker.boundary is BoundaryMode.lineage_only or marker.continued:
        return False
    return marker.at_step > marker.base_step or uses_records(marker.tool_policies)


def _prefix_summary(marker: ForkMarker, start: int) -> str:
    """The fetch's line in the Web UI's timeline, the fork's first: what it inherits and
    the model its later calls use (its Input, the parent's, still names the old one)."""
    after = marker.model_at(marker.at_step + 1)
    model = f"; model {after} from step {marker.at_step + 1}" if after else ""
    return f"fork of {marker.parent_workflow_id}: inherit steps {start}..{marker.at_step}{model}"


async def _load_prefix(state: _ForkState, marker: ForkMarker, verify: bool) -> list[Step]:
    """Fetches the inherited steps (and the calls in flight at the boundary) into a
    matcher that hands them out by what each call is; returns the steps. ``verify``: the
    first page's fetch verifies the marker first."""
    start = marker.base_step + 1
    prefix: list[Step] = []
    flying: list[Step] = []
    messages: list[PrefixMessage] = []
    while True:
        page = await _fetch_page(marker, start, verify and start == marker.base_step + 1)
        prefix.extend(page.steps)
        messages.extend(page.messages)
        state.clock.update(page.clock)
        state.seed = page.seed if page.seed is not None else state.seed
        flying.extend(page.in_flight)
        for s in page.recorded_after:
            state.recorded.setdefault((s.activity_type, s.input_sha256), s)
        if page.next_step is None:
            break
        start = page.next_step
    state.inherited = prefix
    state.messages = MessageQueue(messages)
    if prefix:
        state.matcher = PrefixMatcher(prefix, flying, exact=_exact(state, marker))
    for s in prefix:
        if s.status is StepStatus.completed:
            state.recorded.setdefault((s.activity_type, s.input_sha256), s)
    return prefix


async def _fetch_page(marker: ForkMarker, start: int, verify: bool) -> PrefixPage:
    """One page of the parent's steps (``verify``: the marker checked first); a marker
    the worker cannot verify, or a parent that cannot be read (gone with its retention,
    never there), fails the fork with the activity's sentence."""
    try:
        page: PrefixPage = await workflow.execute_activity(
            FETCH_PREFIX,
            FetchPrefixInput(
                workflow_id=marker.parent_workflow_id,
                run_id=marker.source_run_id,
                base_step=marker.base_step,
                from_step=start,
                upto_step=marker.at_step,
                result_override=marker.result_override,
                marker=marker if verify else None,
            ),
            result_type=PrefixPage,
            start_to_close_timeout=_FORK_ACTIVITY_TIMEOUT,
            retry_policy=_FORK_RETRY,
            summary=_prefix_summary(marker, start),
        )
    except ActivityError as exc:
        cause = exc.cause
        if isinstance(cause, ApplicationError) and cause.type == ForkErrorType.prefix_unservable:
            raise _refused(cause.message, ForkErrorType.prefix_unservable) from None
        if isinstance(cause, ApplicationError) and cause.type == ForkErrorType.marker_unverified:
            raise _refused(f"fork refused: {cause.message}") from None
        raise
    return page


def _input_digest(args: Any) -> str:
    payloads = workflow.payload_converter().to_payloads(list(args))
    return payload_digest([(p.metadata.get("encoding", b""), p.data) for p in payloads])


def _decode(step: Step, ret_type: type | None) -> Any:
    """A recorded result as the workflow expects it; one that does not decode fails the
    run (non-retryable) rather than its workflow task, which would be retried for ever."""
    if step.result_b64 is None:
        return None  # an activity that completed without a result payload
    converter = workflow.payload_converter()
    try:
        payload = Payload.FromString(base64.b64decode(step.result_b64))
        return (
            converter.from_payload(payload, ret_type)
            if ret_type
            else converter.from_payload(payload)
        )
    except Exception as exc:
        raise ApplicationError(
            f"step {step.index} ({step.activity_type[:100]}): its recorded result cannot be "
            f"served ({type(exc).__name__})",
            type=ForkErrorType.prefix_unservable,
            non_retryable=True,
        ) from None


def _blocked(message: str) -> ApplicationError:
    return ApplicationError(message, type=ForkErrorType.tool_blocked, non_retryable=True)


def _inherited_block(input: StartActivityInput, step: Step) -> ActivityError:
    """The failure an inherited blocked call raises: an ``ActivityError`` caused by
    ``fork_tool_blocked``, as the parent fork's workflow saw it (no activity runs)."""
    error = ActivityError(
        "activity error",
        scheduled_event_id=0,
        started_event_id=0,
        identity="forklab",
        activity_type=input.activity,
        activity_id="",
        retry_state=RetryState.NON_RETRYABLE_FAILURE,
    )
    cause = _blocked(f"step {step.index} ({input.activity}) was blocked on the parent fork")
    error.__cause__ = cause
    return error


def _summarized(input: StartActivityInput, index: int) -> StartActivityInput:
    """The call with its step in the summary the Web UI shows (unless the workflow gave it
    one): set only on calls that are scheduled, as a copy of the call costs time for
    each of a long prefix's served calls."""
    if input.summary is not None:
        return input
    return dataclasses.replace(input, summary=f"step {index}: {input.activity}")


def _override_key(override: InputOverride, exact: bool) -> CallKey:
    return CallKey(override.activity_type, override.input_sha256 if exact else "", override.ordinal)


def _swap_model(input: StartActivityInput, model: str) -> StartActivityInput:
    field_name = MODEL_FIELDS.get(input.activity)
    if field_name is None or not input.args:
        return input
    first = input.args[0]
    if isinstance(first, BaseModel) and field_name in type(first).model_fields:
        first = first.model_copy(update={field_name: model})
    elif isinstance(first, dict) and field_name in first:
        first = {**first, field_name: model}
    else:
        return input
    return dataclasses.replace(input, args=[first, *input.args[1:]])


def _patched(text: str, patch: PromptPatch) -> str:
    if patch.mode is PatchMode.append:
        return f"{text}\n{patch.text}" if text else patch.text
    if patch.mode is PatchMode.prepend:
        return f"{patch.text}\n{text}" if text else patch.text
    return patch.text


def _patch_prompt(input: StartActivityInput, patch: PromptPatch) -> StartActivityInput:
    """The model call with its system instructions patched: the system message of a chat
    call (one is added first when there is none), or an Agents SDK call's
    ``system_instructions``. Tool instructions are those of the calls' tools, which a chat
    call has none of."""
    if patch.target is not PatchTarget.system or not input.args:
        return input
    first = input.args[0]
    if isinstance(first, BaseModel) and "messages" in type(first).model_fields:
        messages = [dict(m) for m in cast(Any, first).messages]
        system = next((m for m in messages if m.get("role") == "system"), None)
        if system is None:
            messages.insert(0, {"role": "system", "content": _patched("", patch)})
        else:
            system["content"] = _patched(str(system.get("content") or ""), patch)
        first = first.model_copy(update={"messages": messages})
    elif isinstance(first, dict) and "system_instructions" in first:
        instructions = _patched(first["system_instructions"] or "", patch)
        first = {**first, "system_instructions": instructions}
    else:
        return input
    return dataclasses.replace(input, args=[first, *input.args[1:]])


def _with_seed(input: StartActivityInput, seed: int) -> StartActivityInput:
    """An Agents SDK model call asking for ``seed``: its model settings' ``extra_args``,
    which the SDK passes to the endpoint's request as they are. (ForkLab's own chat call
    reads the seed from its activity header instead.)"""
    if not input.args or not isinstance(input.args[0], dict):
        return input
    first = input.args[0]
    settings = first.get("model_settings")
    if dataclasses.is_dataclass(settings) and not isinstance(settings, type):
        extra = {**(getattr(settings, "extra_args", None) or {}), "seed": seed}
        settings = dataclasses.replace(settings, extra_args=extra)
    elif isinstance(settings, dict):
        settings = {**settings, "extra_args": {**(settings.get("extra_args") or {}), "seed": seed}}
    else:
        return input
    return dataclasses.replace(input, args=[{**first, "model_settings": settings}, *input.args[1:]])


def _json_of(step: Step) -> Any:
    payload = Payload.FromString(base64.b64decode(step.result_b64 or ""))
    try:
        return json.loads(payload.data)
    except ValueError:
        return None


class _ForkOutbound(WorkflowOutboundInterceptor):
    def __init__(self, next: WorkflowOutboundInterceptor, state: _ForkState) -> None:
        super().__init__(next)
        self._state = state

    def _headers(self, input: StartActivityInput, index: int) -> StartActivityInput:
        conv = workflow.payload_converter()
        headers = dict(input.headers)
        headers[LINEAGE_HEADER] = conv.to_payloads([self._state.lineage_root])[0]
        headers[STEP_HEADER] = conv.to_payloads([index])[0]
        headers[CHAIN_HEADER] = conv.to_payloads([workflow.info().first_execution_run_id])[0]
        team = self._state.marker.team if self._state.marker is not None else None
        if team is not None:  # the team's messaging activity addresses the team's forks
            headers[TEAM_HEADER] = conv.to_payloads([team.model_dump(mode="json")])[0]
        return dataclasses.replace(input, headers=headers)

    async def signal_external_workflow(self, input: SignalExternalWorkflowInput) -> None:
        """On a team fork's member, a signal goes to the fork standing for its target in
        the fork world, never to an original; one with nowhere to go is blocked."""
        marker = self._state.marker
        if marker is not None and marker.team is not None:
            what = f"signal {input.signal[:100]!r}"
            to = addressed(marker.team, input.workflow_id, what, self._state.children)
            input = dataclasses.replace(input, workflow_id=to, workflow_run_id=None)
        await super().signal_external_workflow(input)

    def start_activity(self, input: StartActivityInput) -> workflow.ActivityHandle[Any]:
        if input.activity.startswith(INTERNAL_PREFIX):
            return super().start_activity(input)
        state = self._state
        index = state.next_index()
        marker = state.marker
        if marker is None:
            return super().start_activity(self._headers(_summarized(input, index), index))
        matcher = state.matcher
        if matcher is not None and (matcher.owed or state.input_override is not None):
            # the call as the parent's lineage made it (its model swaps up to here)
            model = marker.model_at(index)
            seen = _swap_model(input, model) if model is not None else input
            digest = _input_digest(seen.args)
            key = matcher.key(seen.activity, digest)
            step = matcher.take(key)
            if step is not None:
                if step.input_sha256 != digest:  # an approximate boundary: say and record so
                    state.drift.append(noted_drift(step, digest))
                return workflow.ActivityHandle(self._served(seen, step, matcher))
            input = _summarized(input, index)  # a call the UI shows (a served one is none)
            try:
                matcher.check_live(key)
            except Divergence as exc:
                raise _diverged(state, str(exc)) from None
            override = state.input_override
            if override is not None and key == _override_key(override, matcher.exact):
                # the parent's step N, asked something else: it runs live, whatever policy
                state.input_override = None
                asked = dataclasses.replace(input, args=[override.value, *input.args[1:]])
                return super().start_activity(self._headers(asked, index))
        # not inherited: the call comes after the boundary, whatever its place in the code
        input = _summarized(input, index)
        after = max(index, marker.at_step + 1) if matcher is not None else index
        model = marker.model_at(after)
        if model is not None:
            swapped = _swap_model(input, model)
            if swapped is not input:  # say so where the UI shows the call
                input = dataclasses.replace(swapped, summary=f"{swapped.summary} · model {model}")
        if marker.cohort is not None and input.activity in MODEL_FIELDS:
            return self._cohort_model_call(input, index, marker.cohort)
        digest = _input_digest(input.args)
        recorded = state.recorded.get((input.activity, digest))
        decision = decide(input.activity, marker.tool_policies, recorded is not None)
        if decision is Decision.run_live:
            handle = super().start_activity(self._headers(input, index))
            if marker.cohort is not None and marker.cohort.faults:
                return workflow.ActivityHandle(self._faulted(handle, input, index, marker.cohort))
            return handle
        policy = policy_for(input.activity, marker.tool_policies)
        note = StepDecisionInput(
            index=index,
            activity_type=input.activity,
            input_sha256=digest,
            decision=(
                StepOrigin.replayed if decision is Decision.serve_recorded else StepOrigin.blocked
            ),
            policy=policy,
            result_b64=recorded.result_b64
            if decision is Decision.serve_recorded and recorded
            else None,
            result_sha256=recorded.result_sha256
            if decision is Decision.serve_recorded and recorded
            else None,
        )
        return workflow.ActivityHandle(self._decided(input, note))

    async def _decided(self, input: StartActivityInput, note: StepDecisionInput) -> Any:
        # a blocked call fails this activity (fork_tool_blocked): the workflow sees an
        # ActivityError, as it would if the tool itself had failed
        await workflow.execute_activity(
            STEP_DECISION,
            note,
            result_type=StepDecisionInput,
            start_to_close_timeout=_FORK_ACTIVITY_TIMEOUT,
            retry_policy=_FORK_RETRY,
            summary=f"step {note.index}: {input.activity} {note.decision} (policy {note.policy})",
        )
        if note.result_b64 is None:
            # a history recorded when the decision activity completed for blocked calls too
            raise _blocked(blocked_message(note.index, input.activity, note.policy))
        step = Step(
            index=note.index,
            activity_type=note.activity_type,
            input_sha256=note.input_sha256,
            status=StepStatus.completed,
            run_id="",
            result_b64=note.result_b64,
        )
        return _decode(step, input.ret_type)

    def _cohort_model_call(
        self, input: StartActivityInput, index: int, cohort: CohortFork
    ) -> workflow.ActivityHandle[Any]:
        """A live model call of an experiment's fork: a brownout fails it instead; else
        it runs with the world's prompt patch and this call's seed (a function of the
        experiment seed, the run, the fork and the step index, never of the world)."""
        site = CallSite(seed=cohort.seed, run=cohort.run, fork=cohort.fork, call=index)
        hit = apply_faults(cohort.faults, site)
        if hit.error is not None:
            why = f"an injected brownout: the model provider answered {hit.error.value}"
            return workflow.ActivityHandle(self._injected(input, index, why))
        if cohort.prompt_patch is not None:
            input = _patch_prompt(input, cohort.prompt_patch)
        seed = model_call_seed(cohort.seed, cohort.run, cohort.fork, index)
        input = _with_seed(self._headers(input, index), seed)
        headers = dict(input.headers)
        headers[MODEL_SEED_HEADER] = workflow.payload_converter().to_payloads([seed])[0]
        return super().start_activity(dataclasses.replace(input, headers=headers))

    async def _injected(self, input: StartActivityInput, index: int, why: str) -> Any:
        raise ApplicationError(
            f"step {index} ({input.activity}) failed with {why}",
            type=ForkErrorType.injected_fault,
            non_retryable=True,
        )

    async def _faulted(
        self,
        handle: workflow.ActivityHandle[Any],
        input: StartActivityInput,
        index: int,
        cohort: CohortFork,
    ) -> Any:
        """The live tool call's result after the world's faults; one the call's result
        type cannot read any more fails the call, as a broken response would."""
        result = await handle
        conv = workflow.payload_converter()
        try:
            value = json.loads(conv.to_payloads([result])[0].data)
        except ValueError:
            return result
        earlier = self._state.tool_results.setdefault(input.activity, [])
        if not earlier:
            earlier.extend(
                _json_of(s)
                for s in sorted(self._state.inherited, key=lambda s: s.index)
                if s.activity_type == input.activity and s.status is StepStatus.completed
            )
        site = CallSite(
            seed=cohort.seed, run=cohort.run, fork=cohort.fork, call=index, tool=input.activity
        )
        out = apply_faults(cohort.faults, site, value, list(earlier))
        earlier.append(value)
        if not out.applied:
            return result
        if input.ret_type is None:
            return out.value
        changed = Payload(metadata={"encoding": b"json/plain"}, data=json.dumps(out.value).encode())
        try:
            return conv.from_payload(changed, input.ret_type)
        except Exception:  # whatever the result type's reader raises on a broken response
            kinds = ", ".join(k.value for k in out.applied)
            why = f"an injected {kinds}: its response no longer reads as its result type"
            return await self._injected(input, index, why)

    def start_local_activity(self, input: StartLocalActivityInput) -> workflow.ActivityHandle[Any]:
        """A local activity is no step (its input is not recorded, so it can be neither
        served nor matched), but the fork's policies still decide whether it runs, and it
        carries the lineage root, so a live effect meets the lineage's record in the
        effect ledger instead of being applied under a root of its own."""
        if input.activity.startswith(INTERNAL_PREFIX):
            return super().start_local_activity(input)
        refused = self._refused_by_policy(input.activity)
        if refused is not None:
            return workflow.ActivityHandle(self._refuse(LOCAL_ACTIVITY, input, refused))
        conv = workflow.payload_converter()
        headers = dict(input.headers)
        headers[LINEAGE_HEADER] = conv.to_payloads([self._state.lineage_root])[0]
        headers[CHAIN_HEADER] = conv.to_payloads([workflow.info().first_execution_run_id])[0]
        return super().start_local_activity(dataclasses.replace(input, headers=headers))

    async def start_child_workflow(
        self, input: StartChildWorkflowInput
    ) -> workflow.ChildWorkflowHandle[Any, Any]:
        """A child workflow acts for its parent: on a fork the policies decide whether it
        starts (by its workflow type) and its own calls follow them; every child carries
        its parent's lineage root (the effect ledger's key) in a child marker. The memo the
        workflow gives a child never carries a marker of its own making."""
        served = self._state.redelivery.child(input) if self._state.redelivery else None
        if served is not None:  # closed inside the prefix: its recorded outcome
            return served
        state = self._state
        exact = state.matcher is not None and state.matcher.exact
        owes = exact and Owed(state.matcher, state.redelivery).any()
        if owes and workflow.patched(UNSERVED_CHILD_PATCH):
            # every child an exact prefix holds closed inside it and is served: this one
            # is not the parent's, and would run live inside the prefix
            raise _diverged(state, child_not_inherited(input.workflow, input.id))
        memo = dict(input.memo or {})
        memo.pop(MARKER_MEMO_KEY, None)
        refused = self._refused_by_policy(input.workflow)
        if refused is not None:
            await self._refuse(CHILD_WORKFLOW, input, refused)
        cohort = self._state.marker.cohort if self._state.marker is not None else None
        if cohort is not None and workflow.patched(CHILD_COHORT_PATCH):
            input = dataclasses.replace(
                input, search_attributes=tagged(input.search_attributes, cohort.experiment)
            )
        else:
            cohort = None
        marker = self._state.marker
        if marker is not None and marker.team is not None:
            input = dataclasses.replace(input, id=child_id(marker.team, input.id))
        self._state.children.add(input.id)
        if workflow.patched(CHILD_PATCH):
            memo[MARKER_MEMO_KEY] = self._child_marker(cohort).model_dump(mode="json")
        return await super().start_child_workflow(dataclasses.replace(input, memo=memo))

    def _refused_by_policy(self, name: str) -> ToolPolicy | None:
        """The policy (``block`` or ``replay``) that keeps a local activity or child
        workflow ``name`` from running on this fork, or None."""
        marker = self._state.marker
        if marker is None:
            return None
        policy = policy_for(name, marker.tool_policies)
        if policy not in (ToolPolicy.block, ToolPolicy.replay):
            return None
        return policy if workflow.patched(REACH_PATCH) else None

    async def _refuse(
        self,
        kind: str,
        input: StartLocalActivityInput | StartChildWorkflowInput,
        policy: ToolPolicy,
    ) -> Any:
        """Records the refusal (history, Web UI, ``forklab steps``) and fails the call as
        a blocked activity fails: the local activity with an ``ActivityError``, the child
        with a ``ChildWorkflowError``, caused by ``fork_tool_blocked`` — what the workflow
        sees when the call itself fails, so its own error handling runs."""
        name = input.activity if isinstance(input, StartLocalActivityInput) else input.workflow
        state = self._state
        note = StepDecisionInput(
            index=state.base + state.calls,
            activity_type=name,
            input_sha256="",
            decision=StepOrigin.blocked,
            policy=policy,
            acting=kind,
        )
        try:
            await workflow.execute_activity(
                STEP_DECISION,
                note,
                result_type=StepDecisionInput,
                start_to_close_timeout=_FORK_ACTIVITY_TIMEOUT,
                retry_policy=_FORK_RETRY,
                summary=f"{kind} {name}: blocked (policy {policy.value})",
            )
        except ActivityError as exc:
            # the decision activity fails with the refusal (on histories recorded before
            # it did, it completed): either way the call fails as below
            cause = exc.cause
            if not (
                isinstance(cause, ApplicationError) and cause.type == ForkErrorType.tool_blocked
            ):
                raise
        blocked = _blocked(blocked_message(note.index, name, policy, kind))
        failure: ActivityError | ChildWorkflowError
        if isinstance(input, StartLocalActivityInput):
            failure = ActivityError(
                "activity error",
                scheduled_event_id=0,
                started_event_id=0,
                identity="forklab",
                activity_type=name,
                activity_id="",
                retry_state=RetryState.NON_RETRYABLE_FAILURE,
            )
        else:
            failure = ChildWorkflowError(
                "child workflow execution error",
                namespace=workflow.info().namespace,
                workflow_id=input.id,
                run_id="",
                workflow_type=name,
                initiated_event_id=0,
                started_event_id=0,
                retry_state=RetryState.NON_RETRYABLE_FAILURE,
            )
        failure.__cause__ = blocked
        raise failure

    def _child_marker(self, cohort: CohortFork | None) -> ForkMarker:
        """What a child of this run inherits: no steps, the lineage root, and on a fork its
        policies, intervention and the model its calls would use now; on a cohort
        experiment's fork, its ``cohort`` part."""
        info = workflow.info()
        state = self._state
        marker = state.marker
        model = marker.model_at(state.base + state.calls + 1) if marker is not None else None
        return ForkMarker(
            parent_workflow_id=info.workflow_id,
            source_run_id=info.run_id,
            base_step=0,
            at_step=0,
            boundary=BoundaryMode.lineage_only,
            lineage_root=state.lineage_root,
            model=model,
            model_swaps=[ModelSwap(after_step=0, model=model)] if model is not None else [],
            tool_policies=marker.tool_policies if marker is not None else {},
            intervention=marker.intervention if marker is not None else None,
            cohort=cohort,
            team=marker.team.model_copy(update={"held": False})
            if marker is not None and marker.team is not None
            else None,
            child_of=info.workflow_id,
        )

    async def _served(self, input: StartActivityInput, step: Step, matcher: PrefixMatcher) -> Any:
        """An inherited call's recorded outcome, handed over in the parent's completion
        order: a workflow that waits on calls in parallel sees them finish as the parent
        did, and so takes the same path to the boundary."""
        messages = self._state.messages

        def turn() -> bool:  # its place among the inherited results and messages
            return matcher.turn_of(step) and messages.clear_before(step.index)

        if not turn():
            await workflow.wait_condition(turn)
        matcher.delivered()
        side = self._state.side_effects
        if side is not None:
            side.at(step.index)
        if matcher.all_delivered and self._state.signals:
            await _deliver_signals(self._state)  # the fork point: the last inherited result
        if side is not None and self._state.at_fork_point():
            side.end()
        if step.status is StepStatus.blocked:
            # the parent fork's workflow saw this call fail: so does this one
            raise _inherited_block(input, step)
        return _decode(step, input.ret_type)

    def continue_as_new(self, input: ContinueAsNewInput) -> Any:
        memo = dict(input.memo) if input.memo is not None else raw_memo()
        memo[BASE_STEP_MEMO_KEY] = self._state.base + self._state.calls
        marker = self._state.marker
        if marker is not None:  # the next run serves no prefix, and stays this fork
            memo[MARKER_MEMO_KEY] = marker.model_copy(update={"continued": True}).model_dump(
                mode="json"
            )
        else:  # only a fork's own (verified) marker goes on: the server vouches for it
            memo.pop(MARKER_MEMO_KEY, None)
        headers = dict(input.headers)
        if marker is not None and self._state.receipt_header is not None:
            headers[RECEIPT_HEADER] = self._state.receipt_header
        return super().continue_as_new(dataclasses.replace(input, memo=memo, headers=headers))
