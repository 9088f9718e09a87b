"""Planning activities: everything before approval, none of which spends sandbox compute."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from temporalio import activity
from temporalio.exceptions import ApplicationError

from forklab.activities.experiment.runner_bundle import code_digest
from forklab.activities.experiment.workload_bundles import WorkloadBundleError, WorkloadBundles
from forklab.activities.heartbeat import heartbeat_until
from forklab.activities.sandbox.base import SandboxError, WorkspaceBackend
from forklab.activities.sandbox.confine import kill_group
from forklab.activities.sandbox.jail import UnconfinedRefused, require_confinement
from forklab.activities.sandbox.preflight import Preflight, SandboxUnavailableError
from forklab.activities.sandbox.shared_snapshots import SharedSnapshots
from forklab.activities.sandbox.workload_calls import (
    Handover,
    WorkloadCallError,
    WorkloadCalls,
    WorkloadContractError,
    WorkloadSpecError,
)
from forklab.activities.stores.artifacts import ArtifactError, ArtifactStore
from forklab.contracts.errors import ExperimentErrorType
from forklab.contracts.experiment import (
    CapacityInput,
    CapacityVerdict,
    EpisodeChunk,
    PlanSnapshot,
    PrefixIndex,
    PrefixRef,
    PrefixResult,
    Rehearsal,
    RehearsedPrefixes,
    RehearsedPrefixInput,
    RehearseInput,
    SampleWorld,
    SnapshotInput,
)
from forklab.contracts.experiment_activities import (
    CHECK_CAPACITY,
    REHEARSE,
    REHEARSED_PREFIX,
    RESOLVE_SNAPSHOT,
)
from forklab.experiments.experiment.budget import reservation
from forklab.experiments.experiment.bundle import BundleFile
from forklab.experiments.experiment.spec import ExperimentSpec
from forklab.experiments.experiment.waves import chunk_spans, wave_ends
from forklab.experiments.experiment.worlds import spec_world_plans
from forklab.runtime.canon import digest
from forklab.runtime.file_format import FormatError, parse_checkpoints
from forklab.runtime.workload import WorkloadError


def plan_fingerprint(
    spec: ExperimentSpec, code_digest: str, snapshot_id: str, prefixes: str | None = None
) -> str:
    """sha256 over the canonical spec, the workload code digest, the snapshot id, the
    budget and, when the rehearsal handed its prefixes over, their index (every
    episode's starting state): the exact plan an approval is bound to."""
    plan: dict[str, object] = {
        "spec": spec.canonical(),
        "code_digest": code_digest,
        "snapshot_id": snapshot_id,
        "budget": spec.budget.model_dump(mode="json"),
    }
    if prefixes is not None:
        plan["prefixes"] = prefixes
    return digest(plan)


def spec_wave_ends(spec: ExperimentSpec) -> list[int]:
    """The wave ends of the spec's sequential design; none for the fixed design."""
    seq = spec.analysis.sequential
    return [] if seq is None else wave_ends(spec.episodes, seq.looks)


def episode_chunks(spec: ExperimentSpec, batch_episodes: int) -> list[EpisodeChunk]:
    """The plan's chunks: at most ``batch_episodes`` each, none straddling a wave's end."""
    return [
        EpisodeChunk(index=i, first=first, stop=stop)
        for i, (first, stop) in enumerate(
            chunk_spans(spec.episodes, batch_episodes, spec_wave_ends(spec))
        )
    ]


def capacity_verdict(
    spec: ExperimentSpec, rehearsal: Rehearsal, batch_episodes: int, host_sandboxes: int
) -> CapacityVerdict:
    chunks = episode_chunks(spec, batch_episodes)
    safety = spec.budget.safety_factor
    # Prefixes the rehearsal handed over cost nothing more.
    estimate = (
        0.0
        if rehearsal.prefixes is not None
        else sum(reservation(safety, rehearsal.prefix_seconds_per_episode, c.size) for c in chunks)
    )
    for rate in rehearsal.world_seconds_per_episode.values():
        estimate += sum(reservation(safety, rate, c.size) for c in chunks)
    problems = []
    if estimate > spec.budget.max_world_seconds:
        problems.append(
            f"the plan needs an estimated {estimate:.1f} world-seconds (rehearsal × safety "
            f"factor {safety:g}, plus sandbox start-up) but budget.max_world_seconds is "
            f"{spec.budget.max_world_seconds:g}; raise the budget or run fewer episodes"
        )
    if spec.budget.max_concurrent_sandboxes > host_sandboxes:
        problems.append(
            f"budget.max_concurrent_sandboxes is {spec.budget.max_concurrent_sandboxes} but "
            f"the workers allow at most {host_sandboxes} sandboxes at once; lower it"
        )
    batches = len(chunks) * len(spec.worlds)
    prefix_chunks = f"{len(chunks)} prefix chunk{'s' if len(chunks) != 1 else ''}" + (
        " run by the rehearsal" if rehearsal.prefixes is not None else ""
    )
    ends = spec_wave_ends(spec)
    # A sequential design may stop worlds early; the budget must still cover its maximum.
    waves = f", in {len(ends)} waves (at most)" if ends else ""
    reason = "; ".join(problems) or (
        f"fits: an estimated {estimate:.1f} of {spec.budget.max_world_seconds:g} world-seconds, "
        f"{prefix_chunks} and {batches} world batches{waves}, at most "
        f"{spec.budget.max_concurrent_sandboxes} sandboxes at once"
    )
    return CapacityVerdict(
        ok=not problems,
        reason=reason,
        estimated_world_seconds=round(estimate, 3),
        episodes=spec.episodes,
        batch_episodes=batch_episodes,
        batches=batches,
        wave_ends=ends,
    )


class PlanningActivities:
    """Rehearsal, snapshot and capacity: free, and safe to retry."""

    def __init__(
        self,
        snapshots: SharedSnapshots,
        max_sandboxes: int,
        calls: WorkloadCalls,
        bundles: WorkloadBundles,
        store: ArtifactStore,
        *,
        allow_unconfined: bool = False,
    ) -> None:
        """``calls`` runs the rehearsal's workload code in a box, never in the worker;
        ``allow_unconfined`` is the worker's policy for a host without bubblewrap (default:
        the rehearsal, and so the experiment, fails before approval);
        ``snapshots`` prepares the snapshot and publishes it for workers on other hosts;
        ``bundles`` unpacks the workload bundle the experiment was started with;
        ``store`` keeps the prefixes a rehearsal hands over."""
        self._snapshots = snapshots
        self._max_sandboxes = max_sandboxes
        self._calls = calls
        self._bundles = bundles
        self._store = store
        self._allow_unconfined = allow_unconfined
        self._indexes: dict[str, PrefixIndex] = {}

    async def _runner_files(self, spec: ExperimentSpec, bundle: str | None) -> list[BundleFile]:
        """The runtime and the workload's files, the bundle verified just now; a bundle
        that cannot be used fails the run before approval, never retried."""
        try:
            return await asyncio.to_thread(self._bundles.runner_files, spec.workload.name, bundle)
        except WorkloadBundleError as exc:
            raise ApplicationError(
                str(exc), type=ExperimentErrorType.workload_bundle, non_retryable=True
            ) from None

    @activity.defn(name=REHEARSE.name)
    async def rehearse(self, inp: RehearseInput) -> Rehearsal:
        """Time the sandbox code path (prefix, then each world from the checkpoints) on the
        first ``sample_episodes`` episodes, in a box; a cancellation kills the box."""
        spec = inp.spec
        try:
            require_confinement(self._allow_unconfined)
        except UnconfinedRefused as exc:
            raise ApplicationError(
                str(exc), type=ExperimentErrorType.unconfined_refused, non_retryable=True
            ) from None
        n = spec.episodes if inp.sample_episodes == 0 else min(inp.sample_episodes, spec.episodes)
        files = await self._runner_files(spec, inp.workload_bundle)
        boxes: list[int] = []
        refs: list[PrefixRef] = []
        handover = None
        if inp.batch_episodes is not None:
            chunks = episode_chunks(spec, inp.batch_episodes)
            handover = Handover([(c.first, c.stop) for c in chunks], self._taker(inp, refs))
        job = asyncio.to_thread(
            self._calls.rehearse, spec, spec_world_plans(spec), n, files, boxes.append, handover
        )
        try:
            answer, code, ran = await heartbeat_until(job)
        except asyncio.CancelledError:
            for pgid in boxes:
                kill_group(pgid)
            raise
        except WorkloadContractError as exc:
            # The sentence itself; deterministic, so never retried.
            raise ApplicationError(
                str(exc), type=ExperimentErrorType.workload_contract, non_retryable=True
            ) from None
        except (WorkloadSpecError, WorkloadError) as exc:
            raise ApplicationError(
                f"the rehearsal cannot run spec {spec.id!r}: spec: {exc}; fix the spec",
                type=ExperimentErrorType.bad_spec,
                non_retryable=True,
            ) from None
        except WorkloadCallError as exc:
            raise ApplicationError(
                f"the rehearsal of spec {spec.id!r} failed in its sandbox: {exc}",
                type=ExperimentErrorType.rehearsal_failed,
                non_retryable=True,
            ) from None
        prefixes = None
        if refs:
            assert inp.batch_episodes is not None
            index = await asyncio.to_thread(
                self._store.put_bytes, PrefixIndex(refs=refs).model_dump_json().encode()
            )
            prefixes = RehearsedPrefixes(
                index=index, chunks=len(refs), batch_episodes=inp.batch_episodes
            )
        return Rehearsal(
            code_digest=code,
            episodes=answer["episodes"],
            prefix_seconds_per_episode=answer["prefix_seconds_per_episode"],
            world_seconds_per_episode={
                w["name"]: w["seconds_per_episode"] for w in answer["worlds"]
            },
            worlds=[
                SampleWorld(name=w["name"], failure_rate=round(w["failure_rate"], 6))
                for w in answer["worlds"]
            ],
            confinement=ran.confinement,
            note=ran.note,
            workspace=answer["workspace"],
            prefixes=prefixes,
        )

    def _taker(self, inp: RehearseInput, refs: list[PrefixRef]) -> Callable[[int, bytes], None]:
        """Where the rehearsal box's prefixes go, chunk by chunk (in a worker thread): the
        checkpoints, checked as the prefix stage checks its runner's, among the kept
        artifacts. Each chunk's ref is added to ``refs``."""
        assert inp.batch_episodes is not None
        chunks = episode_chunks(inp.spec, inp.batch_episodes)

        def take(index: int, checkpoints: bytes) -> None:
            chunk = chunks[index]
            try:
                parse_checkpoints(checkpoints, chunk.first, chunk.size)
            except FormatError as exc:
                raise WorkloadCallError(
                    f"the rehearsal wrote invalid checkpoints for episodes "
                    f"{chunk.first}..{chunk.stop - 1}: {exc}"
                ) from None
            refs.append(
                PrefixRef(
                    index=index,
                    checkpoints_digest=self._store.put_bytes(checkpoints),
                )
            )

        return take

    @activity.defn(name=REHEARSED_PREFIX.name)
    async def rehearsed_prefix(self, inp: RehearsedPrefixInput) -> PrefixResult:
        """Chunk ``inp.chunk``'s prefixes as the rehearsal ran them (no sandbox): what the
        prefix stage records for it."""

        def refused(why: str) -> ApplicationError:
            return ApplicationError(
                f"the rehearsal's prefixes {inp.index[:16]} {why}",
                type=ExperimentErrorType.prefix_failed,
                non_retryable=True,
            )

        try:
            index = await asyncio.to_thread(self._index, inp.index)
        except (ArtifactError, ValueError) as exc:
            raise refused(f"cannot be read: {exc}") from None
        if not 0 <= inp.chunk.index < len(index.refs):
            raise refused(f"have no chunk {inp.chunk.index}")
        ref = index.refs[inp.chunk.index]
        if ref.index != inp.chunk.index:
            raise refused(f"are out of order at chunk {inp.chunk.index}")
        return PrefixResult(
            chunk=inp.chunk,
            checkpoints_digest=ref.checkpoints_digest,
            seconds=0.0,
            rehearsed=True,
        )

    def _index(self, digest: str) -> PrefixIndex:
        """The index ``digest``, read once per worker (a run asks for it once a chunk)."""
        cached = self._indexes.get(digest)
        if cached is None:
            cached = PrefixIndex.model_validate_json(self._store.get_bytes(digest))
            self._indexes = {digest: cached}  # the run under way; one at a time is enough
        return cached

    @activity.defn(name=RESOLVE_SNAPSHOT.name)
    async def resolve_snapshot(self, inp: SnapshotInput) -> PlanSnapshot:
        files = await self._runner_files(inp.spec, inp.workload_bundle)
        try:
            info = await asyncio.to_thread(self._snapshots.prepare, files)
        except SandboxUnavailableError:
            raise  # may pass: the retry policy decides
        except SandboxError as exc:
            raise ApplicationError(
                f"cannot resolve the snapshot: {exc}",
                type=ExperimentErrorType.snapshot_unavailable,
                non_retryable=True,
            ) from None
        expected = code_digest(files)
        if info.code_digest != expected:
            raise ApplicationError(
                f"snapshot {info.id} holds code {info.code_digest[:12]} but the workload "
                f"bundle is {expected[:12]}; the source changed while preparing, start again",
                type=ExperimentErrorType.snapshot_mismatch,
                non_retryable=True,
            )
        return PlanSnapshot(
            snapshot_id=info.id,
            backend=info.backend,
            code_digest=info.code_digest,
            files=info.files,
            fingerprint=plan_fingerprint(inp.spec, info.code_digest, info.id, inp.prefixes),
            workload_bundle=inp.workload_bundle,
            provenance=(
                self._snapshots.backend.provenance(info.id)
                if isinstance(self._snapshots.backend, Preflight)
                else f"common_snapshot: every sandbox copied from snapshot {info.id}"
            ),
        )

    @activity.defn(name=CHECK_CAPACITY.name)
    async def check_capacity(self, inp: CapacityInput) -> CapacityVerdict:
        verdict = capacity_verdict(inp.spec, inp.rehearsal, inp.batch_episodes, self._max_sandboxes)
        backend = self._snapshots.backend
        problems: list[str] = []
        if inp.rehearsal.workspace and not isinstance(backend, WorkspaceBackend):
            # Refused here, before approval, not by the first prefix after compute is spent.
            problems.append(
                f"the workload keeps files, and the {backend.name} sandbox backend has no "
                "workspaces; run it on the local backend"
            )
        if isinstance(backend, Preflight) and inp.snapshot_id:
            peak = min(inp.spec.budget.max_concurrent_sandboxes, self._max_sandboxes)
            try:
                problems += await asyncio.to_thread(backend.preflight, inp.snapshot_id, peak)
            except SandboxUnavailableError:
                raise  # may pass: the retry policy decides
            except SandboxError as exc:
                problems.append(str(exc))
        if not problems:
            return verdict
        earlier = [] if verdict.ok else [verdict.reason]
        return verdict.model_copy(update={"ok": False, "reason": "; ".join(earlier + problems)})
