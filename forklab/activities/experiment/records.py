"""Record activities: progress artifacts, the analysis and report, and the ledger rows."""

from __future__ import annotations

import asyncio
from concurrent.futures import Executor
from datetime import UTC, datetime
from typing import Any

from temporalio import activity
from temporalio.exceptions import ApplicationError

from forklab.activities.experiment.held_out import HeldOutAhead
from forklab.activities.experiment.progress import prefix_refs, read_progress, save_progress
from forklab.activities.experiment.workload_bundles import WorkloadBundleError, WorkloadBundles
from forklab.activities.heartbeat import heartbeat_until
from forklab.activities.sandbox.workload_calls import (
    WorkloadCallError,
    WorkloadCalls,
    WorkloadSpecError,
)
from forklab.activities.stores.artifacts import ArtifactStore
from forklab.activities.stores.ledger import ExperimentRecord, Ledger, WorldRecord
from forklab.contracts.errors import ExperimentErrorType
from forklab.contracts.experiment import (
    AnalyseInput,
    AnalysisResult,
    BatchOutcome,
    BatchStatus,
    LedgerInput,
    LookInput,
    LookResult,
    PrefixRef,
    PrefixRefsInput,
    Progress,
    SaveProgressInput,
    WorldSummary,
)
from forklab.contracts.experiment_activities import (
    ANALYSE,
    DECIDE_LOOK,
    LOAD_PREFIX_REFS,
    RECORD_LEDGER,
    SAVE_PROGRESS,
)
from forklab.experiments.experiment.analysis.build import build_report
from forklab.experiments.experiment.bundle import BundleFile
from forklab.experiments.experiment.outcomes import (
    ExperimentOutcomes,
    StoredColumns,
    WorldOutcomes,
    concat_stored,
    outcomes_digest,
)
from forklab.experiments.experiment.report.render_html import render_html
from forklab.experiments.experiment.report.render_markdown import render_markdown
from forklab.experiments.experiment.results import Check, WorldStatus
from forklab.experiments.experiment.sequential import design_for, look_paths
from forklab.experiments.experiment.spec import ExperimentSpec, Role
from forklab.experiments.experiment.workspace_report import WorkspaceSection, workspace_section
from forklab.experiments.workspace import WorkspaceEvidence, WorkspaceManifest
from forklab.runtime.canon import canonical_json
from forklab.runtime.file_format import checkpoint_id, parse_checkpoints


def _world_outcomes(
    name: str,
    batches: list[BatchOutcome],
    chunks: int,
    store: ArtifactStore,
    inp: AnalyseInput,
) -> WorldOutcomes:
    """Concatenate one world's batches in chunk order; a world missing any batch is not
    completed, and says why. Under a sequential design a world whose batches are the
    first chunks, none failed or skipped, *stopped*: the analysis checks that its design
    stopped it there (``checks.completion``)."""
    seconds = sum(b.seconds for b in batches)
    base = {"name": name, "code_digest": inp.code_digest, "snapshot": inp.snapshot_id}
    failed = [b for b in batches if b.status is BatchStatus.failed]
    if failed:
        first = failed[0]
        error = f"episodes {first.chunk.first}..{first.chunk.stop - 1}: {first.error}"
        return WorldOutcomes(**base, status=WorldStatus.failed, error=error, world_seconds=seconds)
    done = sorted(
        (b for b in batches if b.status is BatchStatus.completed), key=lambda b: b.chunk.index
    )
    skipped = [b for b in batches if b.status is BatchStatus.skipped]
    status = WorldStatus.completed
    if len(done) != chunks:
        first_chunks = [b.chunk.index for b in done] == list(range(len(done)))
        if skipped or inp.spec.analysis.sequential is None or not first_chunks:
            why = skipped[0].error if skipped else "not run"
            error = f"{chunks - len(done)} of {chunks} batches skipped ({why})"
            return WorldOutcomes(
                **base, status=WorldStatus.skipped, error=error, world_seconds=seconds
            )
        status = WorldStatus.stopped
    parts = [StoredColumns.model_validate(store.get_json(b.columns_digest or "")) for b in done]
    return WorldOutcomes(**base, **concat_stored(parts), status=status, world_seconds=seconds)


def look_run(inp: LookInput, store: ArtifactStore) -> LookResult:
    """The decisions after look ``inp.look`` (in the worker's process pool): each world's
    success column up to the wave's end, from its completed batches, through the design's
    pure rules (``sequential.look_paths``). A world with a failed or skipped batch has
    stopped on its own and is left out."""
    design = design_for(inp.spec)
    if design is None:
        raise ApplicationError(
            f"spec {inp.spec.id!r} has no analysis.sequential: it has no looks",
            type=ExperimentErrorType.bad_spec,
            non_retryable=True,
        )
    end = design.wave_ends[inp.look]
    progress = read_progress(store, inp.progress_digest)
    columns: dict[str, list[bool]] = {}
    for world in inp.spec.worlds:
        batches = sorted(
            (b for b in progress.batches if b.world == world.name and b.chunk.stop <= end),
            key=lambda b: b.chunk.index,
        )
        if any(b.status is not BatchStatus.completed for b in batches):
            continue
        parts = [
            StoredColumns.model_validate(store.get_json(b.columns_digest or "")) for b in batches
        ]
        column = [bool(x) for part in parts for x in part.outcomes]
        if batches and [b.chunk.first for b in batches] == [
            0,
            *(b.chunk.stop for b in batches[:-1]),
        ]:
            columns[world.name] = column
    return LookResult.of_paths(inp.look + 1, look_paths(inp.spec, design, columns, inp.look))


