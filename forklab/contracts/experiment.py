"""The typed inputs and outputs of ForkLab's activities.

Everything here is small: checkpoints and per-episode columns live in the artifact store
and appear only as sha256 digests, so workflow history stays a few hundred bytes per batch.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from enum import StrEnum
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from forklab.experiments.experiment.results import Check, InfraUsage, WorldStatus
from forklab.experiments.experiment.spec import ExperimentSpec, Role
from forklab.experiments.experiment.waves import Decision, chunk_count, chunk_span, wave_chunks
from forklab.runtime.file_format import WorldPlan

if TYPE_CHECKING:  # numpy behind it: the CLI's light imports do not load it for a type
    from forklab.experiments.experiment.sequential import WorldPath

#: How often a long activity heartbeats (well inside the workflow's heartbeat timeouts,
#: ``forklab.workflows.experiment.timeouts``).
HEARTBEAT_SECONDS = 2.0
#: The key of a failed sandbox attempt's details saying its ``charged`` seconds are final:
#: the attempt failed on its own with no sandbox running (e.g. waiting out a store outage),
#: so no heartbeat lag is added to what it reports.
SETTLED_BEAT = "settled"


class Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


# --- planning ---------------------------------------------------------------------------
class RehearseInput(Model):
    spec: ExperimentSpec
    sample_episodes: int = Field(ge=0, description="Episodes rehearsed; 0 means all of them.")
    workload_bundle: str | None = Field(
        default=None,
        pattern=r"^[0-9a-f]{64}$",
        description="Digest of the workload bundle; None for a workload built into ForkLab.",
    )
    batch_episodes: int | None = Field(
        default=None,
        ge=1,
        description=(
            "The run's chunk size: the rehearsal may hand its prefixes over, chunk by chunk; "
            "None: it only checks them."
        ),
    )


class RehearsedPrefixes(Model):
    """The prefixes the rehearsal ran for good, before approval: an index artifact
    (``PrefixIndex``) naming each chunk's checkpoints."""

    index: str = Field(pattern=r"^[0-9a-f]{64}$")
    chunks: int = Field(ge=1)
    batch_episodes: int = Field(ge=1)


class SampleWorld(Model):
    name: str
    failure_rate: float


class Rehearsal(Model):
    """The twin's timing of the sandbox code path on a sample, and what it saw."""

    code_digest: str
    episodes: int
    prefix_seconds_per_episode: float
    world_seconds_per_episode: dict[str, float]
    worlds: list[SampleWorld]
    confinement: str | None = None  # "bubblewrap", or "process" on a host without it
    note: str | None = None  # what that fallback did not protect
    #: The workload keeps files (``Workload.has_workspace``): its sandboxes get workspaces.
    workspace: bool = False
    #: Set when the rehearsal ran every prefix for good: the prefix stage takes them over.
    prefixes: RehearsedPrefixes | None = None


class SnapshotInput(Model):
    spec: ExperimentSpec
    #: The rehearsal's handed-over prefixes (index digest): the plan an approval binds
    #: names the exact starting state of every episode.
    prefixes: str | None = Field(default=None, pattern=r"^[0-9a-f]{64}$")
    workload_bundle: str | None = Field(
        default=None,
        pattern=r"^[0-9a-f]{64}$",
        description="Digest of the workload bundle; None for a workload built into ForkLab.",
    )


class PlanSnapshot(Model):
    """The snapshot every world starts from, and the plan fingerprint it completes."""

    snapshot_id: str
    backend: str
    code_digest: str
    files: int
    fingerprint: str
    workload_bundle: str | None = Field(
        default=None,
        pattern=r"^[0-9a-f]{64}$",
        description="Digest of the workload bundle; None for a workload built into ForkLab.",
    )
    provenance: str = Field(
        default="", description="What every world starts from, as the report states it."
    )


class EpisodeChunk(Model):
    """Episodes ``first`` .. ``stop - 1``: the unit of a prefix run and of a world batch."""

    index: int
    first: int
    stop: int

    @property
    def size(self) -> int:
        return self.stop - self.first


class CapacityInput(Model):
    spec: ExperimentSpec
    rehearsal: Rehearsal
    batch_episodes: int = Field(ge=1)
    snapshot_id: str = Field(default="", description="Checked by a remote backend's preflight.")


