"""The approval step of both experiment workflows (``ExperimentWorkflow`` and
``CohortExperimentWorkflow``), written once: the dynamic update and signal handlers that
hand every message to the run's ``ApprovalGate`` (read by ``inbox``), the opening of the
gate (``gate_opening.open_gate``), and the wait for a decision until expiry, continuing
as new when Temporal suggests it.

A base class, because Temporal finds a workflow's handlers on its class, inherited ones
included: both workflows answer the same (dynamic) update and signal, and record the same
commands in the same order around approval. Each workflow supplies its gate (``_gate``),
the ``Moment`` an attempt arrives at, what its status says while it waits, and its own
``_enter`` (a stage) and ``_continue_as_new``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from datetime import timedelta

from temporalio import workflow
from temporalio.common import RawValue

with workflow.unsafe.imports_passed_through():
    from forklab.experiments.experiment.spec import Approval
    from forklab.workflows.experiment import inbox
    from forklab.workflows.experiment.approval_gate import ApprovalGate, Moment
    from forklab.workflows.experiment.gate_opening import open_gate
    from forklab.workflows.experiment.messages import (
        ApprovalAttempt,
        ApprovalStatus,
        SignedRequest,
        Stage,
        Status,
    )
    from forklab.workflows.experiment.run_end import Stop


def _payloads(args: Sequence[RawValue]) -> list[inbox.Payload]:
    return [
        inbox.Payload(encoding=a.payload.metadata.get("encoding", b""), data=a.payload.data)
        for a in args
    ]


class ApprovalStep(ABC):
    """The handlers and the approval wait of an experiment workflow (see the module)."""

    #: The run's approval gate: carried over by its previous run, or opened by this one.
    _gate: ApprovalGate

    # --- messages ---------------------------------------------------------------------
    # Handlers are dynamic and take raw payloads: the SDK decodes nothing a sender wrote,
    # so no payload (binary, missing, extra, malformed, huge) can fail a workflow task.
    @workflow.update(dynamic=True)
    def message(self, name: str, args: Sequence[RawValue]) -> ApprovalAttempt:
        """``approve`` (signed, see ``ApprovalGate``) and ``reject``; every update, whatever
        it holds, is answered with the attempt the gate recorded for it."""
        return inbox.deliver(self._gate, name, _payloads(args), self._moment())

    @workflow.signal(dynamic=True)
    def stray_signal(self, name: str, args: Sequence[RawValue]) -> None:
        inbox.refuse_signal(self._gate, name, self._moment())

    # --- what each workflow supplies ------------------------------------------------------
    @abstractmethod
    def _moment(self) -> Moment:
        """The run as the gate sees it now (a fresh nonce from ``workflow.uuid4``)."""

    @abstractmethod
    def _awaiting(self) -> str:
        """What the status says while the plan awaits approval (the gate is pending)."""

    @abstractmethod
    def _enter(self, stage: Stage, message: str) -> None:
        """Move the run to ``stage``, shown with ``message``."""

    @abstractmethod
    async def _continue_as_new(self) -> None:
        """Continue as new, carrying the gate's state."""

    # --- the step ---------------------------------------------------------------------
    async def _open_gate(
        self,
        experiment_id: str,
        approval: Approval,
        request: SignedRequest | None,
        requested_by: str,
        *,
        versioned: bool,
    ) -> None:
        """Open the gate before anything is planned (``open_gate``; ``versioned``: a
        workflow that existed before the approver policy); stop if the start is refused."""
        refusal = await open_gate(
            self._gate, experiment_id, approval, request, requested_by, versioned=versioned
        )
        if refusal is not None:
            raise Stop(Status.failed, refusal)

    async def _await_approval(self) -> None:
        """Stop unless the plan was approved (or approval was not required), waiting for
        the decision while it is pending. Every run of a chain passes here, so no run goes
        on under a rejected or expired decision, e.g. a rejection that arrived while the
        previous run was continuing as new."""
        gate = self._gate
        if gate.pending:
            await self._wait_for_decision()
        if gate.state.status is ApprovalStatus.rejected:
            raise Stop(Status.rejected, f"rejected by {gate.state.decided_by}")
        if gate.state.status is ApprovalStatus.expired:
            raise Stop(Status.expired, "nobody approved the plan before it expired")

    async def _wait_for_decision(self) -> None:
        """Wait for a decision until expiry. Messages keep arriving meanwhile (each one in
        history): when Temporal suggests it, continue as new and wait on there."""
        gate = self._gate
        expires_at = gate.state.expires_at
        assert expires_at is not None
        self._enter(Stage.awaiting_approval, self._awaiting())
        while gate.pending:
            left = (expires_at - workflow.now()).total_seconds()
            try:
                await workflow.wait_condition(
                    lambda: not gate.pending or workflow.info().is_continue_as_new_suggested(),
                    timeout=timedelta(seconds=max(left, 0.001)),
                    timeout_summary="approval expiry",
                )
            except TimeoutError:
                gate.expire()
            if gate.pending:
                await self._continue_as_new()