def assemble_outcomes(
    inp: AnalyseInput, store: ArtifactStore, progress: Progress
) -> ExperimentOutcomes:
    """The durable run as the same ``ExperimentOutcomes`` the local twin produces."""
    prefixes = sorted(progress.prefixes, key=lambda p: p.chunk.index)
    columns: dict[str, list[Any]] = {
        key: [] for key in ("episodes", "requested", "resolved", "checkpoints", "features")
    }
    for prefix in prefixes:
        data = store.get_bytes(prefix.checkpoints_digest)
        for cp in parse_checkpoints(data, prefix.chunk.first, prefix.chunk.size):
            columns["episodes"].append(cp["episode"])
            columns["requested"].append(cp["requested"])
            columns["resolved"].append(cp["resolved"])
            columns["checkpoints"].append(checkpoint_id(cp))  # with its files, if any
            columns["features"].append(cp["features"])
    worlds = [
        _world_outcomes(
            world.name,
            [b for b in progress.batches if b.world == world.name],
            progress.chunks,
            store,
            inp,
        )
        for world in inp.spec.worlds
    ]
    # Validated here, at the boundary: the lists come from sandboxes and the store.
    return ExperimentOutcomes(**columns, worlds=worlds)


def _world_checks(world: WorldOutcomes, inp: AnalyseInput, episodes: int) -> list[Check]:
    """The provenance a world's ledger row carries: what ran, from where, how much."""
    return [
        Check(
            name="completed",
            passed=(world.status is WorldStatus.completed and len(world.outcomes) == episodes)
            or world.status is WorldStatus.stopped,
            reason=world.error
            or f"{len(world.outcomes)} of {episodes} episodes"
            + (
                " (stopped by its sequential design)" if world.status is WorldStatus.stopped else ""
            ),
        ),
        Check(
            name="workload_identity",
            passed=world.code_digest == inp.code_digest,
            reason=f"code {world.code_digest[:12]}",
        ),
        Check(
            name="common_snapshot",
            passed=world.snapshot == inp.snapshot_id,
            reason=f"snapshot {world.snapshot}",
        ),
    ]


def analyse_run(
    inp: AnalyseInput, store: ArtifactStore, calls: WorkloadCalls, files: list[BundleFile]
) -> AnalysisResult:
    """The analysis, in the worker's process pool; the guard's held-out episodes (the one
    part that runs workload code) run in a box, from ``files``, which must be the code
    the plan named, started before the outcomes are read (``HeldOutAhead``)."""
    progress = read_progress(store, inp.progress_digest)
    with HeldOutAhead(calls, files, inp.code_digest, inp.spec, progress) as held_out:
        outcomes = assemble_outcomes(inp, store, progress)
        report = build_report(
            inp.spec,
            outcomes,
            inp.code_digest,
            inp.infra,
            held_out=held_out.runner,
            workload_bundle=inp.workload_bundle,
        )
    workspace_files = None
    evidence = workspace_evidence(inp, store, progress)
    if evidence is not None:
        section, manifests = evidence
        report = report.model_copy(update={"workspaces": section})
        workspace_files = store.put_json(manifests)
    report_digest = store.put_json(report.model_dump(mode="json"))
    markdown_digest = store.put_bytes(render_markdown(report, inp.provenance).encode())
    html_digest = store.put_bytes(render_html(report, inp.provenance).encode())
    roles = {w.name: w.role for w in inp.spec.worlds}
    worlds = [
        WorldSummary(
            name=w.name,
            role=roles[w.name],
            status=w.status,
            error=w.error,
            episodes=len(w.outcomes),
            failures=len(w.outcomes) - w.successes,
            world_seconds=round(w.world_seconds, 6),
            outcomes_digest=outcomes_digest(outcomes, [w.name]),
            checks=_world_checks(w, inp, inp.spec.episodes),
        )
        for w in outcomes.worlds
    ]
    return AnalysisResult(
        report_digest=report_digest,
        markdown_digest=markdown_digest,
        html_digest=html_digest,
        outcomes_digest=report.outcomes_digest,
        valid=report.valid,
        worlds=worlds,
        workspace_files_digest=workspace_files,
        verdicts=[f"{v.world}: {v.verdict.value} ({v.reason})" for v in report.verdicts],
    )