class CapacityVerdict(Model):
    """The capacity check's answer. The plan's chunks are described, not listed: the
    verdict travels in every run's input and in the status query, so it must not grow
    with the experiment (``chunk`` and ``chunks`` derive them)."""

    ok: bool
    reason: str
    estimated_world_seconds: float
    episodes: int = Field(ge=1)
    batch_episodes: int = Field(ge=1)
    batches: int
    #: A sequential design's wave ends (``waves.wave_ends``): no chunk straddles one, so
    #: a look waits on its own wave's chunks only. Empty for the fixed design.
    wave_ends: list[int] = Field(default_factory=list, max_length=50)

    @property
    def prefix_chunks(self) -> int:
        return chunk_count(self.episodes, self.batch_episodes, self.wave_ends)

    def chunk(self, index: int) -> EpisodeChunk:
        first, stop = chunk_span(self.episodes, self.batch_episodes, self.wave_ends, index)
        return EpisodeChunk(index=index, first=first, stop=stop)

    def wave(self, look: int) -> tuple[int, int]:
        """The chunk indices ``[first, stop)`` of wave ``look`` (0-based)."""
        return wave_chunks(self.episodes, self.batch_episodes, self.wave_ends, look)

    def chunks(self, start: int = 0) -> Iterator[EpisodeChunk]:
        """The chunks from ``start`` on, made one at a time."""
        return (self.chunk(i) for i in range(start, self.prefix_chunks))


class KeyInput(Model):
    workflow_id: str
    run_id: str


class KeyIssued(Model):
    public_key: str = Field(description="Ed25519 public key, hex.")
    location: str = Field(description="Host and folder of the owner-only private key file.")


class PolicyInput(Model):
    experiment_id: str


class RegisteredApprover(Model):
    """One person the worker's policy lets approve: a name and an Ed25519 public key (hex)."""

    name: str = Field(min_length=1, max_length=100, pattern=r"^[A-Za-z0-9_.@-]+$")
    public_key: str = Field(pattern=r"^[0-9a-f]{64}$")


class ApproverPolicy(Model):
    """Who may approve on this worker: ``approvers`` empty means whoever holds the run's
    key (the single-user default); otherwise only those keys, and the requester only when
    ``requester_may_approve``."""

    approvers: list[RegisteredApprover] = Field(default=[], max_length=1000)
    requester_may_approve: bool = True


class ApprovalPolicy(Model):
    skip_allowed: bool = Field(description="Whether this worker lets a spec skip approval.")
    reason: str


# --- sandboxes --------------------------------------------------------------------------
class RunnerJob(Model):
    """What the runner needs besides checkpoints: the workload and how to seed it."""

    workload: str
    params: dict[str, Any]
    seed: int
    #: The workload keeps files: the prefix sandbox gets an empty workspace, frozen into a
    #: layer at the boundary, and each world's sandbox attaches that layer.
    workspace: bool = False


class PrefixInput(Model):
    experiment_id: str
    #: The run that owns the sandboxes: ``<workflow id>/<first run id>`` (their label).
    run_key: str = Field(min_length=1)
    job: RunnerJob
    snapshot_id: str
    chunk: EpisodeChunk
    reservation_seconds: float = Field(gt=0)


class PrefixResult(Model):
    chunk: EpisodeChunk
    checkpoints_digest: str
    #: A workload with files: the ``WorkspaceEvidence`` of the chunk's frozen workspace.
    workspace_digest: str | None = None
    seconds: float
    network_isolated: bool = True
    note: str | None = None
    confinement: str | None = None  # "bubblewrap", or "process" on a host without it
    sandbox_id: str | None = Field(default=None, description="The backend's id of its sandbox.")
    #: Run by the rehearsal before approval and taken over: no sandbox, no compute spent.
    rehearsed: bool = False

    def ref(self) -> PrefixRef:
        """What a world batch needs of this prefix run."""
        return PrefixRef(
            index=self.chunk.index,
            checkpoints_digest=self.checkpoints_digest,
            workspace_digest=self.workspace_digest,
        )


