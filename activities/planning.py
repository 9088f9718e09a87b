"""Planning activities: everything before approval, none of which spends sandbox compute."""

from __future__ import annotations

import asyncio
import socket
import time
from concurrent.futures import Executor
from pathlib import Path

from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities.approval_token import new_token, token_sha256, write_token_file
from activities.budget import reservation
from activities.models import (
    CapacityInput,
    CapacityVerdict,
    EpisodeChunk,
    PlanSnapshot,
    Rehearsal,
    RehearseInput,
    SampleWorld,
    SnapshotInput,
    TokenInput,
    TokenIssued,
)
from activities.sandbox.base import SandboxBackend
from experiments.bundle import bundle_files, code_digest
from experiments.engine import spec_world_plans
from experiments.runtime.canon import digest
from experiments.runtime.runner import (
    BoundaryMissingError,
    StuckWorldError,
    continue_checkpoints,
    run_prefix,
)
from experiments.runtime.workload import WorkloadError
from experiments.spec import ExperimentSpec, SpecError, resolve_workload


def plan_fingerprint(spec: ExperimentSpec, code_digest: str, snapshot_id: str) -> str:
    """sha256 over the canonical spec, the workload code digest, the snapshot id and the
    budget: the exact plan an approval is bound to."""
    return digest(
        {
            "spec": spec.canonical(),
            "code_digest": code_digest,
            "snapshot_id": snapshot_id,
            "budget": spec.budget.model_dump(mode="json"),
        }
    )


def episode_chunks(episodes: int, batch_episodes: int) -> list[EpisodeChunk]:
    return [
        EpisodeChunk(index=i, first=first, stop=min(first + batch_episodes, episodes))
        for i, first in enumerate(range(0, episodes, batch_episodes))
    ]


def rehearse_sample(spec: ExperimentSpec, sample_episodes: int) -> Rehearsal:
    """Time the sandbox's own code path (prefix, then each world from the checkpoints)
    in-process on the first ``sample_episodes`` episodes."""
    workload = resolve_workload(spec)
    n = spec.episodes if sample_episodes == 0 else min(sample_episodes, spec.episodes)
    start = time.perf_counter()
    checkpoints = [run_prefix(workload, spec.seed, e) for e in range(n)]
    prefix_rate = (time.perf_counter() - start) / n
    rates: dict[str, float] = {}
    worlds: list[SampleWorld] = []
    for plan in spec_world_plans(spec):
        start = time.perf_counter()
        cols = continue_checkpoints(workload, spec.seed, checkpoints, plan)
        rates[plan.name] = (time.perf_counter() - start) / n
        rate = (n - sum(cols["outcomes"])) / n
        worlds.append(SampleWorld(name=plan.name, failure_rate=round(rate, 6)))
    return Rehearsal(
        code_digest=code_digest(bundle_files(spec.workload.name)),
        episodes=n,
        prefix_seconds_per_episode=prefix_rate,
        world_seconds_per_episode=rates,
        worlds=worlds,
    )


def rehearsal_or_error(spec: ExperimentSpec, sample_episodes: int) -> Rehearsal | str:
    """``rehearse_sample`` for a worker's process pool: a spec that cannot run comes back
    as its message (workload exceptions need not survive pickling)."""
    try:
        return rehearse_sample(spec, sample_episodes)
    except (SpecError, WorkloadError, BoundaryMissingError, StuckWorldError) as exc:
        return str(exc)


def capacity_verdict(
    spec: ExperimentSpec, rehearsal: Rehearsal, batch_episodes: int, host_sandboxes: int
) -> CapacityVerdict:
    chunks = episode_chunks(spec.episodes, batch_episodes)
    safety = spec.budget.safety_factor
    estimate = sum(
        reservation(safety, rehearsal.prefix_seconds_per_episode, c.size) for c in chunks
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
    reason = "; ".join(problems) or (
        f"fits: an estimated {estimate:.1f} of {spec.budget.max_world_seconds:g} world-seconds, "
        f"{len(chunks)} prefix chunks and {batches} world batches, at most "
        f"{spec.budget.max_concurrent_sandboxes} sandboxes at once"
    )
    return CapacityVerdict(
        ok=not problems,
        reason=reason,
        estimated_world_seconds=round(estimate, 3),
        chunks=chunks,
        batches=batches,
    )


class PlanningActivities:
    """Rehearsal, snapshot, capacity and token: free, and safe to retry."""

    def __init__(
        self, backend: SandboxBackend, home: Path, max_sandboxes: int, cpu: Executor
    ) -> None:
        """``cpu`` runs the rehearsal in another process, so that it cannot hold the GIL
        against the worker's workflow tasks."""
        self._backend = backend
        self._home = home
        self._max_sandboxes = max_sandboxes
        self._cpu = cpu

    @activity.defn(name="rehearse")
    async def rehearse(self, inp: RehearseInput) -> Rehearsal:
        loop = asyncio.get_running_loop()
        result = await loop.run_in_executor(
            self._cpu, rehearsal_or_error, inp.spec, inp.sample_episodes
        )
        if isinstance(result, str):
            raise ApplicationError(
                f"the rehearsal cannot run spec {inp.spec.id!r}: {result}; fix the spec",
                type="BadSpec",
                non_retryable=True,
            )
        return result

    @activity.defn(name="resolve_snapshot")
    async def resolve_snapshot(self, inp: SnapshotInput) -> PlanSnapshot:
        files = bundle_files(inp.spec.workload.name)
        info = await asyncio.to_thread(self._backend.prepare_snapshot, files)
        expected = code_digest(files)
        if info.code_digest != expected:
            raise ApplicationError(
                f"snapshot {info.id} holds code {info.code_digest[:12]} but the workload "
                f"bundle is {expected[:12]}; the source changed while preparing, start again",
                type="SnapshotMismatch",
                non_retryable=True,
            )
        return PlanSnapshot(
            snapshot_id=info.id,
            backend=info.backend,
            code_digest=info.code_digest,
            files=info.files,
            fingerprint=plan_fingerprint(inp.spec, info.code_digest, info.id),
        )

    @activity.defn(name="check_capacity")
    async def check_capacity(self, inp: CapacityInput) -> CapacityVerdict:
        return capacity_verdict(inp.spec, inp.rehearsal, inp.batch_episodes, self._max_sandboxes)

    @activity.defn(name="issue_approval_token")
    async def issue_approval_token(self, inp: TokenInput) -> TokenIssued:
        """For experiments started without a token (e.g. by ``temporal workflow start``):
        the token is written on this worker's host, owner-only; only its hash is returned."""
        token = new_token()
        path = write_token_file(self._home, inp.experiment_id, token)
        return TokenIssued(sha256=token_sha256(token), location=f"{socket.gethostname()}:{path}")
