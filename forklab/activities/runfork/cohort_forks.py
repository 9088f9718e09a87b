"""The side effects of an experiment over a cohort: the rehearsal (read the cohort, resolve
each run's fork point, estimate the cost; nothing starts), one fork (started with the
run-fork half's ``ForkStarter``, awaited with heartbeats, scored), the cleanup that
reconciles the experiment's running forks to zero, the analysis and report, and the
ledger rows.

Forks are their own workflows on ``<queue>@forklab``, tagged with the experiment run's key
in the ``ForkLabExperiment`` search attribute: cleanup finds every one of them by that
tag, whichever activity started it. A fork's workflow id is derived from the experiment's
run, the cohort run, the world and the fork index, so an attempt retried after its worker
died finds the fork the earlier attempt started instead of starting a second one, and
its row in the shared ledger is written once (the first write stands).

The plan travels as a digest (``cohort_plans``): the rehearsal stores it, each fork and
the analysis read it back.
"""

from __future__ import annotations

import asyncio
import base64
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from temporalio import activity
from temporalio.api.common.v1 import Payload
from temporalio.client import Client, WorkflowHandle
from temporalio.exceptions import ApplicationError
from temporalio.service import RPCError, RPCStatusCode

from forklab.activities.experiment.evidence_log import EvidenceActivities
from forklab.activities.heartbeat import heartbeat_until
from forklab.activities.runfork.closed_fork import closed_chain
from forklab.activities.runfork.cohort_code import CohortCode
from forklab.activities.runfork.cohort_evidence import cohort_trace
from forklab.activities.runfork.cohort_looks import cohort_look, planned_design
from forklab.activities.runfork.cohort_overrides import fork_override
from forklab.activities.runfork.cohort_plans import CohortPlans
from forklab.activities.runfork.cohort_reads import cohort_ids, read_recorded
from forklab.activities.runfork.cohort_teams import (
    CohortTeamForks,
    estimates_of,
    resolve_teams,
    team_ledger_json,
)
from forklab.activities.runfork.fork_start import ForkError, ForkExists, ForkStarter, final_state
from forklab.activities.runfork.history_events import RunRecord, chain_steps
from forklab.activities.runfork.history_reads import RunNotFound
from forklab.activities.sandbox.cohort_code_calls import UserCodeError
from forklab.activities.stores.artifacts import ArtifactError
from forklab.activities.stores.fork_registry import ForkRegistry
from forklab.activities.stores.ledger import (
    ExperimentRecord,
    ForkOutcomeKind,
    ForkRecord,
    Ledger,
    WorldRecord,
)
from forklab.activities.stores.team_registry import TeamRegistry
from forklab.contracts.cohort import (
    ANALYSE,
    CLEANUP_FORKS,
    LISTED_RUNS,
    RECORD_LEDGER,
    REHEARSE,
    RUN_FORK,
    CohortAnalyseInput,
    CohortLedgerInput,
    CohortRehearsal,
    CohortRehearseInput,
    CohortReport,
    DesignLine,
    ForkCleanupInput,
    ForkCleanupResult,
    ForkJob,
    ForkOutcome,
    ForkStatus,
    PlannedDesign,
    WorldLine,
    cohort_fork_id,
)
from forklab.contracts.errors import ExperimentErrorType
from forklab.contracts.experiment import EvidenceLogResult, WorldLook
from forklab.contracts.fork_request import ForkRequest
from forklab.contracts.runfork import MODEL_FIELDS, CohortFork, ForkMarker
from forklab.contracts.search_attributes import EXPERIMENT
from forklab.contracts.team import TEAM_UPDATE_ACTIVITY
from forklab.experiments.cohort.plan import (
    CohortPlan,
    CohortRun,
    ExcludedRun,
    RecordedRun,
    attach_teams,
    fork_policies,
    plan_cohort,
    plan_fingerprint,
)
from forklab.experiments.cohort.report import render_markdown, summarise
from forklab.experiments.cohort.team_episode import member_forks
from forklab.experiments.runfork.steps import Step, StepOrigin, StepStatus
from forklab.runtime.canon import digest

