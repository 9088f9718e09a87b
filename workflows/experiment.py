"""``ExperimentWorkflow``: one experiment, from rehearsal to report, durably.

Orchestration only: every side effect is an activity (``activities/``); time comes from
``workflow.now()``. The stages are rehearse → resolve snapshot → capacity check →
approval gate → prefixes → world batches → cleanup → analysis → ledger. Cleanup runs on
every way out (success, failure, refusal, rejection, expiry, cancellation).
"""

from __future__ import annotations

import asyncio
import hmac
from collections import deque
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from temporalio import workflow
from temporalio.exceptions import ActivityError, ApplicationError, CancelledError
from temporalio.workflow import ActivityCancellationType

with workflow.unsafe.imports_passed_through():
    from activities.approval_token import token_sha256
    from activities.budget import revised_reservation, slowdown
    from activities.models import (
        AnalyseInput,
        AnalysisResult,
        BatchInput,
        BatchOutcome,
        BatchStatus,
        CapacityInput,
        CleanupInput,
        CleanupResult,
        EpisodeChunk,
        LedgerInput,
        PrefixInput,
        PrefixResult,
        Progress,
        RehearseInput,
        RunnerJob,
        SnapshotInput,
        TokenInput,
        WorldJob,
    )
    from activities.planning import PlanningActivities
    from activities.readout import ReadoutActivities
    from activities.records import RecordActivities
    from activities.world_batches import SandboxActivities
    from experiments.engine import spec_world_plans
    from experiments.outcomes import InfraUsage
    from workflows import timeouts
    from workflows.messages import (
        WORKFLOW_TYPE,
        ApprovalAttempt,
        ApprovalState,
        ApprovalStatus,
        ApproveSignal,
        BudgetUse,
        Carry,
        ExperimentInput,
        ExperimentResult,
        Plan,
        RejectSignal,
        RunProgress,
        Stage,
        Status,
        StatusView,
    )
    from workflows.search_attributes import EXPERIMENT, STAGE

#: The slowdown key of prefix units (world units use ``"world"``).
_PREFIX = "prefix"
_WORLD = "world"


@dataclass(frozen=True)
class _Unit:
    """One sandbox's work: the prefixes of a chunk (``world`` None) or a world over it."""

    chunk: EpisodeChunk
    world: str | None = None

    @property
    def label(self) -> str:
        what = self.world or "prefixes"
        return f"{what} · episodes {self.chunk.first}..{self.chunk.stop - 1}"


