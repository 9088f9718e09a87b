"""The course of a run that both experiment workflows (``ExperimentWorkflow`` and
``CohortExperimentWorkflow``) follow, written once: plan and approval (or, on a continued
run, the decision read again), the approved work, cleanup and analysis; and on every way
out (completion, an early ``Stop``, a failed activity, a cancellation) the running work
stopped, cleanup and the ledger record, in that order, and the status shown.

A base class over ``ApprovalStep``: each workflow supplies its planning, its work (world
units or forks, run as tasks in ``_tasks``), its cleanup, analysis and record, and where
its final status is kept (``_end``). One code path means one order of commands, and one
reading of recorded histories, for both.
"""

from __future__ import annotations

import asyncio
from abc import abstractmethod
from typing import Any, Generic, TypeVar

from temporalio import workflow
from temporalio.exceptions import ActivityError, ApplicationError, CancelledError

with workflow.unsafe.imports_passed_through():
    from forklab.contracts.errors import ExperimentErrorType
    from forklab.workflows.experiment.approval_step import ApprovalStep
    from forklab.workflows.experiment.messages import Stage, Status
    from forklab.workflows.experiment.run_end import Stop, cause

#: What a run's analysis returns (the workload experiment's ``AnalysisResult``, the
#: cohort's ``CohortReport``).
Analysis = TypeVar("Analysis")


class ExperimentRun(ApprovalStep, Generic[Analysis]):
    """A run from start to end (see the module)."""

    #: The running work: one task per unit or fork (the value says which).
    _tasks: dict[asyncio.Task[None], Any]

    # --- what each workflow supplies ------------------------------------------------------
    @abstractmethod
    async def _plan_and_approve(self) -> None:
        """Plan the experiment and wait for the plan's approval (a chain's first run)."""

    @abstractmethod
    async def _work(self) -> None:
        """The approved work, to its end."""

    @abstractmethod
    async def _conclude(self) -> Analysis:
        """The analysis of the work done, once it is cleaned up."""

    @abstractmethod
    async def _clean_up(self) -> None:
        """Remove what the run started (sandboxes, forks), once."""

    @abstractmethod
    async def _record(self, analysis: Analysis | None) -> None:
        """Write the ledger rows (and whatever goes with them)."""

    @abstractmethod
    def _end(self, status: Status, error: str | None) -> None:
        """Keep the run's final ``status`` and why, where status and the result read them."""

    # --- the course of a run ----------------------------------------------------------
    async def _run_to_end(self, continued: bool) -> Analysis | None:
        """The run after its start (``continued``: a run of the chain after the first);
        the analysis, None if the run ended without one."""
        analysis: Analysis | None = None
        status: Status = Status.completed
        error: str | None = None
        approved = continued
        try:
            if continued:
                # Whatever the carry says, the decision is read here: a rejection that
                # arrived while the previous run was continuing as new stops this one.
                await self._await_approval()
            else:
                await self._plan_and_approve()
            approved = True
            await self._work()
            await self._clean_up()
            analysis = await self._conclude()
            self._end(status, error)
        except Stop as stop:
            status, error = stop.status, stop.reason
            self._end(status, error)
            await self._stop_tasks()
        except asyncio.CancelledError:
            await self._cancelled()
            raise
        except ActivityError as err:
            if isinstance(err.cause, CancelledError):
                await self._cancelled()
                raise asyncio.CancelledError from None
            status, error = Status.failed, cause(err)
            self._end(status, error)
            await self._stop_tasks()
        await self._clean_up()
        await self._record(analysis)
        self._enter(Stage.done, f"{status.value}{': ' + error if error else ''}")
        if status is Status.failed and not approved:
            # Nothing was spent: fail the workflow itself, so that the id-reuse policy
            # (allow duplicate, failed only) lets the operator start it again under its id.
            raise ApplicationError(
                error or "failed", type=ExperimentErrorType.failed_before_approval
            )
        return analysis

    async def _cancelled(self) -> None:
        """The operator cancelled: stop the work, clean up, record; the caller re-raises."""
        self._end(Status.cancelled, "cancelled by the operator")
        await self._stop_tasks()
        await self._clean_up()
        await self._record(None)
        self._enter(Stage.done, "cancelled")

    # --- the running work -------------------------------------------------------------
    async def _wait_for_tasks(self, return_when: str = asyncio.ALL_COMPLETED) -> None:
        """Wait for the running tasks (all, or with ``FIRST_COMPLETED`` the first to end),
        drop those that ended, and raise the first failure among them."""
        if self._tasks:
            await workflow.wait(list(self._tasks), return_when=return_when)
            for task in [t for t in self._tasks if t.done()]:
                del self._tasks[task]
                task.result()

    async def _stop_tasks(self) -> None:
        """Cancel the running tasks and wait until each has cleaned up after itself (a
        unit deletes its sandbox, a fork activity cancels its fork)."""
        for task in self._tasks:
            task.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks.clear()
