"""``ExperimentWorkflow``: one experiment, from rehearsal to report, durably.

Orchestration only: every side effect is an activity (``activities/``); time comes from
``workflow.now()``. The stages are rehearse → resolve snapshot → capacity check →
approval gate → prefixes → world batches → cleanup → analysis → ledger. Cleanup runs on
every way out (success, failure, refusal, rejection, expiry, cancellation).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

from temporalio import workflow
from temporalio.exceptions import ActivityError, ApplicationError, CancelledError
from temporalio.workflow import ActivityCancellationType

with workflow.unsafe.imports_passed_through():
    from forklab.contracts import experiment_activities as acts
    from forklab.contracts.errors import ExperimentErrorType
    from forklab.contracts.experiment import (
        AnalyseInput,
        AnalysisResult,
        BatchInput,
        BatchOutcome,
        BatchStatus,
        CapacityInput,
        CleanupInput,
        EvidenceInput,
        LedgerInput,
        LookInput,
        PrefixInput,
        PrefixRefsInput,
        RehearsedPrefixInput,
        RehearseInput,
        RunnerJob,
        SnapshotInput,
    )
    from forklab.experiments.experiment.worlds import spec_world_plans
    from forklab.workflows.activity_calls import execute
    from forklab.workflows.experiment import history, timeouts, views
    from forklab.workflows.experiment.approval_gate import Moment
    from forklab.workflows.experiment.attempts import failed_attempt
    from forklab.workflows.experiment.budget_ledger import BudgetLedger
    from forklab.workflows.experiment.experiment_run import ExperimentRun
    from forklab.workflows.experiment.gate_opening import BAD_INPUT, check_start, gate_of
    from forklab.workflows.experiment.messages import (
        STATUS_QUERY,
        WORKFLOW_TYPE,
        BudgetUse,
        Carry,
        ExperimentInput,
        ExperimentResult,
        Plan,
        Stage,
        Status,
        StatusView,
    )
    from forklab.workflows.experiment.run_end import Stop, cause
    from forklab.workflows.experiment.run_state import SAVE_EVERY, RunState, Unit
    from forklab.workflows.experiment.search_attributes import EXPERIMENT, STAGE
    from forklab.workflows.experiment.tally import ProgressTally, WorldTally


@workflow.defn(name=WORKFLOW_TYPE, failure_exception_types=BAD_INPUT)
class ExperimentWorkflow(ExperimentRun[AnalysisResult]):
    """A thin orchestrator: the rules live in ``RunState`` (progress), ``ApprovalGate``
    (approval) and ``BudgetLedger`` (budget); the views in ``forklab.workflows.experiment.views``;
    the course of a run, the message handlers and the approval wait in ``ExperimentRun``.
    This class sequences the activities and turns their results into changes of that
    state."""

    @workflow.init
    def __init__(self, inp: ExperimentInput) -> None:
        check_start(inp, ExperimentInput, command="forklab start")
        self._inp = inp
        self._spec = inp.spec
        carry = inp.carry
        origin_run_id = carry.origin_run_id if carry else workflow.info().run_id
        self._gate = gate_of(
            carry.approval if carry else None,
            run_id=origin_run_id,
            public_key=inp.approver_public_key or "",
            key_location=inp.key_location,
        )
        budget = (
            carry.budget
            if carry
            else BudgetUse(
                max_world_seconds=inp.spec.budget.max_world_seconds,
                max_concurrent_sandboxes=inp.spec.budget.max_concurrent_sandboxes,
            )
        )
        ledger = BudgetLedger(
            budget, inp.spec.budget.safety_factor, carry.slowdown if carry else None
        )
        self._state = RunState(
            spec=inp.spec,
            gate=self._gate,  # one gate: the views read it from the state
            ledger=ledger,
            origin_run_id=origin_run_id,
            runs=carry.runs if carry else 1,
            plan=carry.plan if carry else None,
        )
        # Every world has its entry from the start: the tally's shape never changes.
        self._state.tally = (
            carry.progress
            if carry
            else ProgressTally(worlds={w.name: WorldTally() for w in inp.spec.worlds})
        )
        if carry:  # status answers where the chain is, not "starting"
            self._state.stage, self._state.message = carry.stage, carry.message
        self._tasks: dict[asyncio.Task[None], Unit] = {}
        #: Units this run has started: every run starts at least one, so a chain always
        #: advances however low the history limit.
        self._units_started = 0

    def _moment(self) -> Moment:
        return self._state.moment(workflow.now(), workflow.uuid4().hex)

    @workflow.query(name=STATUS_QUERY)
    def status(self) -> StatusView:
        return views.status_view(self._state)

    # --- the run ----------------------------------------------------------------------
    @workflow.run
    async def run(self, inp: ExperimentInput) -> ExperimentResult:
        workflow.upsert_search_attributes([EXPERIMENT.value_set(self._spec.id)])
        analysis = await self._run_to_end(continued=inp.carry is not None)
        return views.result(self._state, analysis)

    def _end(self, status: Status, error: str | None) -> None:
        self._state.status, self._state.error = status, error

    async def _work(self) -> None:
        state = self._state
        if self._spec.analysis.sequential is None:
            self._enter(Stage.running_prefixes, "running each episode's prefix once")
            await self._run_units(state.prefix_units())
            self._enter(Stage.running_worlds, "running world batches")
            await self._run_units(state.world_units())
        else:
            await self._run_waves()

    async def _conclude(self) -> AnalysisResult:
        analysis = await self._readout(await self._analyse())
        self._state.verdicts = analysis.verdicts
        return analysis

    async def _plan_and_approve(self) -> None:
        spec = self._spec
        await self._open_gate(
            spec.id, spec.approval, self._inp.request, self._inp.requested_by, versioned=True
        )
        self._enter(Stage.rehearsing, "rehearsing on the local twin (free)")
        rehearsal = await execute(
            acts.REHEARSE,
            RehearseInput(
                spec=spec,
                sample_episodes=self._inp.rehearsal_episodes,
                workload_bundle=self._inp.workload_bundle,
                batch_episodes=self._inp.batch_episodes,
            ),
            start_to_close_timeout=timeouts.REHEARSE_TIMEOUT,
            heartbeat_timeout=timeouts.BATCH_HEARTBEAT_TIMEOUT,
            retry_policy=timeouts.TRANSIENT_RETRY,
            summary=f"rehearse {spec.id} on the local twin",
        )
        self._enter(Stage.resolving_snapshot, "resolving the snapshot every world starts from")
        snapshot = await execute(
            acts.RESOLVE_SNAPSHOT,
            SnapshotInput(
                spec=spec,
                workload_bundle=self._inp.workload_bundle,
                prefixes=rehearsal.prefixes.index if rehearsal.prefixes else None,
            ),
            start_to_close_timeout=timeouts.SHORT_TIMEOUT,
            retry_policy=timeouts.TRANSIENT_RETRY,
            summary="resolve the runner + workload snapshot",
        )
        self._enter(Stage.checking_capacity, "checking budget and concurrency (no compute)")
        capacity = await execute(
            acts.CHECK_CAPACITY,
            CapacityInput(
                spec=spec,
                rehearsal=rehearsal,
                batch_episodes=self._inp.batch_episodes,
                snapshot_id=snapshot.snapshot_id,
            ),
            start_to_close_timeout=timeouts.SHORT_TIMEOUT,
            retry_policy=timeouts.TRANSIENT_RETRY,
            summary="capacity check: budget and concurrency",
        )
        self._state.plan = Plan(rehearsal=rehearsal, snapshot=snapshot, capacity=capacity)
        self._state.ledger.use.estimated_world_seconds = capacity.estimated_world_seconds
        if not capacity.ok:
            raise Stop(Status.refused, f"capacity check refused the plan: {capacity.reason}")
        await self._await_approval()

    def _awaiting(self) -> str:
        expires_at = self._gate.state.expires_at
        plan = self._state.plan
        assert expires_at is not None and plan is not None
        return (
            f"awaiting approval of plan {plan.fingerprint[:16]} "
            f"until {expires_at:%Y-%m-%d %H:%M:%S} UTC"
        )

    # --- sandbox work -----------------------------------------------------------------
    async def _run_units(self, units: Iterator[Unit]) -> None:
        """Run units with at most ``max_concurrent_sandboxes`` at once, never starting one
        whose reservation exceeds what the budget has left; continue as new when this run's
        history has no room for another unit (or Temporal suggests it). ``units`` are made
        one at a time: a run never holds the list of an experiment's units."""
        state, ledger = self._state, self._state.ledger
        unit = next(units, None)
        while unit is not None or self._tasks:
            while unit is not None and ledger.has_room():
                if not self._history_has_room():
                    break
                blocked = state.blocked(unit)
                if blocked is None and state.needs_refs(unit):
                    await self._load_refs(unit)
                    continue  # the load took history: ask again
                if blocked is None and unit.worlds:
                    unit = state.without_stopped(unit)
                need = state.need(unit)
                if blocked is None:
                    blocked = ledger.refusal(need)
                    if blocked is not None and ledger.running:
                        break  # running units may hand back unspent reservation
                if blocked is not None:
                    state.skip(unit, blocked)
                    unit = next(units, None)
                    continue
                ledger.reserve(unit.key, need)
                self._tasks[asyncio.create_task(self._run_unit(unit, need))] = unit
                self._units_started += 1
                unit = next(units, None)
                self._show()
            await self._wait_for_tasks(asyncio.FIRST_COMPLETED)  # a failed prefix ends it here
            if state.unsaved >= SAVE_EVERY and self._history_has_room():
                await self._save_progress()
            self._show()
            if unit is not None and (
                not self._history_has_room() or workflow.info().is_continue_as_new_suggested()
            ):
                await self._continue_as_new()

    async def _run_waves(self) -> None:
        """A sequential design: each wave's prefixes and world batches, then the look that
        decides which worlds go on (``decide_look``: the design's pure rules over the
        stored outcomes). A stopped world starts no more work; once every world but the
        baseline has stopped, no further wave runs. The looks decided travel in the tally,
        so a continued run resumes at the first wave not yet decided, and a wave whose
        units all ran before the run continued is looked at, not run again."""
        state = self._state
        assert state.plan is not None
        waves = len(state.plan.capacity.wave_ends)
        for look in range(len(state.tally.looks), waves):
            if not state.live_worlds():
                break
            if self._units_started and (
                not history.room_for_unit(
                    workflow.info().get_current_history_length(), 0, self._event_limit
                )
                or workflow.info().is_continue_as_new_suggested()
            ):
                await self._continue_as_new()
            self._enter(Stage.running_prefixes, f"wave {look + 1} of {waves}: prefixes")
            await self._run_units(state.prefix_units(look))
            self._enter(Stage.running_worlds, f"wave {look + 1} of {waves}: world batches")
            await self._run_units(state.world_units(look))
            await self._look(look)

    async def _look(self, look: int) -> None:
        """Decide look ``look`` on the outcomes stored so far (saved first: the activity
        reads them from the store, only decisions travel back)."""
        state = self._state
        digest = await self._save_progress()
        assert digest is not None  # every unit of the wave recorded its outcome or its skip
        result = await execute(
            acts.DECIDE_LOOK,
            LookInput(spec=self._spec, progress_digest=digest, look=look),
            start_to_close_timeout=timeouts.ANALYSE_TIMEOUT,
            heartbeat_timeout=timeouts.BATCH_HEARTBEAT_TIMEOUT,
            retry_policy=timeouts.TRANSIENT_RETRY,
            summary=f"look {look + 1}: stop for efficacy, futility, or continue",
        )
        state.record_look(result)
        self._show()

    async def _load_refs(self, unit: Unit) -> None:
        """Load the prefix checkpoints of ``unit``'s chunk and the next ones, as many as
        this run can still start batches on (at most ``history.MAX_REFS``): their
        prefixes ran in an earlier run, and the stored progress has them."""
        state = self._state
        assert state.plan is not None and state.tally.digest is not None
        first = unit.chunk.index
        stop = min(
            first
            + history.refs_window(
                workflow.info().get_current_history_length(),
                self._inp.history_events,
                -(-len(self._spec.worlds) // state.group_size()),  # units a chunk
            ),
            state.plan.capacity.prefix_chunks,
        )
        refs = await execute(
            acts.LOAD_PREFIX_REFS,
            PrefixRefsInput(progress=state.tally.digest, first=first, stop=stop),
            start_to_close_timeout=timeouts.SHORT_TIMEOUT,
            retry_policy=timeouts.TRANSIENT_RETRY,
            summary=f"load the prefix checkpoints of chunks {first}..{stop - 1}",
        )
        state.refs.update((r.index, r) for r in refs)
        if first not in state.refs:
            raise Stop(
                Status.failed,
                f"the stored progress {state.tally.digest} has no prefix of chunk {first}",
            )

    def _history_has_room(self) -> bool:
        """Whether this run may start another unit (always, if it has started none)."""
        return self._units_started == 0 or history.room_for_unit(
            workflow.info().get_current_history_length(),
            len(self._tasks),
            self._event_limit,
        )

    @property
    def _event_limit(self) -> int:
        """The events a run's units may take: a sequential design keeps its look's free."""
        looks = history.LOOK_EVENTS if self._spec.analysis.sequential is not None else 0
        return self._inp.history_events - looks

    async def _run_unit(self, unit: Unit, need: float) -> None:
        """Run ``unit`` under its reservation, one activity execution per attempt. An
        attempt that fails for a reason another attempt could escape (a dead worker, a
        lost sandbox) is charged what it can have burnt, and the next one runs under the
        reservation renewed in full — or, when attempts or budget run out, the unit ends
        failed. A dead prefix chunk, a poisoned snapshot and a cancellation end the run."""
        state = self._state
        ledger = state.ledger
        spent = 0.0
        try:
            for attempt in range(1, timeouts.UNIT_ATTEMPTS + 1):
                try:
                    spent = await self._attempt(unit, need, attempt)
                    return
                except ActivityError as err:
                    corrupted = isinstance(err.cause, ApplicationError) and (
                        err.cause.type == ExperimentErrorType.snapshot_corrupted
                    )
                    if isinstance(err.cause, CancelledError) or corrupted:
                        raise  # a poisoned snapshot ends the run: none of its worlds counts
                    failed = failed_attempt(
                        err.cause, ledger.open[unit.key].seconds, timeouts.DEAD_ATTEMPT_LAG
                    )
                    ledger.charge_dead_attempt(unit.key, failed.burnt)
                    why = (
                        cause(err)
                        if failed.final or attempt == timeouts.UNIT_ATTEMPTS
                        else ledger.renew(unit.key)
                    )
                    if why is None:
                        continue
                    if not unit.worlds:
                        raise  # the chunk's episodes have no checkpoints: the run fails
                    share = failed.burnt / len(unit.worlds)
                    for index, world in enumerate(unit.worlds):
                        outcome = BatchOutcome(
                            world=world,
                            chunk=unit.chunk,
                            status=BatchStatus.failed,
                            error=f"attempt {attempt} of {timeouts.UNIT_ATTEMPTS}: {why}",
                            seconds=share,
                            attempts=attempt,
                            sandbox_id=failed.sandbox_id,
                        )
                        state.record_batch(outcome, sandbox=index == 0)
                    return
        finally:
            ledger.settle(unit.key, spent)

    async def _attempt(self, unit: Unit, need: float, attempt: int) -> float:
        """One attempt of ``unit``: records its result and returns the seconds it spent."""
        state = self._state
        assert state.plan is not None
        snapshot = state.plan.snapshot.snapshot_id
        job = RunnerJob(
            workload=self._spec.workload.name,
            params=dict(self._spec.workload.params),
            seed=self._spec.seed,
            workspace=state.plan.rehearsal.workspace,
        )
        options: dict[str, Any] = {
            "start_to_close_timeout": timeouts.BATCH_START_TO_CLOSE,
            "heartbeat_timeout": timeouts.BATCH_HEARTBEAT_TIMEOUT,
            "retry_policy": timeouts.ONE_ATTEMPT,
            "cancellation_type": ActivityCancellationType.WAIT_CANCELLATION_COMPLETED,
            "summary": f"{unit.label} · attempt {attempt}",
        }
        rehearsed = state.plan.rehearsal.prefixes
        if not unit.worlds and rehearsed is not None:
            prefix = await execute(
                acts.REHEARSED_PREFIX,
                RehearsedPrefixInput(index=rehearsed.index, chunk=unit.chunk),
                start_to_close_timeout=timeouts.HANDOVER_TIMEOUT,
                retry_policy=timeouts.TRANSIENT_RETRY,
                summary=f"{unit.label}: run by the rehearsal, taken over",
            )
            state.record_prefix(prefix)
            return 0.0
        if not unit.worlds:
            prefix = await execute(
                acts.RUN_PREFIXES,
                PrefixInput(
                    experiment_id=self._spec.id,
                    run_key=self._run_key,
                    job=job,
                    snapshot_id=snapshot,
                    chunk=unit.chunk,
                    reservation_seconds=need,
                ),
                **options,
            )
            state.record_prefix(prefix)
            return float(prefix.seconds)
        plans = {p.name: p for p in spec_world_plans(self._spec)}
        shares = state.shares(unit)
        group = await execute(
            acts.RUN_WORLD_GROUP,
            BatchInput(
                experiment_id=self._spec.id,
                run_key=self._run_key,
                job=job,
                worlds=[plans[w] for w in unit.worlds],
                # the reservation as it was opened, split as the worlds need it now
                world_seconds=[need * s / sum(shares) for s in shares],
                snapshot_id=snapshot,
                chunk=unit.chunk,
                checkpoints_digest=state.refs[unit.chunk.index].checkpoints_digest,
                workspace_digest=state.refs[unit.chunk.index].workspace_digest,
                attempt=attempt,
            ),
            **options,
        )
        state.record_group(group)
        return float(group.seconds)

    @property
    def _run_key(self) -> str:
        """This run's name on its sandboxes: workflow id and the run that started it, so
        that no other run (same spec id or not) lists, cleans or reuses them."""
        return f"{workflow.info().workflow_id}/{self._state.origin_run_id}"

    async def _save_progress(self) -> str | None:
        """Append the records made since the last save to the stored progress (the
        activity merges them; only they travel); returns the progress digest, None if
        nothing was ever recorded."""
        state = self._state
        if state.unsaved:
            records = state.save_input()  # batches may complete while it is being saved
            digest = await execute(
                acts.SAVE_PROGRESS,
                records,
                start_to_close_timeout=timeouts.SHORT_TIMEOUT,
                retry_policy=timeouts.TRANSIENT_RETRY,
                summary=f"store the {state.unsaved} records since the last save with the progress",
            )
            state.saved(digest, records)
        return state.tally.digest

    async def _continue_as_new(self) -> None:
        await self._wait_for_tasks()
        state = self._state
        assert state.plan is not None
        await self._save_progress()
        await workflow.wait_condition(workflow.all_handlers_finished)
        workflow.continue_as_new(
            self._inp.model_copy(
                update={
                    "carry": Carry(
                        origin_run_id=state.origin_run_id,
                        runs=state.runs + 1,
                        stage=state.stage,
                        message=state.message,
                        plan=state.plan,
                        approval=state.gate.state,
                        budget=state.ledger.use,
                        slowdown=state.ledger.slowdowns,
                        progress=state.tally,
                    )
                }
            )
        )

    # --- the end ----------------------------------------------------------------------
    async def _clean_up(self) -> None:
        """Delete every sandbox labelled with this run, until none is left; once."""
        if self._state.cleanup is not None:
            return
        self._enter(Stage.cleaning_up, "deleting this experiment's sandboxes")
        self._state.cleanup = await execute(
            acts.CLEANUP_SANDBOXES,
            CleanupInput(experiment_id=self._spec.id, run_key=self._run_key),
            start_to_close_timeout=timeouts.CLEANUP_TIMEOUT,
            heartbeat_timeout=timeouts.BATCH_HEARTBEAT_TIMEOUT,
            retry_policy=timeouts.CLEANUP_RETRY,
            summary="cleanup: delete this run's sandboxes until none is left",
        )

    async def _analyse(self) -> AnalysisResult:
        state = self._state
        assert state.plan is not None
        self._enter(Stage.analysing, "pairing worlds and checking validity")
        digest = await self._save_progress()
        assert digest is not None
        return await execute(
            acts.ANALYSE,
            AnalyseInput(
                spec=self._spec,
                code_digest=state.plan.snapshot.code_digest,
                workload_bundle=self._inp.workload_bundle,
                snapshot_id=state.plan.snapshot.snapshot_id,
                progress_digest=digest,
                infra=views.infra(state),
                provenance=views.provenance(state),
            ),
            start_to_close_timeout=timeouts.ANALYSE_TIMEOUT,
            heartbeat_timeout=timeouts.BATCH_HEARTBEAT_TIMEOUT,
            retry_policy=timeouts.TRANSIENT_RETRY,
            summary="analysis: pairs, slices, validity checks, report",
        )

    async def _readout(self, analysis: AnalysisResult) -> AnalysisResult:
        """The report gains a readout section: a model's, if it is faithful to the numbers,
        else the deterministic one. The activity always answers; should it still fail, the
        report stays as the analysis wrote it."""
        self._enter(Stage.analysing, "writing the readout")
        try:
            return await execute(
                acts.WRITE_READOUT,
                analysis,
                start_to_close_timeout=timeouts.READOUT_TIMEOUT,
                retry_policy=timeouts.TRANSIENT_RETRY,
                summary="readout: model, checked against the evidence packet, or deterministic",
            )
        except ActivityError as err:
            if isinstance(err.cause, CancelledError):
                raise
            return analysis

    def _ledger_input(self, analysis: AnalysisResult | None) -> LedgerInput:
        state = self._state
        plan = state.plan
        return LedgerInput(
            experiment_id=self._spec.id,
            run_id=state.origin_run_id,
            status=state.status.value,
            spec=self._spec,
            plan_fingerprint=plan.fingerprint if plan else "",
            budget=state.ledger.use.model_dump(mode="json"),
            approval=state.gate.state.model_dump(mode="json"),
            report_digest=analysis.report_digest if analysis else None,
            error=state.error,
            worlds=analysis.worlds if analysis else [],
            snapshot_id=plan.snapshot.snapshot_id if plan else "",
            code_digest=plan.snapshot.code_digest if plan else "",
            workload_bundle=self._inp.workload_bundle,
        )

    async def _record(self, analysis: AnalysisResult | None) -> None:
        self._enter(Stage.recording, "writing the ledger rows")
        ledger = self._ledger_input(analysis)
        await execute(
            acts.RECORD_LEDGER,
            ledger,
            start_to_close_timeout=timeouts.SHORT_TIMEOUT,
            retry_policy=timeouts.TRANSIENT_RETRY,
            summary="ledger: one experiment row and one row per world",
        )
        await self._log_evidence(ledger)

    async def _log_evidence(self, ledger: LedgerInput) -> None:
        """Braintrust, after the local ledger: the activity queues the trace and reports
        whether it was sent; its failure is shown, never the experiment's."""
        state = self._state
        try:
            # the trace reads the sandboxes from the stored progress: store the last records
            digest = await self._save_progress()
            logged = await execute(
                acts.LOG_EVIDENCE,
                EvidenceInput(ledger=ledger, progress_digest=digest),
                start_to_close_timeout=timeouts.EVIDENCE_LOG_TIMEOUT,
                retry_policy=timeouts.TRANSIENT_RETRY,
                summary="evidence log, if the worker has one",
            )
            state.evidence_log = f"{logged.state.value}: {logged.message}"
        except ActivityError as err:
            if isinstance(err.cause, CancelledError):
                raise
            state.evidence_log = f"not logged: {cause(err)}"

    # --- what the Web UI shows --------------------------------------------------------
    def _enter(self, stage: Stage, message: str) -> None:
        self._state.stage = stage
        self._state.message = message
        workflow.upsert_search_attributes([STAGE.value_set(stage.value)])
        self._show()

    def _show(self) -> None:
        workflow.set_current_details(views.details(self._state))