class _Stop(Exception):
    """Ends the run early with a final status (refused, rejected, expired)."""

    def __init__(self, status: Status, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


def _cause(err: BaseException) -> str:
    """The innermost message of an activity failure: the sentence a person can act on."""
    while isinstance(err, ActivityError) and err.cause is not None:
        err = err.cause
    return str(err.message if isinstance(err, ApplicationError) else err)


@workflow.defn(name=WORKFLOW_TYPE)
class ExperimentWorkflow:
    @workflow.init
    def __init__(self, inp: ExperimentInput) -> None:
        self._inp = inp
        self._spec = inp.spec
        carry = inp.carry
        self._status = Status.running
        self._stage = Stage.starting
        self._message = "starting"
        self._error: str | None = None
        self._plan: Plan | None = carry.plan if carry else None
        required = inp.spec.approval.required
        self._approval = (
            carry.approval
            if carry
            else ApprovalState(
                status=ApprovalStatus.pending if required else ApprovalStatus.not_required,
                token_sha256=inp.token_sha256 or "",
                token_location=inp.token_location,
            )
        )
        self._budget = (
            carry.budget
            if carry
            else BudgetUse(
                max_world_seconds=inp.spec.budget.max_world_seconds,
                max_concurrent_sandboxes=inp.spec.budget.max_concurrent_sandboxes,
            )
        )
        self._slowdown: dict[str, float] = dict(carry.slowdown) if carry else {}
        self._prefixes: dict[int, PrefixResult] = {}
        self._batches: dict[tuple[str, int], BatchOutcome] = {}
        self._tasks: dict[asyncio.Task[None], _Unit] = {}
        self._cleanup: CleanupResult | None = None
        self._runs = carry.runs if carry else 1
        self._origin_run_id = carry.origin_run_id if carry else workflow.info().run_id

    # --- messages ---------------------------------------------------------------------
    @workflow.signal
    def approve(self, sig: ApproveSignal) -> None:
        """Counts only with the right token, for the current plan, before expiry, once;
        every other attempt is recorded with its reason and changes nothing."""
        refusal = self._refusal(sig)
        if refusal is None:
            self._record_attempt(sig.approver, "accepted", ApprovalStatus.approved)
        else:
            self._record_attempt(sig.approver, refusal)

    @workflow.signal
    def reject(self, sig: RejectSignal) -> None:
        if (
            self._approval.status is not ApprovalStatus.pending
            or self._status is not Status.running
        ):
            self._record_attempt(
                sig.by, f"reject ignored: approval is already {self._approval.status.value}"
            )
        else:
            reason = f"rejected{': ' + sig.reason if sig.reason else ''}"
            self._record_attempt(sig.by, reason, ApprovalStatus.rejected)

    def _record_attempt(
        self, who: str, reason: str, decision: ApprovalStatus | None = None
    ) -> None:
        """Every approve/reject is recorded; only a ``decision`` changes the approval."""
        now = workflow.now()
        self._approval.attempts.append(
            ApprovalAttempt(
                at=now,
                approver=who,
                accepted=decision is ApprovalStatus.approved,
                reason=reason,
            )
        )
        if decision is not None:
            self._approval.status = decision
            self._approval.decided_by = who
            self._approval.decided_at = now

    @workflow.query
    def status(self) -> StatusView:
        return StatusView(
            experiment_id=self._spec.id,
            status=self._status,
            stage=self._stage,
            message=self._message,
            error=self._error,
            plan=self._plan,
            approval=self._approval,
            budget=self._budget,
            progress=self._progress(),
            cleanup=self._cleanup,
        )

    def _refusal(self, sig: ApproveSignal) -> str | None:
        state = self._approval
        if state.status is ApprovalStatus.approved:
            return "already approved: an approval token counts once"
        if state.status is ApprovalStatus.rejected:
            return "the experiment was rejected; start it again under a new spec id"
        if state.status is ApprovalStatus.expired:
            return "the approval window has expired; start it again under a new spec id"
        if state.status is ApprovalStatus.not_required:
            return "this experiment's spec does not require approval"
        if self._status is not Status.running:
            return f"the experiment has already ended ({self._status.value})"
        if self._plan is None or self._stage is not Stage.awaiting_approval:
            return f"the plan is not ready yet (stage {self._stage.value}); approve once it is"
        if not hmac.compare_digest(token_sha256(sig.token), state.token_sha256):
            return "wrong token: use the token printed (and filed) when the experiment started"
        if sig.fingerprint != self._plan.fingerprint:
            return (
                f"wrong plan fingerprint {sig.fingerprint[:16] or '(empty)'}: the current plan "
                f"is {self._plan.fingerprint}; review that plan and approve it"
            )
        if state.expires_at is not None and workflow.now() >= state.expires_at:
            return "the approval window has expired; start it again under a new spec id"
        return None

    # --- the run ----------------------------------------------------------------------
    @workflow.run
    async def run(self, inp: ExperimentInput) -> ExperimentResult:
        workflow.upsert_search_attributes([EXPERIMENT.value_set(self._spec.id)])
        analysis: AnalysisResult | None = None
        try:
            if inp.carry is None:
                await self._plan_and_approve()
            else:
                await self._resume(inp.carry)
            await self._run_prefixes()
            await self._run_worlds()
            await self._clean_up()
            analysis = await self._readout(await self._analyse())
            self._status = Status.completed
        except _Stop as stop:
            self._status = stop.status
            self._error = stop.reason
        except asyncio.CancelledError:
            await self._cancelled()
            raise
        except ActivityError as err:
            if isinstance(err.cause, CancelledError):
                await self._cancelled()
                raise asyncio.CancelledError from None
            self._status = Status.failed
            self._error = _cause(err)
            await self._stop_tasks()
        await self._clean_up()
        await self._record(analysis)
        self._enter(Stage.done, f"{self._status.value}{': ' + self._error if self._error else ''}")
        return self._result(analysis)

    async def _cancelled(self) -> None:
        """The operator cancelled: stop the batches, clean up, record; the caller re-raises."""
        self._status = Status.cancelled
        self._error = "cancelled by the operator"
        await self._stop_tasks()
        await self._clean_up()
        await self._record(None)
        self._enter(Stage.done, "cancelled")

    async def _plan_and_approve(self) -> None:
        spec = self._spec
        if spec.approval.required:
            self._approval.expires_at = workflow.now() + timedelta(
                minutes=spec.approval.expiry_minutes
            )
            if not self._approval.token_sha256:
                issued = await workflow.execute_activity_method(
                    PlanningActivities.issue_approval_token,
                    TokenInput(experiment_id=spec.id),
                    start_to_close_timeout=timeouts.SHORT_TIMEOUT,
                    retry_policy=timeouts.TRANSIENT_RETRY,
                    summary="issue the approval token (owner-only file on the worker)",
                )
                self._approval.token_sha256 = issued.sha256
                self._approval.token_location = issued.location
        self._enter(Stage.rehearsing, "rehearsing on the local twin (free)")
        rehearsal = await workflow.execute_activity_method(
            PlanningActivities.rehearse,
            RehearseInput(spec=spec, sample_episodes=self._inp.rehearsal_episodes),
            start_to_close_timeout=timeouts.REHEARSE_TIMEOUT,
            retry_policy=timeouts.TRANSIENT_RETRY,
            summary=f"rehearse {spec.id} on the local twin",
        )
        self._enter(Stage.resolving_snapshot, "resolving the snapshot every world starts from")
        snapshot = await workflow.execute_activity_method(
            PlanningActivities.resolve_snapshot,
            SnapshotInput(spec=spec),
            start_to_close_timeout=timeouts.SHORT_TIMEOUT,
            retry_policy=timeouts.TRANSIENT_RETRY,
            summary="resolve the runner + workload snapshot",
        )
        self._enter(Stage.checking_capacity, "checking budget and concurrency (no compute)")
        capacity = await workflow.execute_activity_method(
            PlanningActivities.check_capacity,
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
        self._plan = Plan(rehearsal=rehearsal, snapshot=snapshot, capacity=capacity)
        self._budget.estimated_world_seconds = capacity.estimated_world_seconds
        if not capacity.ok:
            raise _Stop(Status.refused, f"capacity check refused the plan: {capacity.reason}")
        if not spec.approval.required:
            return
        expires_at = self._approval.expires_at
        assert expires_at is not None
        self._enter(
            Stage.awaiting_approval,
            f"awaiting approval of plan {snapshot.fingerprint[:16]} "
            f"until {expires_at:%Y-%m-%d %H:%M:%S} UTC",
        )
        left = (expires_at - workflow.now()).total_seconds()
        try:
            await workflow.wait_condition(
                lambda: self._approval.status is not ApprovalStatus.pending,
                timeout=timedelta(seconds=max(left, 0.001)),
                timeout_summary="approval expiry",
            )
        except TimeoutError:
            self._approval.status = ApprovalStatus.expired
        if self._approval.status is ApprovalStatus.rejected:
            raise _Stop(Status.rejected, f"rejected by {self._approval.decided_by}")
        if self._approval.status is ApprovalStatus.expired:
            raise _Stop(Status.expired, "nobody approved the plan before it expired")

    async def _resume(self, carry: Carry) -> None:
        progress = await workflow.execute_activity_method(
            RecordActivities.load_progress,
            carry.progress_digest,
            start_to_close_timeout=timeouts.SHORT_TIMEOUT,
            retry_policy=timeouts.TRANSIENT_RETRY,
            summary="load the progress carried over by continue-as-new",
        )
        self._prefixes = {p.chunk.index: p for p in progress.prefixes}
        self._batches = {(b.world, b.chunk.index): b for b in progress.batches}

    # --- sandbox work -----------------------------------------------------------------
    def _chunks(self) -> list[EpisodeChunk]:
        assert self._plan is not None
        return self._plan.capacity.chunks

    async def _run_prefixes(self) -> None:
        units = [_Unit(c) for c in self._chunks() if c.index not in self._prefixes]
        self._enter(Stage.running_prefixes, "running each episode's prefix once")
        await self._run_units(units)

    async def _run_worlds(self) -> None:
        names = [w.name for w in self._spec.worlds]
        units = [
            _Unit(c, name)
            for c in self._chunks()  # chunk-major: every world advances over the same episodes
            for name in names
            if (name, c.index) not in self._batches
        ]
        self._enter(Stage.running_worlds, "running world batches")
        await self._run_units(units)

    def _remaining(self) -> float:
        b = self._budget
        return b.max_world_seconds - b.spent_world_seconds - b.reserved_world_seconds

    def _reservation(self, unit: _Unit) -> float:
        assert self._plan is not None
        rehearsal = self._plan.rehearsal
        if unit.world is None:
            rate, kind = rehearsal.prefix_seconds_per_episode, _PREFIX
        else:
            rate, kind = rehearsal.world_seconds_per_episode[unit.world], _WORLD
        return revised_reservation(
            self._spec.budget.safety_factor, rate, unit.chunk.size, self._slowdown.get(kind)
        )

    def _blocked(self, unit: _Unit) -> str | None:
        """Why ``unit`` cannot be useful any more (its chunk or world is already lost)."""
        if unit.world is None:
            return None
        if unit.chunk.index not in self._prefixes:
            return "its episodes' prefixes did not run"
        for (world, _), outcome in self._batches.items():
            if world == unit.world and outcome.status is not BatchStatus.completed:
                return f"the world is already {outcome.status.value}"
        return None

    def _skip(self, unit: _Unit, reason: str) -> None:
        worlds = [unit.world] if unit.world else [w.name for w in self._spec.worlds]
        for world in worlds:
            self._batches[(world, unit.chunk.index)] = BatchOutcome(
                world=world, chunk=unit.chunk, status=BatchStatus.skipped, error=reason
            )
        self._budget.skipped_batches += len(worlds)

    async def _run_units(self, units: list[_Unit]) -> None:
        """Run units with at most ``max_concurrent_sandboxes`` at once, never starting one
        whose reservation exceeds what the budget has left; continue-as-new when asked."""
        queue = deque(units)
        limit = self._spec.budget.max_concurrent_sandboxes
        while queue or self._tasks:
            while queue and len(self._tasks) < limit:
                unit = queue[0]
                blocked = self._blocked(unit)
                need = self._reservation(unit)
                if blocked is None and need > self._remaining():
                    if self._tasks:
                        break  # running units may hand back unspent reservation
                    blocked = (
                        f"budget: needs up to {need:.1f} world-seconds, "
                        f"{max(self._remaining(), 0.0):.1f} left"
                    )
                queue.popleft()
                if blocked is not None:
                    self._skip(unit, blocked)
                    continue
                self._budget.reserved_world_seconds += need
                self._tasks[asyncio.create_task(self._run_unit(unit, need))] = unit
                self._budget.peak_concurrent_sandboxes = max(
                    self._budget.peak_concurrent_sandboxes, len(self._tasks)
                )
                self._show()
            if self._tasks:
                await workflow.wait(list(self._tasks), return_when=asyncio.FIRST_COMPLETED)
                for task in [t for t in self._tasks if t.done()]:
                    del self._tasks[task]
                    task.result()  # a failed prefix ends the experiment here
            self._show()
            if queue and workflow.info().is_continue_as_new_suggested():
                await self._continue_as_new()

    async def _run_unit(self, unit: _Unit, need: float) -> None:
        assert self._plan is not None
        snapshot = self._plan.snapshot.snapshot_id
        job = RunnerJob(
            workload=self._spec.workload.name,
            params=dict(self._spec.workload.params),
            seed=self._spec.seed,
        )
        options: dict[str, Any] = {
            "start_to_close_timeout": timeouts.BATCH_START_TO_CLOSE,
            "heartbeat_timeout": timeouts.BATCH_HEARTBEAT_TIMEOUT,
            "retry_policy": timeouts.BATCH_RETRY,
            "cancellation_type": ActivityCancellationType.WAIT_CANCELLATION_COMPLETED,
            "summary": unit.label,
        }
        seconds = need  # an attempt that failed outright is charged its whole reservation
        try:
            if unit.world is None:
                prefix = await workflow.execute_activity_method(
                    SandboxActivities.run_prefixes,
                    PrefixInput(
                        experiment_id=self._spec.id,
                        job=job,
                        snapshot_id=snapshot,
                        chunk=unit.chunk,
                        reservation_seconds=need,
                    ),
                    **options,
                )
                self._prefixes[unit.chunk.index] = prefix
                seconds = prefix.seconds
                self._observe(
                    _PREFIX, seconds, self._plan.rehearsal.prefix_seconds_per_episode, unit
                )
                return
            plan = next(p for p in spec_world_plans(self._spec) if p["name"] == unit.world)
            world = WorldJob.model_validate(dict(plan))
            try:
                outcome = await workflow.execute_activity_method(
                    SandboxActivities.run_world_batch,
                    BatchInput(
                        experiment_id=self._spec.id,
                        job=job,
                        world=world,
                        snapshot_id=snapshot,
                        chunk=unit.chunk,
                        checkpoints_digest=self._prefixes[unit.chunk.index].checkpoints_digest,
                        reservation_seconds=need,
                    ),
                    **options,
                )
            except ActivityError as err:
                if isinstance(err.cause, CancelledError):
                    raise
                outcome = BatchOutcome(
                    world=unit.world,
                    chunk=unit.chunk,
                    status=BatchStatus.failed,
                    error=_cause(err),
                    seconds=need,
                )
            self._batches[(unit.world, unit.chunk.index)] = outcome
            seconds = outcome.seconds
            if outcome.status is BatchStatus.completed:
                rate = self._plan.rehearsal.world_seconds_per_episode[unit.world]
                self._observe(_WORLD, seconds, rate, unit)
        finally:
            self._budget.reserved_world_seconds -= need
            self._budget.spent_world_seconds += min(seconds, need)

    def _observe(self, kind: str, seconds: float, rate: float, unit: _Unit) -> None:
        seen = slowdown(seconds, rate, unit.chunk.size)
        self._slowdown[kind] = max(self._slowdown.get(kind, 0.0), seen)

    async def _stop_tasks(self) -> None:
        """Cancel running batches and wait until each has deleted its own sandbox."""
        for task in self._tasks:
            task.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks.clear()

    def _progress_record(self) -> Progress:
        return Progress(
            chunks=len(self._chunks()),
            prefixes=[self._prefixes[i] for i in sorted(self._prefixes)],
            batches=[self._batches[k] for k in sorted(self._batches, key=lambda k: (k[1], k[0]))],
        )

    async def _save_progress(self) -> str:
        return await workflow.execute_activity_method(
            RecordActivities.save_progress,
            self._progress_record(),
            start_to_close_timeout=timeouts.SHORT_TIMEOUT,
            retry_policy=timeouts.TRANSIENT_RETRY,
            summary="store the run's progress as one artifact",
        )

    async def _continue_as_new(self) -> None:
        if self._tasks:
            await workflow.wait(list(self._tasks))
            for task in list(self._tasks):
                del self._tasks[task]
                task.result()
        assert self._plan is not None
        digest = await self._save_progress()
        await workflow.wait_condition(workflow.all_handlers_finished)
        workflow.continue_as_new(
            self._inp.model_copy(
                update={
                    "carry": Carry(
                        origin_run_id=self._origin_run_id,
                        runs=self._runs + 1,
                        plan=self._plan,
                        approval=self._approval,
                        budget=self._budget,
                        slowdown=self._slowdown,
                        progress_digest=digest,
                    )
                }
            )
        )

    # --- the end ----------------------------------------------------------------------
    async def _clean_up(self) -> None:
        """Delete every sandbox labelled with this experiment, until none is left; once."""
        if self._cleanup is not None:
            return
        self._enter(Stage.cleaning_up, "deleting this experiment's sandboxes")
        self._cleanup = await workflow.execute_activity_method(
            SandboxActivities.cleanup_sandboxes,
            CleanupInput(experiment_id=self._spec.id),
            start_to_close_timeout=timeouts.CLEANUP_TIMEOUT,
            heartbeat_timeout=timeouts.BATCH_HEARTBEAT_TIMEOUT,
            retry_policy=timeouts.CLEANUP_RETRY,
            summary=f"cleanup: delete sandboxes labelled forklab.experiment={self._spec.id}",
        )

    async def _analyse(self) -> AnalysisResult:
        assert self._plan is not None
        self._enter(Stage.analysing, "pairing worlds and checking validity")
        digest = await self._save_progress()
        b = self._budget
        cleanup = self._cleanup
        infra = InfraUsage(
            world_seconds_budget=b.max_world_seconds,
            world_seconds_spent=round(b.spent_world_seconds, 6),
            max_concurrent_sandboxes=b.max_concurrent_sandboxes,
            peak_concurrent_sandboxes=b.peak_concurrent_sandboxes,
            skipped_batches=b.skipped_batches,
            sandboxes_left=cleanup.left if cleanup else 0,
        )
        approval = self._approval
        provenance = {
            "plan fingerprint": f"`{self._plan.fingerprint}`",
            "snapshot": f"`{self._plan.snapshot.snapshot_id}` ({self._plan.snapshot.backend})",
            "provenance": self._plan.snapshot.provenance or "not recorded",
            "approval": (
                f"{approval.status.value} by {approval.decided_by}"
                if approval.decided_by
                else approval.status.value
            ),
            "budget": f"{b.spent_world_seconds:.1f} of {b.max_world_seconds:g} world-seconds",
            "skipped batches": str(b.skipped_batches),
            "network isolation": self._isolation(),
            "cleanup": (
                f"{cleanup.found} found, {cleanup.removed} removed, {cleanup.left} left"
                if cleanup
                else "not run"
            ),
        }
        return await workflow.execute_activity_method(
            RecordActivities.analyse,
            AnalyseInput(
                spec=self._spec,
                code_digest=self._plan.snapshot.code_digest,
                snapshot_id=self._plan.snapshot.snapshot_id,
                progress_digest=digest,
                infra=infra,
                provenance=provenance,
            ),
            start_to_close_timeout=timeouts.ANALYSE_TIMEOUT,
            retry_policy=timeouts.TRANSIENT_RETRY,
            summary="analysis: pairs, slices, validity checks, report",
        )

    async def _readout(self, analysis: AnalysisResult) -> AnalysisResult:
        """The report gains a readout section: a model's, if it is faithful to the numbers,
        else the deterministic one. The activity always answers; should it still fail, the
        report stays as the analysis wrote it."""
        self._enter(Stage.analysing, "writing the readout")
        try:
            return await workflow.execute_activity_method(
                ReadoutActivities.write_readout,
                analysis,
                start_to_close_timeout=timeouts.READOUT_TIMEOUT,
                retry_policy=timeouts.TRANSIENT_RETRY,
                summary="readout: model, checked against the evidence packet, or deterministic",
            )
        except ActivityError as err:
            if isinstance(err.cause, CancelledError):
                raise
            return analysis

    def _isolation(self) -> str:
        """Whether every sandbox ran in a private network namespace, or why not."""
        ran: list[tuple[bool, str | None]] = [
            (p.network_isolated, p.note) for p in self._prefixes.values()
        ]
        ran += [
            (b.network_isolated, b.note)
            for b in self._batches.values()
            if b.status is not BatchStatus.skipped
        ]
        notes = [note or "no reason given" for isolated, note in ran if not isolated]
        if not notes:
            return f"every sandbox ({len(ran)}) ran in a private network namespace"
        return f"{len(notes)} of {len(ran)} sandboxes fell back: {notes[0]}"

    async def _record(self, analysis: AnalysisResult | None) -> None:
        self._enter(Stage.recording, "writing the ledger rows")
        plan = self._plan
        await workflow.execute_activity_method(
            RecordActivities.record_ledger,
            LedgerInput(
                experiment_id=self._spec.id,
                run_id=self._origin_run_id,
                status=self._status.value,
                spec=self._spec,
                plan_fingerprint=plan.fingerprint if plan else "",
                budget=self._budget.model_dump(mode="json"),
                approval=self._approval.model_dump(mode="json", exclude={"token_sha256"}),
                report_digest=analysis.report_digest if analysis else None,
                error=self._error,
                worlds=analysis.worlds if analysis else [],
                snapshot_id=plan.snapshot.snapshot_id if plan else "",
                code_digest=plan.snapshot.code_digest if plan else "",
            ),
            start_to_close_timeout=timeouts.SHORT_TIMEOUT,
            retry_policy=timeouts.TRANSIENT_RETRY,
            summary="ledger: one experiment row and one row per world",
        )

    def _result(self, analysis: AnalysisResult | None) -> ExperimentResult:
        skipped = [
            f"{b.world} episodes {b.chunk.first}..{b.chunk.stop - 1}: {b.error}"
            for b in self._batches.values()
            if b.status is BatchStatus.skipped
        ]
        return ExperimentResult(
            experiment_id=self._spec.id,
            status=self._status,
            error=self._error,
            plan_fingerprint=self._plan.fingerprint if self._plan else None,
            snapshot_id=self._plan.snapshot.snapshot_id if self._plan else None,
            approval=self._approval,
            budget=self._budget,
            cleanup=self._cleanup,
            analysis=analysis,
            skipped=skipped,
            network_isolation=self._isolation(),
            runs=self._runs,
        )

    # --- what the Web UI shows ------------------------------------------------------------
    def _progress(self) -> RunProgress:
        values = list(self._batches.values())
        return RunProgress(
            prefix_chunks=len(self._plan.capacity.chunks) if self._plan else 0,
            prefixes_done=len(self._prefixes),
            batches=self._plan.capacity.batches if self._plan else 0,
            batches_completed=sum(b.status is BatchStatus.completed for b in values),
            batches_failed=sum(b.status is BatchStatus.failed for b in values),
            batches_skipped=sum(b.status is BatchStatus.skipped for b in values),
            running=len(self._tasks),
        )

    def _enter(self, stage: Stage, message: str) -> None:
        self._stage = stage
        self._message = message
        workflow.upsert_search_attributes([STAGE.value_set(stage.value)])
        self._show()

    def _show(self) -> None:
        p = self._progress()
        b = self._budget
        lines = [
            f"**{self._spec.id}** · stage **{self._stage.value}** · {self._message}",
            "",
            f"- prefixes: {p.prefixes_done}/{p.prefix_chunks} chunks",
            f"- world batches: {p.batches_completed}/{p.batches} done, {p.batches_failed} failed, "
            f"{p.batches_skipped} skipped, {p.running} running",
            f"- budget: {b.spent_world_seconds:.1f} of {b.max_world_seconds:g} world-seconds "
            f"spent, {b.reserved_world_seconds:.1f} reserved",
            f"- approval: {self._approval.status.value}",
        ]
        if self._plan:
            lines.append(f"- plan fingerprint: `{self._plan.fingerprint}`")
        workflow.set_current_details("\n".join(lines))