#: How long cleanup asks running forks to cancel before it terminates them.
CANCEL_GRACE_SECONDS = 15.0
CLEANUP_POLL_SECONDS = 0.5


def _bad_spec(message: str) -> ApplicationError:
    return ApplicationError(message, type=ExperimentErrorType.bad_spec, non_retryable=True)


def _broken(exc: UserCodeError) -> ApplicationError:
    """The user's scorer or feature function broke its contract: final, not retried."""
    return ApplicationError(
        str(exc), type=ExperimentErrorType.workload_contract, non_retryable=True
    )


def _tokens(step: Step) -> int:
    """The tokens a model call's recorded answer reports (0 when it reports none)."""
    if step.result_b64 is None:
        return 0
    try:
        answer = json.loads(Payload.FromString(base64.b64decode(step.result_b64)).data)
    except ValueError:
        return 0
    if not isinstance(answer, dict):
        return 0
    usage = answer.get("usage")
    if not isinstance(usage, dict):
        usage = answer
    total = 0
    for key in ("prompt_tokens", "completion_tokens", "input_tokens", "output_tokens"):
        value = usage.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            total += value
    return total


def _estimates(recorded: RecordedRun, at_step: int) -> tuple[int, int, float]:
    """Model calls, tokens and seconds of one run's recorded steps after its fork point:
    what one fork of it is expected to spend."""
    after = [s for s in recorded.steps if s.index > at_step]
    calls = [s for s in after if s.activity_type in MODEL_FIELDS]
    seconds = sum((s.duration_ms or 0.0) for s in after) / 1000.0
    return len(calls), sum(_tokens(s) for s in calls), seconds


