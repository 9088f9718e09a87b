"""A fork's start: its marker verified (``forklab.verify_fork``, or the first
``forklab.fetch_prefix`` page) and its parent's prefix loaded, page by page, into the
run's ``ForkState``, with a prefix that cannot be served refused at once."""

from __future__ import annotations

from temporalio import workflow
from temporalio.exceptions import ActivityError, ApplicationError

from forklab.contracts.errors import ForkErrorType
from forklab.workflows.runfork.fork_failures import refused
from forklab.workflows.runfork.fork_state import ForkState
from forklab.workflows.runfork.internal_activities import FORK_ACTIVITY_TIMEOUT, FORK_RETRY

with workflow.unsafe.imports_passed_through():
    from forklab.contracts.runfork import (
        FETCH_PREFIX,
        VERIFY_FORK,
        FetchPrefixInput,
        ForkMarker,
        PrefixPage,
        VerifyForkInput,
    )
    from forklab.experiments.runfork.call_match import PrefixMatcher
    from forklab.experiments.runfork.policy import uses_records
    from forklab.experiments.runfork.prefix_messages import MessageQueue, PrefixMessage
    from forklab.experiments.runfork.receipt import BoundaryMode
    from forklab.experiments.runfork.steps import Step, StepStatus


#: Forks whose first run verifies its marker (``forklab.verify_fork``) before anything
#: else; histories recorded before it replay without that activity.
VERIFY_PATCH = "forklab-verify-fork-marker"
#: A fork's first run that inherits has its marker verified by ``forklab.fetch_prefix``
#: (the first page carries it) instead of a ``forklab.verify_fork`` before the fetch;
#: histories recorded before it replay with the separate check.
FETCH_VERIFIES_PATCH = "forklab-fetch-verifies-marker"
#: A fork whose start carries its prefix page reads it there, its first fetch answering
#: with the marker's verdict alone (the page is in the fork's history once); histories
#: recorded before it replay with the page in the fetch's result.
PAGE_IN_START_PATCH = "forklab-page-in-start"


def _exact(state: ForkState, marker: ForkMarker) -> bool:
    """Whether inherited calls are matched with their inputs: under an exact boundary,
    unless the fork runs another build and was allowed to go on approximately."""
    allowed = marker.allow_build_change and state.changed_build is not None
    return marker.boundary is BoundaryMode.exact and not allowed


async def verify_marker(marker: ForkMarker) -> bool:
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
            raise refused(
                f"the fork marker names parent workflow {marker.child_of[:100]!r}, and this "
                "run was not started by it"
            )
        return False
    if marker.continued:
        if not info.continued_run_id:
            raise refused(
                "the fork marker says this is a later run of a fork, and this run did not "
                "continue from one"
            )
        return False
    if inherits(marker) and workflow.patched(FETCH_VERIFIES_PATCH):
        return True
    if not workflow.patched(VERIFY_PATCH):
        return False  # recorded before forks were verified
    try:
        await workflow.execute_activity(
            VERIFY_FORK,
            VerifyForkInput(marker=marker),
            result_type=VerifyForkInput,
            start_to_close_timeout=FORK_ACTIVITY_TIMEOUT,
            retry_policy=FORK_RETRY,
            summary=f"fork: verify the marker for {marker.parent_workflow_id[:100]}",
        )
    except ActivityError as exc:
        cause = exc.cause
        if isinstance(cause, ApplicationError) and cause.type == ForkErrorType.marker_unverified:
            raise refused(f"fork refused: {cause.message}") from None
        raise
    return False


def check_servable(prefix: list[Step], marker: ForkMarker) -> None:
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
        raise refused(
            f"fork refused: its prefix cannot be served: step {index} {why}",
            ForkErrorType.prefix_unservable,
        )


def inherits(marker: ForkMarker) -> bool:
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


async def load_prefix(state: ForkState, marker: ForkMarker, verify: bool) -> list[Step]:
    """Fetches the inherited steps (and the calls in flight at the boundary) into a
    matcher that hands them out by what each call is; returns the steps. ``verify``: the
    first page's fetch verifies the marker first."""
    start = marker.base_step + 1
    prefix: list[Step] = []
    flying: list[Step] = []
    messages: list[PrefixMessage] = []
    while True:
        first = verify and start == marker.base_step + 1
        in_start = first and state.passed_page is not None and workflow.patched(PAGE_IN_START_PATCH)
        page = await _fetch_page(marker, start, first, in_start)
        if page.in_start:
            page = _started_page(state)
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


def _started_page(state: ForkState) -> PrefixPage:
    """The prefix page the run's start carries, which the fetch has just verified with the
    marker that signs its digest."""
    passed = state.passed_page
    try:
        if passed is None:
            raise ValueError("no page")
        return PrefixPage.model_validate_json(passed.data)
    except ValueError:  # pydantic's ValidationError is one
        raise refused(
            "fork refused: its prefix cannot be served: the page its start carries does not "
            "read as one",
            ForkErrorType.prefix_unservable,
        ) from None


async def _fetch_page(marker: ForkMarker, start: int, verify: bool, in_start: bool) -> PrefixPage:
    """One page of the parent's steps (``verify``: the marker checked first; ``in_start``:
    the verdict alone, the page being the run's start's); a marker the worker cannot
    verify, or a parent that cannot be read (gone with its retention, never there), fails
    the fork with the activity's sentence."""
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
                page_in_start=in_start,
            ),
            result_type=PrefixPage,
            start_to_close_timeout=FORK_ACTIVITY_TIMEOUT,
            retry_policy=FORK_RETRY,
            summary=_prefix_summary(marker, start),
        )
    except ActivityError as exc:
        cause = exc.cause
        if isinstance(cause, ApplicationError) and cause.type == ForkErrorType.prefix_unservable:
            raise refused(cause.message, ForkErrorType.prefix_unservable) from None
        if isinstance(cause, ApplicationError) and cause.type == ForkErrorType.marker_unverified:
            raise refused(f"fork refused: {cause.message}") from None
        raise
    return page
