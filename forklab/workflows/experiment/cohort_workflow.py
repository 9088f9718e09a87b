"""``CohortExperimentWorkflow``: an experiment over a cohort of recorded agent runs, on the
path of ``ExperimentWorkflow``: rehearse (read the cohort, resolve each run's fork point,
estimate; nothing starts) → capacity → signed approval of the plan fingerprint (which
covers the cohort's runs, chains, fork steps, prefix digests and tool policies) → forks
→ cleanup → analysis → ledger → report.

Each fork is its own workflow, started by one activity (``cohort_fork``) with the run-fork
half's starter, at most ``max_concurrent_forks`` at a time; the activity heartbeats while
its fork runs and cancels it when cancelled itself. The workflow keeps aggregates only
(``CohortProgress``) and continues as new when its history grows. Cleanup reconciles the
experiment's running forks to zero on every way out. Orchestration only: no I/O, no clock
but ``workflow.now()``, no randomness.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta

from temporalio import workflow
from temporalio.exceptions import ActivityError, ApplicationError, CancelledError
from temporalio.workflow import ActivityCancellationType

with workflow.unsafe.imports_passed_through():
    from forklab.contracts import cohort as cacts
    from forklab.contracts.cohort import (
        CohortAnalyseInput,
        CohortLedgerInput,
        CohortLookInput,
        CohortRehearsal,
        CohortRehearseInput,
        CohortReport,
        ForkCleanupInput,
        ForkJob,
        ForkOutcome,
        ForkStatus,
    )
    from forklab.contracts.errors import ExperimentErrorType
    from forklab.workflows.activity_calls import execute
    from forklab.workflows.experiment import cohort_state, timeouts
    from forklab.workflows.experiment.approval_gate import Moment
    from forklab.workflows.experiment.cohort_messages import (
        STATUS_QUERY,
        WORKFLOW_TYPE,
        CohortCarry,
        CohortInput,
        CohortProgress,
        CohortResult,
        CohortStatusView,
    )
    from forklab.workflows.experiment.experiment_run import ExperimentRun
    from forklab.workflows.experiment.gate_opening import BAD_INPUT, check_start, gate_of
    from forklab.workflows.experiment.messages import Stage, Status
    from forklab.workflows.experiment.run_end import Stop, cause
    from forklab.workflows.experiment.search_attributes import EXPERIMENT, STAGE

#: One fork: the activity waits for the fork's workflow, heartbeating.
FORK_TIMEOUT = timedelta(hours=2)
#: A worker that dies mid-fork is noticed within this; the retry finds the same fork.
FORK_HEARTBEAT_TIMEOUT = timedelta(seconds=15)
#: Runs stop starting forks while the running ones could still take the history past
#: ``history_events`` (``cohort_state.history_full``).
HEADROOM_PATCH = "forklab-cohort-history-headroom"


def _user_code_broke(err: ActivityError) -> bool:
    inner = err.cause
    return (
        isinstance(inner, ApplicationError)
        and inner.type == ExperimentErrorType.workload_contract.value
    )


@workflow.defn(name=WORKFLOW_TYPE, failure_exception_types=BAD_INPUT)
class CohortExperimentWorkflow(ExperimentRun[CohortReport]):
    """Orchestrates a cohort experiment (see the module); the course of its run, its
    message handlers and its approval wait are the workload experiment's
    (``ExperimentRun``)."""

    @workflow.init
    def __init__(self, inp: CohortInput) -> None:
        check_start(inp, CohortInput, command="forklab cohort start")
        self._inp = inp
        self._spec = inp.spec
        carry = inp.carry
        self._origin = carry.origin_run_id if carry else workflow.info().run_id
        self._gate = gate_of(
            carry.approval if carry else None,
            run_id=self._origin,
            public_key=inp.approver_public_key or "",
            key_location=inp.key_location,
        )
        self._rehearsal: CohortRehearsal | None = carry.rehearsal if carry else None
        self._progress: CohortProgress = carry.progress if carry else CohortProgress()
        self._runs = carry.runs if carry else 1
        self._stage = carry.stage if carry else Stage.starting
        self._message = carry.message if carry else "starting"
        self._status = Status.running
        self._error: str | None = None
        #: the running fork activities, each with its job
        self._tasks: dict[asyncio.Task[None], int] = {}
        #: forks this run of the chain started (a run starts one at least before it may
        #: continue as new, so every run makes progress)
        self._started = 0
        self._cleanup: cacts.ForkCleanupResult | None = None
        self._evidence_log: str | None = None

    def _moment(self) -> Moment:
        return Moment(
            now=workflow.now(),
            status=self._status,
            stage=self._stage,
            fingerprint=self._rehearsal.fingerprint if self._rehearsal else None,
            experiment_id=self._spec.id,
            fresh_nonce=workflow.uuid4().hex,
        )

    @workflow.query(name=STATUS_QUERY)
    def status(self) -> CohortStatusView:
        r, p = self._rehearsal, self._progress
        return CohortStatusView(
            experiment_id=self._spec.id,
            status=self._status,
            stage=self._stage,
            message=self._message,
            error=self._error,
            fingerprint=r.fingerprint if r else None,
            approval=self._gate.state,
            plan_artifact=r.plan.artifact if r else None,
            runs=r.plan.runs if r else 0,
            excluded=r.plan.excluded if r else 0,
            tools={t: v.value for t, v in r.plan.tools.items()} if r else {},
            forks_total=r.forks if r else 0,
            forks_done=p.done,
            forks_missing=p.missing,
            forks_saved=p.saved,
            running=len(self._tasks),
            tokens=p.tokens,
            runs_of_chain=self._runs,
            code_digest=r.code.digest if r and r.code else None,
            design=r.design if r else None,
            forks_unspent=p.unspent,
            looks=p.looks,
        )

    # --- the run ------------------------------------------------------------------------
    @workflow.run
    async def run(self, inp: CohortInput) -> CohortResult:
        workflow.upsert_search_attributes([EXPERIMENT.value_set(self._spec.id)])
        report = await self._run_to_end(continued=inp.carry is not None)
        return self._result(report)

    def _end(self, status: Status, error: str | None) -> None:
        self._status, self._error = status, error

    async def _work(self) -> None:
        self._enter(Stage.running_worlds, "running the forks")
        if self._spec.analysis.sequential is None:
            await self._run_forks()
        else:
            await self._run_waves()

    async def _conclude(self) -> CohortReport:
        return await self._analyse()

    def _result(self, report: CohortReport | None) -> CohortResult:
        r, p = self._rehearsal, self._progress
        return CohortResult(
            experiment_id=self._spec.id,
            status=self._status,
            error=self._error,
            fingerprint=r.fingerprint if r else None,
            plan_artifact=r.plan.artifact if r else None,
            runs=r.plan.runs if r else 0,
            report=report,
            cleanup=self._cleanup,
            forks_done=p.done,
            forks_missing=p.missing,
            forks_saved=p.saved,
            tokens=p.tokens,
            runs_of_chain=self._runs,
            evidence_log=self._evidence_log,
            forks_unspent=p.unspent,
        )

    @property
    def _run_key(self) -> str:
        """The tag of this experiment run's forks (its workflow id and first run)."""
        return f"{workflow.info().workflow_id}/{self._origin}"

    async def _plan_and_approve(self) -> None:
        spec = self._spec
        await self._open_gate(
            spec.id, spec.approval, self._inp.request, self._inp.requested_by, versioned=False
        )
        self._enter(Stage.rehearsing, "reading the cohort and resolving its fork points")
        rehearsal = await execute(
            cacts.REHEARSE,
            CohortRehearseInput(spec=spec, code_bundle=self._inp.code_bundle),
            start_to_close_timeout=timeouts.REHEARSE_TIMEOUT,
            heartbeat_timeout=timeouts.BATCH_HEARTBEAT_TIMEOUT,
            retry_policy=timeouts.TRANSIENT_RETRY,
            summary=f"rehearse {spec.id}: read the cohort (nothing starts)",
        )
        self._rehearsal = rehearsal
        self._progress = cohort_state.opening(spec, rehearsal.plan.runs)
        self._enter(Stage.checking_capacity, "checking the budget against the estimates")
        if not rehearsal.capacity_ok:
            raise Stop(
                Status.refused, f"capacity check refused the plan: {rehearsal.capacity_reason}"
            )
        await self._await_approval()

    def _awaiting(self) -> str:
        assert self._rehearsal is not None
        return (
            f"awaiting approval of plan {self._rehearsal.fingerprint[:16]} "
            f"({self._rehearsal.plan.runs} runs, {self._rehearsal.forks} forks)"
        )

    # --- forks --------------------------------------------------------------------------
    def _history_full(self) -> bool:
        """Whether this run starts no further fork (it continues as new once its running
        forks finish): Temporal suggests it, or the running forks and one more could take
        the history past ``history_events`` (histories recorded before that rule compare
        the current length alone)."""
        info = workflow.info()
        if info.is_continue_as_new_suggested():
            return True
        length = info.get_current_history_length()
        if workflow.patched(HEADROOM_PATCH):
            return cohort_state.history_full(length, len(self._tasks), self._inp.history_events)
        return length >= self._inp.history_events

    async def _run_forks(self, total: int | None = None) -> None:
        """Start the plan's fork jobs in order (saving those whose run's majority is
        decided, setting aside those that wait on an earlier fork of their run), at most
        ``max_concurrent_forks`` at once, while the budget allows; continue as new when
        the history is full. With ``total``, the jobs before it only (a design's wave)."""
        spec, progress = self._spec, self._progress
        assert self._rehearsal is not None
        if total is None:
            total = self._job_total()
        limit = spec.budget.max_concurrent_forks
        started_here = 0
        while cohort_state.left(progress, total) or self._tasks:
            while cohort_state.left(progress, total) and len(self._tasks) < limit:
                if started_here and self._history_full():
                    break
                refusal = cohort_state.budget_refusal(spec, progress)
                if refusal is not None:
                    if self._tasks:
                        break  # running forks finish first; their spending decides
                    self._message = f"budget: {refusal}; the remaining forks do not start"
                    cohort_state.skip_rest(progress, spec, total)
                    break
                job = cohort_state.take(progress, spec, total)
                if job is None:
                    break  # every job left waits on a running fork of its run
                started_here += 1
                self._started += 1
                self._tasks[asyncio.create_task(self._fork(job))] = job
            self._show()
            await self._wait_for_tasks(asyncio.FIRST_COMPLETED)
            if cohort_state.left(progress, total) and started_here and self._history_full():
                await self._continue_as_new()

    def _job_total(self) -> int:
        assert self._rehearsal is not None
        spec = self._spec
        return cohort_state.job_count(
            self._rehearsal.plan.runs, len(spec.worlds), spec.cohort.forks_per_world
        )

    async def _run_waves(self) -> None:
        """A sequential design: each wave's forks (``_run_forks`` up to the wave's last
        job), then the look that decides which worlds go on (``cohort_look``: the design's
        pure rules over the worlds' counts). A stopped world starts no more forks; once
        every world but the baseline has stopped, no further wave runs and the forks left
        are unspent. The looks travel in the carry, so a continued run resumes at the first
        look not yet decided (its wave's forks that ran are not run again)."""
        spec, progress = self._spec, self._progress
        waves = len(cohort_state.wave_ends(spec, progress))
        for look in range(len(progress.looks), waves):
            if not cohort_state.live(spec, progress):
                break
            refusal = cohort_state.budget_refusal(spec, progress)
            if refusal is not None:
                self._message = f"budget: {refusal}; the remaining forks do not start"
                cohort_state.skip_rest(progress, spec, self._job_total())
                return
            if self._started and self._history_full():
                await self._continue_as_new()
            self._message = f"wave {look + 1} of {waves}: running its forks"
            await self._run_forks(cohort_state.wave_jobs(spec, progress, look))
            if self._started and not cohort_state.room_for_look(
                workflow.info().get_current_history_length(), self._inp.history_events
            ):
                await self._continue_as_new()  # the next run decides this look first
            await self._look(look)
        cohort_state.leave_unspent(progress, spec, self._job_total())

    async def _look(self, look: int) -> None:
        """Decide look ``look`` on the counts of the worlds still running."""
        spec, progress = self._spec, self._progress
        result = await execute(
            cacts.LOOK,
            CohortLookInput(
                spec=spec,
                runs=len(progress.outcomes[spec.baseline.name]),
                look=look,
                counts=cohort_state.look_input_counts(spec, progress, look),
            ),
            start_to_close_timeout=timeouts.ANALYSE_TIMEOUT,
            retry_policy=timeouts.TRANSIENT_RETRY,
            summary=f"look {look + 1}: stop for efficacy, futility, or continue",
        )
        cohort_state.record_look(progress, result)
        self._show()

    async def _fork(self, job: int) -> None:
        spec = self._spec
        assert self._rehearsal is not None
        place = cohort_state.place(spec, self._progress, job)
        world = spec.worlds[place.world]
        try:
            outcome = await execute(
                cacts.RUN_FORK,
                ForkJob(
                    experiment_id=spec.id,
                    run_key=self._run_key,
                    seed=spec.seed,
                    plan_artifact=self._rehearsal.plan.artifact,
                    run_index=place.run,
                    world=world,
                    fork=place.fork,
                    scorer=spec.cohort.outcome,
                    success_threshold=spec.cohort.success_threshold,
                    code=self._rehearsal.code,
                ),
                start_to_close_timeout=FORK_TIMEOUT,
                heartbeat_timeout=FORK_HEARTBEAT_TIMEOUT,
                retry_policy=timeouts.TRANSIENT_RETRY,
                cancellation_type=ActivityCancellationType.WAIT_CANCELLATION_COMPLETED,
                summary=f"run #{place.run} · {world.name} · fork {place.fork}",
            )
        except ActivityError as err:
            if isinstance(err.cause, CancelledError):
                raise
            if _user_code_broke(err):
                # the scorer broke its contract: final, like a workload's; no outcome of
                # the experiment is counted from code that answers out of contract
                raise Stop(Status.failed, cause(err)) from None
            # a fork whose activity gave up (its attempts spent) has no outcome; the
            # experiment goes on with the others, and the report counts it as missing
            outcome = ForkOutcome(
                run_index=place.run,
                world=world.name,
                fork=place.fork,
                fork_id="",
                status=ForkStatus.error,
                error=cause(err),
            )
        cohort_state.record(self._progress, outcome)

    async def _continue_as_new(self) -> None:
        await self._wait_for_tasks()
        assert self._rehearsal is not None
        await workflow.wait_condition(workflow.all_handlers_finished)
        workflow.continue_as_new(
            self._inp.model_copy(
                update={
                    "carry": CohortCarry(
                        origin_run_id=self._origin,
                        runs=self._runs + 1,
                        stage=self._stage,
                        message=self._message,
                        rehearsal=self._rehearsal,
                        approval=self._gate.state,
                        progress=self._progress,
                    )
                }
            )
        )

    # --- the end ------------------------------------------------------------------------
    async def _clean_up(self) -> None:
        """Reconcile this run's forks to zero running, once."""
        if self._cleanup is not None or self._rehearsal is None:
            return
        self._enter(Stage.cleaning_up, "cancelling any fork of this experiment still running")
        self._cleanup = await execute(
            cacts.CLEANUP_FORKS,
            ForkCleanupInput(run_key=self._run_key),
            start_to_close_timeout=timeouts.CLEANUP_TIMEOUT,
            heartbeat_timeout=timeouts.BATCH_HEARTBEAT_TIMEOUT,
            retry_policy=timeouts.CLEANUP_RETRY,
            summary=f"cleanup: forks tagged ForkLabExperiment={self._run_key}",
        )

    async def _analyse(self) -> CohortReport:
        assert self._rehearsal is not None
        self._enter(Stage.analysing, "pairing the worlds' forks run by run")
        return await execute(
            cacts.ANALYSE,
            CohortAnalyseInput(
                spec=self._spec,
                plan_artifact=self._rehearsal.plan.artifact,
                run_key=self._run_key,
                workflow_id=workflow.info().workflow_id,
                outcomes=cohort_state.final_matrix(self._progress),
                costs=self._progress.costs,
            ),
            start_to_close_timeout=timeouts.ANALYSE_TIMEOUT,
            retry_policy=timeouts.TRANSIENT_RETRY,
            summary="analysis: noise floor, paired tests, report",
        )

    async def _record(self, report: CohortReport | None) -> None:
        self._enter(Stage.recording, "writing the ledger rows")
        r = self._rehearsal
        logged = await execute(
            cacts.RECORD_LEDGER,
            CohortLedgerInput(
                experiment_id=self._spec.id,
                run_id=self._origin,
                status=self._status.value,
                spec=self._spec,
                fingerprint=r.fingerprint if r else "",
                approval_json=self._gate.state.model_dump_json(),
                budget_json=self._progress.model_dump_json(include={"tokens", "world_seconds"}),
                error=self._error,
                report=report,
                plan_digest=r.plan.digest if r else "",
                costs=self._progress.costs,
            ),
            start_to_close_timeout=timeouts.SHORT_TIMEOUT,
            retry_policy=timeouts.TRANSIENT_RETRY,
            summary="ledger: the experiment row and one row per world",
        )
        if logged is not None:
            self._evidence_log = f"{logged.state.value}: {logged.message}"

    def _enter(self, stage: Stage, message: str) -> None:
        self._stage, self._message = stage, message
        workflow.upsert_search_attributes([STAGE.value_set(stage.value)])
        self._show()

    def _show(self) -> None:
        p = self._progress
        total = self._rehearsal.forks if self._rehearsal else 0
        workflow.set_current_details(
            f"**{self._stage.value}**: {self._message}\n\n"
            f"forks {p.done}/{total} done, {len(self._tasks)} running, {p.missing} without "
            f"an outcome, {p.saved} saved (majority decided); {p.tokens} tokens"
            + (
                f"; {p.unspent} unspent, {len(p.looks)} looks decided (sequential design)"
                if self._spec.analysis.sequential is not None
                else ""
            )
        )