def workspace_evidence(
    inp: AnalyseInput, store: ArtifactStore, progress: Progress
) -> tuple[WorkspaceSection, dict[str, str]] | None:
    """The workspace section and files of a run whose workload keeps files (None for
    others): each chunk's manifest at the branch, and each world's at the end of every
    chunk; a world that did not complete every chunk is left out (its row says why)."""
    if not any(p.workspace_digest for p in progress.prefixes):
        return None

    def load(digest: str) -> WorkspaceEvidence:
        return WorkspaceEvidence.model_validate_json(store.get_bytes(digest))

    branch = [load(p.workspace_digest) for p in progress.prefixes if p.workspace_digest]
    worlds: dict[str, tuple[list[str], list[WorkspaceManifest]]] = {}
    for world in inp.spec.worlds:
        done = {
            b.chunk.index: b.workspace_digest
            for b in progress.batches
            if b.world == world.name and b.status is BatchStatus.completed and b.workspace_digest
        }
        if len(done) != progress.chunks:
            continue
        ends = [load(digest) for _, digest in sorted(done.items())]
        worlds[world.name] = ([e.layer for e in ends], [e.manifest for e in ends])
    return workspace_section([b.manifest for b in branch], worlds)


def ledger_rows(inp: LedgerInput, now: datetime) -> tuple[ExperimentRecord, list[WorldRecord]]:
    spec: ExperimentSpec = inp.spec
    root = ExperimentRecord(
        experiment_id=inp.experiment_id,
        run_id=inp.run_id,
        status=inp.status,
        hypothesis=spec.hypothesis.text,
        plan_fingerprint=inp.plan_fingerprint,
        spec_json=canonical_json(spec.canonical()),
        budget_json=canonical_json(inp.budget),
        approval_json=canonical_json(inp.approval),
        report_digest=inp.report_digest,
        error=inp.error,
        workload_bundle=inp.workload_bundle,
        created_at=now,
        updated_at=now,
    )
    worlds = [
        WorldRecord(
            experiment_id=inp.experiment_id,
            run_id=inp.run_id,
            world=w.name,
            role=Role(w.role).value,
            status=w.status.value,
            error=w.error,
            snapshot_id=inp.snapshot_id,
            code_digest=inp.code_digest,
            world_seconds=w.world_seconds,
            episodes=w.episodes,
            failures=w.failures,
            outcomes_digest=w.outcomes_digest,
            checks_json=canonical_json([c.model_dump(mode="json") for c in w.checks]),
            created_at=now,
        )
        for w in inp.worlds
    ]
    return root, worlds


class RecordActivities:
    """Writes to the artifact store and the ledger; every write is idempotent."""

    def __init__(
        self,
        store: ArtifactStore,
        ledger: Ledger,
        cpu: Executor,
        calls: WorkloadCalls,
        bundles: WorkloadBundles,
    ) -> None:
        """``cpu`` runs the analysis in another process, away from the workflow tasks;
        ``calls`` runs the guard validation's workload code in a box, from the files
        ``bundles`` unpacks."""
        self._store = store
        self._ledger = ledger
        self._cpu = cpu
        self._calls = calls
        self._bundles = bundles

    @activity.defn(name=SAVE_PROGRESS.name)
    async def save_progress(self, inp: SaveProgressInput) -> str:
        """Append the records made since the last save to the stored progress (see
        ``forklab.activities.experiment.progress``); returns the new progress digest."""
        return await asyncio.to_thread(save_progress, self._store, inp)

    @activity.defn(name=LOAD_PREFIX_REFS.name)
    async def load_prefix_refs(self, inp: PrefixRefsInput) -> list[PrefixRef]:
        """The checkpoints of a window of chunks whose prefixes an earlier run made."""
        return await asyncio.to_thread(prefix_refs, self._store, inp)

    @activity.defn(name=ANALYSE.name)
    async def analyse(self, inp: AnalyseInput) -> AnalysisResult:
        """Heartbeats while the pool works, so a dead worker is noticed in seconds."""
        try:
            files = await asyncio.to_thread(
                self._bundles.runner_files, inp.spec.workload.name, inp.workload_bundle
            )
        except WorkloadBundleError as exc:
            raise ApplicationError(
                str(exc), type=ExperimentErrorType.workload_bundle, non_retryable=True
            ) from None
        loop = asyncio.get_running_loop()
        job = loop.run_in_executor(self._cpu, analyse_run, inp, self._store, self._calls, files)
        try:
            return await heartbeat_until(job)
        except (WorkloadCallError, WorkloadSpecError) as exc:
            raise ApplicationError(
                f"the guard's held-out validation failed in its sandbox: {exc}",
                type=ExperimentErrorType.analysis_failed,
                non_retryable=True,
            ) from None

    @activity.defn(name=DECIDE_LOOK.name)
    async def decide_look(self, inp: LookInput) -> LookResult:
        """A sequential design's look, in the process pool (``look_run``); deterministic
        in the stored progress, so a retry decides the same."""
        loop = asyncio.get_running_loop()
        return await heartbeat_until(loop.run_in_executor(self._cpu, look_run, inp, self._store))

    @activity.defn(name=RECORD_LEDGER.name)
    async def record_ledger(self, inp: LedgerInput) -> None:
        root, worlds = ledger_rows(inp, datetime.now(UTC))

        def write() -> None:
            self._ledger.record_experiment(root)
            for row in worlds:
                self._ledger.record_world(row)

        await asyncio.to_thread(write)