class BatchInput(Model):
    """A group of worlds over one chunk, in one sandbox: each world in a process of its own
    (``forklab.runtime.world_group``), with its own share of the reservation."""

    experiment_id: str
    #: The run that owns the sandboxes: ``<workflow id>/<first run id>`` (their label).
    run_key: str = Field(min_length=1)
    job: RunnerJob
    worlds: list[WorldPlan] = Field(min_length=1)
    #: Each world's share of the reservation, in world order (its wall and CPU limit).
    world_seconds: list[float] = Field(min_length=1)
    snapshot_id: str
    chunk: EpisodeChunk
    checkpoints_digest: str
    #: A workload with files: the prefix's ``WorkspaceEvidence`` (to rebuild the chunk's
    #: layer on a host that does not have it).
    workspace_digest: str | None = None
    attempt: int = Field(default=1, ge=1)  # which attempt of this unit (the workflow counts)

    @model_validator(mode="after")
    def _one_share_per_world(self) -> BatchInput:
        if len(self.world_seconds) != len(self.worlds) or min(self.world_seconds) <= 0:
            raise ValueError("give every world a positive share of the reservation")
        return self

    @property
    def reservation_seconds(self) -> float:
        """The whole sandbox's wall-clock limit: every world's share."""
        return sum(self.world_seconds)


class BatchStatus(StrEnum):
    completed = "completed"
    failed = "failed"
    skipped = "skipped"


class BatchOutcome(Model):
    """One world over one chunk: the columns' digest, or why there are none."""

    world: str
    chunk: EpisodeChunk
    status: BatchStatus
    error: str | None = None
    columns_digest: str | None = None
    #: A workload with files: the ``WorkspaceEvidence`` of the world's workspace at its end.
    workspace_digest: str | None = None
    seconds: float = 0.0
    failures: int = 0
    attempts: int = 0
    network_isolated: bool = True
    note: str | None = Field(default=None, description="e.g. why network isolation fell back")
    confinement: str | None = None  # "bubblewrap", or "process" on a host without it
    #: The backend's id of the sandbox this attempt ran in (``lsb-…`` locally, Daytona's
    #: own id there); None when no attempt reached a sandbox (skipped, or died before).
    sandbox_id: str | None = None


class GroupOutcome(Model):
    """A group's sandbox attempt: each world's outcome, in the group's order, and the
    seconds the sandbox ran in all (what the unit is charged; each world's share of them
    is in its outcome)."""

    outcomes: list[BatchOutcome]
    seconds: float = 0.0


class CleanupInput(Model):
    experiment_id: str
    #: The run that owns the sandboxes: ``<workflow id>/<first run id>`` (their label).
    run_key: str = Field(min_length=1)


class CleanupResult(Model):
    found: int
    removed: int
    rounds: int
    left: int
    layers_removed: int = 0  # workspace layers nothing needed any more

    def summary(self) -> str:
        return f"{self.found} found, {self.removed} removed, {self.left} left"


# --- records ----------------------------------------------------------------------------
class Progress(Model):
    """Everything the analysis needs from the run: every prefix result and batch outcome.
    Assembled activity-side from the stored segments (``forklab.activities.experiment.progress``);
    never a Temporal payload, since it grows with the experiment."""

    chunks: int
    prefixes: list[PrefixResult]
    batches: list[BatchOutcome]


class ProgressSegment(Model):
    """The records one save added (those since the previous save), stored as an artifact."""

    prefixes: list[PrefixResult]
    batches: list[BatchOutcome]


class SegmentRef(Model):
    digest: str = Field(pattern=r"^[0-9a-f]{64}$")
    #: The chunk indices of the segment's prefixes, ``[first, stop)``; None if it has none.
    prefix_span: tuple[int, int] | None = None


class ProgressIndex(Model):
    """The stored progress: its segments, oldest first. Its digest names the whole
    progress (each segment is named by its own digest in it), and a save appends one
    segment reference, so the index grows by ~100 bytes per save, not per batch."""

    chunks: int
    segments: list[SegmentRef]


class SaveProgressInput(Model):
    """The progress stored so far (None: nothing yet) and only the records made since."""

    previous: str | None = Field(default=None, pattern=r"^[0-9a-f]{64}$")
    chunks: int
    prefixes: list[PrefixResult]
    batches: list[BatchOutcome]


class PrefixRef(Model):
    """What a world batch needs of its chunk's prefix run."""

    index: int
    checkpoints_digest: str
    workspace_digest: str | None = None


class PrefixIndex(Model):
    """The stored list of handed-over prefixes, one per chunk in chunk order."""

    refs: list[PrefixRef]


class RehearsedPrefixInput(Model):
    """Take chunk ``chunk``'s prefixes over from the rehearsal's index ``index``."""

    index: str = Field(pattern=r"^[0-9a-f]{64}$")
    chunk: EpisodeChunk