class CohortActivities:
    """Activities of the experiment workflow over a cohort, bound to one namespace's
    client, the fork registry, the shared experiment ledger, the plans in the artifact
    store and the reports' folder."""

    def __init__(
        self,
        client: Client,
        registry: ForkRegistry,
        home: Path,
        ledger: Ledger,
        plans: CohortPlans,
        reports_dir: Path,
        evidence: EvidenceActivities | None = None,
        code: CohortCode | None = None,
    ) -> None:
        """``evidence``: the evidence log whose outbox sends each experiment's Braintrust
        spans (``cohort_evidence``) when Braintrust is configured."""
        self._client = client
        self._evidence = evidence
        #: the spec's scorer and feature function (the user's own in boxes)
        self._code = code or CohortCode()
        self._registry = registry
        self._starter = ForkStarter(client, registry, home)
        #: whole teams, for a cohort of teams (``cohort.team``)
        self._teams = CohortTeamForks(client, TeamRegistry(registry.path))
        self._ledger = ledger
        self._plans = plans
        self._reports = reports_dir

    def activities(self) -> list[Callable[..., Any]]:
        """What a worker running the cohort workflow registers: these activities and the
        look that decides a sequential design's worlds (``cohort_look``)."""
        return [
            self.rehearse,
            self.fork,
            self.cleanup,
            self.analyse,
            self.record_ledger,
            cohort_look,
        ]

    def _plan(self, artifact: str) -> CohortPlan:
        try:
            return self._plans.get(artifact)
        except (ArtifactError, ValueError) as exc:
            raise ApplicationError(
                f"the cohort plan {artifact[:16]} cannot be read: {exc}",
                type=ExperimentErrorType.bad_spec,
                non_retryable=True,
            ) from None

    # --- rehearsal ----------------------------------------------------------------------
    @activity.defn(name=REHEARSE.name)
    async def rehearse(self, inp: CohortRehearseInput) -> CohortRehearsal:
        spec = inp.spec
        try:
            code = self._code.prepare(spec, inp.code_bundle)
        except UserCodeError as exc:
            raise _broken(exc) from None
        except ValueError as exc:
            raise _bad_spec(str(exc)) from None
        recorded: list[RecordedRun] = []
        missing: list[ExcludedRun] = []
        for workflow_id in await cohort_ids(self._client, spec):
            activity.heartbeat(workflow_id)
            try:
                recorded.append(await read_recorded(self._client, workflow_id))
            except RunNotFound:
                missing.append(
                    ExcludedRun(
                        workflow_id=workflow_id, reason="no run with this id in the namespace"
                    )
                )
        plan = plan_cohort(spec, recorded, missing)
        by_id = {r.workflow_id: r for r in recorded}
        members: dict[str, RecordedRun] = {}
        if spec.cohort.team is not None:
            teams = await resolve_teams(self._client, spec, plan.runs)
            members = teams.recorded
            plan = attach_teams(
                spec, plan, teams.episodes, teams.member_tools(), TEAM_UPDATE_ACTIVITY
            )
        if not plan.runs:
            reasons = "; ".join(f"{e.workflow_id}: {e.reason}" for e in plan.excluded[:3])
            raise _bad_spec(
                f"cohort: no run of the cohort can be forked ({len(plan.excluded)} excluded"
                f"{': ' + reasons if reasons else ''}); check the query or ids and fork_at"
            )
        try:
            plan = await self._code.rehearse(spec, code, plan, by_id, self._client)
        except UserCodeError as exc:
            raise _broken(exc) from None
        k, worlds = spec.cohort.forks_per_world, len(spec.worlds)
        calls = tokens = 0
        seconds = 0.0
        for run in plan.runs:
            forked = (
                [(by_id[run.workflow_id], run.at_step)]
                if run.team is None
                else estimates_of(run, members)
            )
            for rec, at_step in forked:
                c, t, s = _estimates(rec, at_step)
                calls += c * k * worlds
                tokens += t * k * worlds
                seconds += s * k * worlds
        forks = len(plan.runs) * k * worlds
        budget = spec.budget
        design = planned_design(spec, len(plan.runs))
        over = [
            text
            for text, bad in (
                (str(design), isinstance(design, str)),
                (f"{forks} forks over max_forks {budget.max_forks}", forks > budget.max_forks),
                (
                    f"about {tokens} model tokens over max_model_tokens {budget.max_model_tokens}",
                    tokens > budget.max_model_tokens,
                ),
                (
                    f"about {seconds:.0f} world-seconds over max_world_seconds "
                    f"{budget.max_world_seconds:.0f}",
                    seconds > budget.max_world_seconds,
                ),
            )
            if bad
        ]
        return CohortRehearsal(
            plan=await asyncio.to_thread(self._plans.put, plan),
            scorer=spec.cohort.outcome,
            code=code,
            forks=forks,
            estimated_model_calls=calls,
            estimated_tokens=tokens,
            estimated_world_seconds=seconds,
            fingerprint=plan_fingerprint(spec, plan, code.digest if code else None),
            capacity_ok=not over,
            capacity_reason="; ".join(over),
            design=design if isinstance(design, PlannedDesign) else None,
        )

    # --- one fork -----------------------------------------------------------------------
    @activity.defn(name=RUN_FORK.name)
    async def fork(self, job: ForkJob) -> ForkOutcome:
        """Start (or find, on a retry) the fork, wait for it with heartbeats, score it.
        Cancelled, it cancels its fork before it ends."""
        fork_id = cohort_fork_id(job.run_key, job.run_index, job.world.name, job.fork)
        began = time.monotonic()
        plan = await asyncio.to_thread(self._plan, job.plan_artifact)
        if job.run_index >= len(plan.runs):
            raise _bad_spec(f"the cohort plan has no run #{job.run_index}")
        run = plan.runs[job.run_index]
        if run.team is not None:
            outcome = await self._team_fork(job, run, plan, fork_id, began)
            await asyncio.to_thread(self._record_fork, job, run, outcome)
            return outcome
        starting = asyncio.ensure_future(self._start_or_find(job, run, plan, fork_id))
        try:
            handle = await asyncio.shield(starting)
        except asyncio.CancelledError:
            started = await asyncio.gather(starting, return_exceptions=True)
            if isinstance(started[0], WorkflowHandle):
                await _cancel(started[0])
            raise
        except (ForkError, RunNotFound) as exc:
            # the fork cannot be made (its boundary, or the recorded run, is gone): no
            # outcome, never a failure
            outcome = self._outcome(job, fork_id, ForkStatus.error, error=str(exc))
        else:
            try:
                chain = await heartbeat_until(closed_chain(self._client, handle), lambda: fork_id)
            except asyncio.CancelledError:
                await _cancel(handle)
                raise
            outcome = await self._score(job, run, chain, fork_id, time.monotonic() - began)
        await asyncio.to_thread(self._record_fork, job, run, outcome)
        return outcome

    async def _start_or_find(
        self, job: ForkJob, run: CohortRun, plan: CohortPlan, fork_id: str
    ) -> WorkflowHandle[Any, Any]:
        """The fork's workflow: started here, or found when an earlier attempt started it
        (its receipt recorded, or only its workflow started before that attempt died)."""
        found = self._client.get_workflow_handle(fork_id)
        if self._registry.receipt(fork_id) is not None:
            return found
        try:
            fork = await self._starter.fork(_world_fork(job, run, plan, fork_id))
        except ForkExists:
            # an earlier attempt started it; its receipt too, unless that attempt died
            # between the two (recorded now from the fork's own start)
            await self._starter.record_started(fork_id)
            return found
        return fork.handle

    async def _team_fork(
        self, job: ForkJob, run: CohortRun, plan: CohortPlan, fork_id: str, began: float
    ) -> ForkOutcome:
        """A world's fork of the run's whole team (``cohort.team``), scored on the team's
        result: the result member's result, with every member's end as the final state."""
        assert run.team is not None
        try:
            forked = await self._teams.fork(run, _world_fork(job, run, plan, fork_id))
        except (ForkError, RunNotFound) as exc:
            return self._outcome(job, fork_id, ForkStatus.error, error=str(exc))
        team = run.team
        view = forked.view(fork_id, run.workflow_id, team.result_member)
        steps_at = {m.workflow_id: m.at_step for m in forked.cut.members}
        tokens = sum(
            _own_tokens(chain_steps(c), steps_at[wid])
            for wid, c in forked.chains.items()
            if wid in member_forks(fork_id, forked.cut)
        )
        requested = forked.chains.get(run.workflow_id)
        return await self._scored(
            job,
            run,
            fork_id,
            forked.chains[team.result_member],
            view.model_dump(mode="json"),
            tokens=tokens,
            seconds=time.monotonic() - began,
            marker=requested[0].marker if requested else None,
            receipt=forked.record.receipt.model_dump(mode="json"),
        )

    async def _score(
        self, job: ForkJob, run: CohortRun, chain: list[RunRecord], fork_id: str, seconds: float
    ) -> ForkOutcome:
        receipt = chain[0].receipt
        return await self._scored(
            job,
            run,
            fork_id,
            chain,
            final_state(chain),
            tokens=_own_tokens(chain_steps(chain), run.at_step),
            seconds=seconds,
            marker=chain[0].marker,
            receipt=receipt.model_dump(mode="json") if receipt else None,
        )

    async def _scored(
        self,
        job: ForkJob,
        run: CohortRun,
        fork_id: str,
        chain: list[RunRecord],
        state: Any,
        *,
        tokens: int,
        seconds: float,
        marker: ForkMarker | None,
        receipt: dict[str, Any] | None,
    ) -> ForkOutcome:
        """The outcome of a fork whose scored chain (a run's fork, or a team fork's result
        member) has closed: the spec's scorer over its result, ``state`` and steps."""
        last = chain[-1]
        completed = last.status == "completed"
        result = last.close.get("result") if completed else None
        try:
            score, success = await self._code.score(
                job, run.workflow_id, result, state, chain_steps(chain)
            )
        except UserCodeError as exc:
            raise _broken(exc) from None
        return self._outcome(
            job,
            fork_id,
            ForkStatus.completed if completed else ForkStatus.failed,
            score=score,
            success=success,
            tokens=tokens,
            seconds=seconds,
            lineage_root=marker.lineage_root if marker else "",
            receipt_sha256=digest(receipt) if receipt is not None else "",
        )

    def _outcome(
        self, job: ForkJob, fork_id: str, status: ForkStatus, **fields: Any
    ) -> ForkOutcome:
        return ForkOutcome(
            run_index=job.run_index,
            world=job.world.name,
            fork=job.fork,
            fork_id=fork_id,
            status=status,
            **fields,
        )

    def _record_fork(self, job: ForkJob, run: CohortRun, outcome: ForkOutcome) -> None:
        """The fork's row in the shared ledger, once: an attempt retried after its worker
        died (or after the write's answer was lost) finds the row written and keeps it."""
        kind = (
            ForkOutcomeKind.missing
            if outcome.status is ForkStatus.error
            else ForkOutcomeKind.success
            if outcome.success
            else ForkOutcomeKind.failure
        )
        self._ledger.record_fork(
            ForkRecord(
                experiment_id=job.experiment_id,
                run_id=job.run_key.rsplit("/", 1)[-1],
                fork_id=outcome.fork_id,
                cohort_run=run.workflow_id,
                run_index=job.run_index,
                world=job.world.name,
                fork=job.fork,
                status=outcome.status.value,
                outcome=kind,
                score=outcome.score,
                tokens=outcome.tokens,
                seconds=outcome.seconds,
                lineage_root=outcome.lineage_root,
                receipt_sha256=outcome.receipt_sha256,
                error=outcome.error,
                created_at=datetime.now(UTC),
                team_json=None
                if run.team is None
                else json.dumps(team_ledger_json(run, job.world, outcome.fork_id), sort_keys=True),
            )
        )

    # --- cleanup ------------------------------------------------------------------------
    @activity.defn(name=CLEANUP_FORKS.name)
    async def cleanup(self, inp: ForkCleanupInput) -> ForkCleanupResult:
        """Cancel every running fork tagged with this experiment run, terminate what is
        still running after ``CANCEL_GRACE_SECONDS``, until visibility lists none."""
        if "'" in inp.run_key or "\\" in inp.run_key:
            raise _bad_spec(f"run key {inp.run_key[:60]!r} cannot be quoted in a query")
        query = f"{EXPERIMENT.name} = '{inp.run_key}' AND ExecutionStatus = 'Running'"
        asked: set[str] = set()
        began = time.monotonic()
        while True:
            running = [e.id async for e in self._client.list_workflows(query)]
            activity.heartbeat(len(running))
            if not running:
                return ForkCleanupResult(cancelled=len(asked), remaining=0)
            late = time.monotonic() - began > CANCEL_GRACE_SECONDS
            for workflow_id in running:
                handle = self._client.get_workflow_handle(workflow_id)
                if late:
                    await _quietly(handle.terminate("experiment cleanup: still running"))
                elif workflow_id not in asked:
                    await _quietly(handle.cancel())
                asked.add(workflow_id)
            await asyncio.sleep(CLEANUP_POLL_SECONDS)

    # --- analysis and ledger ------------------------------------------------------------
    @activity.defn(name=ANALYSE.name)
    async def analyse(self, inp: CohortAnalyseInput) -> CohortReport:
        spec = inp.spec
        plan = await asyncio.to_thread(self._plan, inp.plan_artifact)
        ids = [r.workflow_id for r in plan.runs]
        try:
            summary = summarise(spec, inp.outcomes, inp.costs, [r.features for r in plan.runs], ids)
        except ValueError as exc:
            raise ApplicationError(
                str(exc), type=ExperimentErrorType.analysis_failed, non_retryable=True
            ) from None
        base = spec.baseline.name
        diffs = {
            w.world: {
                i: _diff_command(plan.runs[i], inp.run_key, i, base, w.world)
                for i in w.rescued + w.harmed
            }
            for w in summary.worlds
        }
        markdown = render_markdown(spec, summary, ids, diffs)
        markdown_artifact = await asyncio.to_thread(self._plans.store.put_bytes, markdown.encode())
        listed = {
            w.world: {
                "rescued": [diffs[w.world][i] for i in w.rescued],
                "harmed": [diffs[w.world][i] for i in w.harmed],
            }
            for w in summary.worlds
        }
        lines = [
            WorldLine(
                world=w.world,
                role=w.role.value,
                description=w.description,
                verdict=w.judgement.verdict.value,
                as_expected=w.judgement.as_expected,
                rescues=w.judgement.comparison.rescues,
                harms=w.judgement.comparison.harms,
                unchanged=w.judgement.comparison.unchanged,
                rate_difference=w.judgement.comparison.rate_difference,
                holm_p=w.judgement.holm_p,
                cost_per_rescue_tokens=w.cost_per_rescue_tokens,
                cost_per_rescue_seconds=w.cost_per_rescue_seconds,
                text=w.judgement.text,
                rescued=listed[w.world]["rescued"][:LISTED_RUNS],
                harmed=listed[w.world]["harmed"][:LISTED_RUNS],
            )
            for w in summary.worlds
        ]
        folder = self._reports / spec.id / inp.run_key.rsplit("/", 1)[-1]
        report = CohortReport(
            experiment_id=spec.id,
            runs=summary.runs,
            forks_per_world=spec.cohort.forks_per_world,
            missing_forks=summary.missing_forks,
            saved_forks=summary.saved_forks,
            flip_rate=summary.floor.flip_rate,
            flip_ci_low=summary.floor.ci_low,
            flip_ci_high=summary.floor.ci_high,
            worlds=lines,
            markdown_artifact=markdown_artifact,
            report_dir=str(folder),
            report_sha256=digest({"markdown": markdown}),
            guard=summary.guard,
            design=[
                DesignLine(
                    world=d.path.world,
                    stopped=d.path.stopped,
                    looks=[
                        WorldLook(world=d.path.world, **look.model_dump()) for look in d.path.looks
                    ],
                    runs=d.path.episodes,
                    p_value=d.path.p_value,
                    holm_p=d.path.holm_p,
                    ci_low=d.path.ci_low,
                    ci_high=d.path.ci_high,
                    verdict=d.verdict.value,
                    as_expected=d.as_expected,
                    unspent_forks=d.unspent_forks,
                    unspent_tokens=d.unspent_tokens,
                    unspent_seconds=d.unspent_seconds,
                    text=d.text,
                )
                for d in summary.design
            ],
            unspent_forks=summary.unspent_forks,
        )
        slices = {w: [x.model_dump(mode="json") for x in v] for w, v in summary.slices.items()}
        files = ReportFiles(markdown=markdown, listed=listed, slices=slices)
        await asyncio.to_thread(_write_report, folder, report, inp, plan, files)
        return report

    @activity.defn(name=RECORD_LEDGER.name)
    async def record_ledger(self, inp: CohortLedgerInput) -> EvidenceLogResult | None:
        """The experiment's row and one row per world (the forks' rows were written as
        each fork was scored, ``record_fork``), then the Braintrust spans when it is
        configured: what became of them, or None when it is not."""
        await asyncio.to_thread(self._record_rows, inp)
        evidence = self._evidence
        if evidence is None or evidence.config is None:
            return None
        name = f"cohort__{inp.experiment_id}__{inp.run_id}"
        return await evidence.send(evidence.config, name, cohort_trace(inp))

    def _record_rows(self, inp: CohortLedgerInput) -> None:
        now = datetime.now(UTC)
        self._ledger.record_experiment(
            ExperimentRecord(
                experiment_id=inp.experiment_id,
                run_id=inp.run_id,
                status=inp.status,
                hypothesis=inp.spec.hypothesis.text,
                plan_fingerprint=inp.fingerprint,
                spec_json=json.dumps(inp.spec.canonical(), sort_keys=True),
                budget_json=inp.budget_json,
                approval_json=inp.approval_json,
                report_digest=inp.report.report_sha256 if inp.report else None,
                error=inp.error,
                created_at=now,
                updated_at=now,
            )
        )
        report = inp.report
        if report is None:
            return
        base = inp.spec.baseline
        floor = {
            "world": base.name,
            "flip_rate": report.flip_rate,
            "flip_ci_low": report.flip_ci_low,
            "flip_ci_high": report.flip_ci_high,
        }
        checks = [(base.name, base.role.value, json.dumps(floor, sort_keys=True))]
        checks += [(w.world, w.role, w.model_dump_json()) for w in report.worlds]
        for world, role, checks_json in checks:
            self._ledger.record_world(
                WorldRecord(
                    experiment_id=inp.experiment_id,
                    run_id=inp.run_id,
                    world=world,
                    role=role,
                    status=inp.status,
                    snapshot_id=inp.plan_digest,
                    code_digest=inp.spec.cohort.outcome,
                    world_seconds=inp.costs[world].seconds if world in inp.costs else 0.0,
                    episodes=report.runs,
                    failures=0,
                    outcomes_digest=report.report_sha256,
                    checks_json=checks_json,
                    created_at=now,
                )
            )


