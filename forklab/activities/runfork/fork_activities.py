"""The activities a fork's workflow runs through the worker interceptor: the check of its
marker, its inherited prefix, fetched from the parent's history, and the record of a call
its policy decided."""

from __future__ import annotations

from datetime import UTC
from pathlib import Path

from temporalio import activity
from temporalio.api.history.v1 import WorkflowExecutionStartedEventAttributes
from temporalio.client import Client
from temporalio.common import RawValue
from temporalio.exceptions import ApplicationError
from temporalio.service import RPCError, RPCStatusCode

from forklab.activities.runfork.fork_keys import home_issuer
from forklab.activities.runfork.history_events import ClosedRuns, digest_payloads
from forklab.activities.runfork.history_reads import RunNotFound, first_event, read_run
from forklab.activities.runfork.prefix_page import as_signed, passed_in, prefix_page
from forklab.contracts.errors import ForkErrorType
from forklab.contracts.fork_signature import marker_refusal
from forklab.contracts.runfork import (
    FETCH_PREFIX,
    RECORD_DRIFT,
    STEP_DECISION,
    VERIFY_FORK,
    FetchPrefixInput,
    ForkMarker,
    PrefixPage,
    StepDecisionInput,
    VerifyForkInput,
)
from forklab.experiments.runfork.approximations import DriftRecord
from forklab.experiments.runfork.blocked import blocked_message
from forklab.experiments.runfork.steps import StepOrigin

_ISSUERS_HINT = "FORKLAB_FORK_ISSUERS"


class ForkActivities:
    """Activities a fork's workflow runs through the worker interceptor.

    ``home``: the worker's ForkLab home, whose issuer key the worker trusts when
    ``issuers`` (public key → name, the worker's registered fork issuers) is None."""

    def __init__(
        self, client: Client, home: Path | None = None, issuers: dict[str, str] | None = None
    ) -> None:
        self._client = client
        self._home = home
        self._issuers = issuers
        self.runs = ClosedRuns()

    def _trusted(self) -> dict[str, str]:
        if self._issuers is not None:
            return self._issuers
        return home_issuer(self._home) if self._home is not None else {}

    @activity.defn(name=VERIFY_FORK)
    async def verify_fork(self, req: VerifyForkInput) -> VerifyForkInput:
        """Refuses (non-retryable, one sentence) a marker this worker cannot verify was
        issued for the calling run (``_check_marker``): the check of a fork's first run
        that inherits nothing (one that inherits has ``forklab.fetch_prefix`` check it)."""
        await self._check_marker(req.marker)
        return req

    async def _check_marker(self, marker: ForkMarker) -> WorkflowExecutionStartedEventAttributes:
        """Raises ``fork_marker_unverified`` unless ``marker`` is signed by a trusted key,
        for the calling run's workflow id, its recorded start input, shortly before the
        run started; returns that start. It reads the run's own first event only; nothing
        of the parent."""
        info = activity.info()
        workflow_id, run_id = info.workflow_id or "", info.workflow_run_id or ""
        trusted = self._trusted()
        if not trusted:
            where = f" ({self._home})" if self._home is not None else ""
            raise _unverified(
                "this worker trusts no fork issuer: fork with `forklab fork` on this worker's "
                f"FORKLAB_HOME{where}, or register the issuer's key in {_ISSUERS_HINT}"
            )
        try:
            event = await first_event(self._client, workflow_id, run_id)
        except RunNotFound as exc:
            raise _unverified(f"cannot read this run's start ({exc})") from None
        started = event.workflow_execution_started_event_attributes
        refusal = marker_refusal(
            as_signed(marker, started),
            trusted=trusted,
            workflow_id=workflow_id,
            start_input_sha256=digest_payloads(list(started.input.payloads)),
            started_at=event.event_time.ToDatetime(tzinfo=UTC),
        )
        if refusal is not None:
            raise _unverified(refusal)
        return started

    @activity.defn(name=FETCH_PREFIX)
    async def fetch_prefix(self, req: FetchPrefixInput) -> PrefixPage | RawValue:
        """Steps ``from_step..upto_step`` of the parent's run, with their results, in pages
        of at most ``max_bytes`` (a Temporal payload must stay small). The first page of a
        fork's first run carries its marker: verified before anything of the parent is
        read, and the page must be the prefix the marker names (one activity, where a
        separate ``forklab.verify_fork`` cost a round trip and a workflow task more). The
        prefix page ``forklab fork`` passed in the fork's start is served as it is, nothing
        read: its digest is part of what the verified signature covers (``as_signed``); a
        fork that reads it from its start (``page_in_start``) is answered with the verdict
        alone."""
        if req.marker is not None:
            passed = passed_in(await self._check_marker(req.marker))
            _check_named(req, req.marker)
            if passed is not None:  # its digest verified with the marker's signature
                # the workflow reads it from its own start: only the verdict goes back
                return (
                    PrefixPage(steps=[], in_start=True) if req.page_in_start else RawValue(passed)
                )
            if req.page_in_start:
                raise ApplicationError(
                    "fork refused: its prefix cannot be served: the fork's start carries no "
                    "prefix page",
                    type=ForkErrorType.prefix_unservable,
                    non_retryable=True,
                )
        try:
            rec = await read_run(
                self._client, req.workflow_id, req.run_id, req.base_step, self.runs
            )
        except (RunNotFound, RPCError) as exc:
            # gone (retention, deleted) or no run id at all: no retry brings it back
            if isinstance(exc, RPCError) and exc.status is not RPCStatusCode.INVALID_ARGUMENT:
                raise
            raise ApplicationError(
                f"fork refused: its prefix cannot be served: no run {req.run_id[:100]!r} of "
                f"{req.workflow_id[:100]!r} ({type(exc).__name__})",
                type=ForkErrorType.prefix_unservable,
                non_retryable=True,
            ) from None
        return prefix_page(rec, req)

    @activity.defn(name=RECORD_DRIFT)
    async def record_drift(self, record: DriftRecord) -> DriftRecord:
        """Puts an inherited call served with a drifted input into the fork's history,
        where ``forklab trail`` reads it: the receipt, written before the fork ran, cannot
        say it, and is never changed after the fact."""
        return record

    @activity.defn(name=STEP_DECISION)
    async def step_decision(self, req: StepDecisionInput) -> StepDecisionInput:
        """Records, visibly in history and the Web UI, a live call the fork's policy served
        from the record or blocked; returns the record it was given. A blocked call fails
        here, non-retryable, as ``fork_tool_blocked``: the workflow sees the call fail as
        an ``ActivityError``, so its own error handling (a saga's compensation, a
        fallback) runs on the fork as it would in production."""
        if req.decision is StepOrigin.blocked:
            raise ApplicationError(
                blocked_message(req.index, req.activity_type, req.policy, req.acting),
                type=ForkErrorType.tool_blocked,
                non_retryable=True,
            )
        return req


def _check_named(req: FetchPrefixInput, marker: ForkMarker) -> None:
    """Refuses a page other than the one the verified marker names: another parent, run,
    boundary or override than the signature binds."""
    named = (
        marker.parent_workflow_id,
        marker.source_run_id,
        marker.base_step,
        marker.at_step,
        marker.result_override,
    )
    asked = (req.workflow_id, req.run_id, req.base_step, req.upto_step, req.result_override)
    if asked != named or req.from_step != marker.base_step + 1:
        raise _unverified(
            "the prefix asked for is not the one the fork marker names: start forks with "
            "`forklab fork`"
        )


def _unverified(why: str) -> ApplicationError:
    return ApplicationError(why, type=ForkErrorType.marker_unverified, non_retryable=True)