class PrefixRefsInput(Model):
    """Chunks ``first`` .. ``stop - 1`` of the stored progress ``progress``."""

    progress: str = Field(pattern=r"^[0-9a-f]{64}$")
    first: int = Field(ge=0)
    stop: int = Field(ge=0)


class AnalyseInput(Model):
    spec: ExperimentSpec
    code_digest: str
    workload_bundle: str | None = Field(
        default=None,
        pattern=r"^[0-9a-f]{64}$",
        description="Digest of the workload bundle; None for a workload built into ForkLab.",
    )
    snapshot_id: str
    progress_digest: str
    infra: InfraUsage
    provenance: dict[str, str] = Field(
        description=(
            "Plan fingerprint, approval and cleanup lines (Markdown inline text) for the "
            "report's Durable run section."
        )
    )


class LookInput(Model):
    """A sequential design's look ``look`` (0-based): the worlds' outcomes up to the end
    of its wave are in the stored progress ``progress_digest``."""

    spec: ExperimentSpec
    progress_digest: str
    look: int = Field(ge=0, le=49)


class WorldLook(Model):
    """One world at one look: its counts against the baseline, the statistic, the
    boundary and the decision (as ``sequential.Look`` has them)."""

    world: str
    look: int = Field(description="1-based, as the report numbers looks.")
    episodes: int
    rescue: int
    harm: int
    statistic: float
    boundary: float
    conditional_power: float | None = None
    decision: Decision


class LookResult(Model):
    """The decisions after one look: one entry per world still running into it."""

    look: int
    worlds: list[WorldLook]

    @classmethod
    def of_paths(cls, look: int, paths: Iterable[WorldPath]) -> LookResult:
        """Look ``look`` (1-based) of each world's path: the last look it ran into."""
        return cls(
            look=look,
            worlds=[
                WorldLook(
                    world=p.world,
                    look=last.look,
                    episodes=last.episodes,
                    rescue=last.rescue,
                    harm=last.harm,
                    statistic=last.statistic,
                    boundary=last.boundary,
                    conditional_power=last.conditional_power,
                    decision=last.decision,
                )
                for p in paths
                for last in [p.looks[-1]]
            ],
        )


class WorldSummary(Model):
    name: str
    role: Role
    status: WorldStatus
    error: str | None
    episodes: int
    failures: int
    world_seconds: float
    outcomes_digest: str
    checks: list[Check]


class AnalysisResult(Model):
    """Where the analysis put the report: its JSON, Markdown and self-contained HTML
    renderings are artifacts, named here by digest."""

    report_digest: str
    markdown_digest: str
    html_digest: str
    #: A workload with files: the manifest and diff files that go next to the report
    #: (a JSON object, file name → text).
    workspace_files_digest: str | None = None
    outcomes_digest: str
    valid: bool
    worlds: list[WorldSummary]
    readout: str | None = Field(
        default=None, description="Which readout the report shows: model or deterministic."
    )
    readout_why: str | None = None
    verdicts: list[str] = Field(
        default_factory=list,
        description="One line per judged world, its verdict and why (the report's table).",
    )


class LedgerInput(Model):
    experiment_id: str
    run_id: str
    status: str
    spec: ExperimentSpec
    plan_fingerprint: str
    budget: dict[str, Any]
    approval: dict[str, Any]
    report_digest: str | None
    error: str | None
    worlds: list[WorldSummary]
    snapshot_id: str
    code_digest: str
    workload_bundle: str | None = Field(
        default=None,
        pattern=r"^[0-9a-f]{64}$",
        description="Digest of the workload bundle; None for a workload built into ForkLab.",
    )


# --- the evidence log ------------------------------------------------------------------
class EvidenceInput(Model):
    ledger: LedgerInput
    progress_digest: str | None = Field(
        default=None,
        pattern=r"^[0-9a-f]{64}$",
        description="The run's stored progress (``forklab.activities.experiment.progress``), "
        "where the trace reads the checkpoints every world inherited and the sandboxes that "
        "ran; None when no sandbox work was recorded. A digest, not the lists: they grow with "
        "the chunks.",
    )


class EvidenceState(StrEnum):
    off = "off"
    sent = "sent"
    queued = "queued"


class EvidenceLogResult(Model):
    state: EvidenceState
    message: str
    pending: int = 0