def _world_fork(job: ForkJob, run: CohortRun, plan: CohortPlan, fork_id: str) -> ForkRequest:
    """The fork ``fork_id`` of ``run`` in the job's world: its point and override, the
    world's intervention, model and tool policies, the cohort part and the experiment
    run's tag. For a team, the fork of its requested member, from which the team fork is
    asked for (named ``fork_id`` too; its members' forks are ``<fork_id>/<member id>``)."""
    world = job.world
    override = fork_override(run, world)
    return ForkRequest(
        run=run.workflow_id,
        at_step=override.at_step,
        name=fork_id,
        intervention=world.intervention.model_dump(mode="json") if world.intervention else None,
        model=world.model,
        tool_policies=fork_policies(plan, world),
        requested_by=f"experiment {job.experiment_id}",
        result_override=override.result,
        input_override=override.input,
        cohort=_cohort_part(job),
        experiment_tag=job.run_key,
    )


def _cohort_part(job: ForkJob) -> CohortFork:
    """The marker's ``cohort`` part of a fork of ``job``: its seeds' coordinates and the
    world's prompt patch and faults (on every member's fork, for a team)."""
    world = job.world
    return CohortFork(
        experiment=job.run_key,
        seed=job.seed,
        run=job.run_index,
        fork=job.fork,
        world=world.name,
        prompt_patch=world.prompt_patch,
        faults=world.faults,
    )


def _own_tokens(steps: list[Step], at_step: int) -> int:
    """The tokens of the model calls a fork made itself after its point ``at_step``."""
    return sum(
        _tokens(s)
        for s in steps
        if s.activity_type in MODEL_FIELDS
        and s.origin is StepOrigin.own
        and s.status is StepStatus.completed
        and s.index > at_step
    )


def _diff_command(run: CohortRun, run_key: str, index: int, base: str, world: str) -> str:
    """The command that shows a run's fork pair (baseline fork #0, world fork #0); for a
    team, the pair of the result member's forks (``forklab diff TEAMFORK`` shows one team
    fork against its originals, member by member)."""
    a, b = cohort_fork_id(run_key, index, base, 0), cohort_fork_id(run_key, index, world, 0)
    if run.team is not None:
        member = run.team.result_member
        return f"forklab diff {a}/{member} {b}/{member}"
    return f"forklab diff {a} {b}"


async def _quietly(call: Any) -> None:
    """A cancel or terminate of a fork that may have closed meanwhile."""
    try:
        await call
    except RPCError as exc:
        if exc.status not in (RPCStatusCode.NOT_FOUND, RPCStatusCode.FAILED_PRECONDITION):
            raise


async def _cancel(handle: WorkflowHandle[Any, Any]) -> None:
    await _quietly(handle.cancel())


@dataclass(frozen=True)
class ReportFiles:
    """What the report's files hold beyond the report itself: its Markdown, every rescued
    and harmed run's ``forklab diff`` per world (the report's lines name the first
    ``LISTED_RUNS``), and the slices."""

    markdown: str
    listed: dict[str, dict[str, list[str]]]
    slices: dict[str, Any]


def _write_report(
    folder: Path,
    report: CohortReport,
    inp: CohortAnalyseInput,
    plan: CohortPlan,
    files: ReportFiles,
) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "report.md").write_text(files.markdown, encoding="utf-8")
    body = {
        "report": report.model_dump(mode="json"),
        "outcomes": inp.outcomes,
        "costs": {k: v.model_dump(mode="json") for k, v in inp.costs.items()},
        "plan_artifact": inp.plan_artifact,
        "runs": [r.model_dump(mode="json") for r in plan.runs],
        "excluded": [e.model_dump(mode="json") for e in plan.excluded],
        "tools": {t: p.value for t, p in plan.tools.items()},
        "slices": files.slices,
        "listed": files.listed,
    }
    (folder / "report.json").write_text(json.dumps(body, indent=2, sort_keys=True), "utf-8")
