"""The experiment workflow's typed messages: its input and result, signals and query."""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum

from pydantic import BaseModel, ConfigDict, Field

from forklab.contracts.experiment import (
    AnalysisResult,
    CapacityVerdict,
    CleanupResult,
    LookResult,
    PlanSnapshot,
    RegisteredApprover,
    Rehearsal,
    WorldSummary,
)
from forklab.experiments.experiment.spec import ExperimentSpec
from forklab.workflows.experiment.tally import MAX_SKIPPED_LINES, ProgressTally

#: Workflow type name, as the CLI, the docs and ``temporal workflow start`` spell it.
WORKFLOW_TYPE = "ForkLabExperiment"
#: Its query that answers a ``StatusView`` (``forklab status``, ``temporal workflow query``).
STATUS_QUERY = "status"
#: Default episodes per batch: one sandbox runs one world over this many episodes.
DEFAULT_BATCH_EPISODES = 1000
#: Default episodes the rehearsal times (0 would rehearse them all).
DEFAULT_REHEARSAL_EPISODES = 100
#: The bounds of ``ExperimentInput.batch_episodes`` and ``rehearsal_episodes``.
BATCH_EPISODES_RANGE = (1, 10_000_000)
REHEARSAL_EPISODES_RANGE = (0, 10_000_000)
#: Default most events one run of the chain records before it continues as new. Temporal
#: suggests continue-as-new only *at* 4,096 events (its default), and draining the batches
#: then in flight goes past it; the workflow stops starting units earlier, leaving room for
#: that drain, retried attempts and the final stages (see ``forklab.workflows.experiment.history``).
DEFAULT_HISTORY_EVENTS = 3_500
#: The bounds of ``ExperimentInput.history_events``: room for the closing stages, and well
#: under Temporal's own limits (50,000 events).
HISTORY_EVENTS_RANGE = (100, 40_000)


def workflow_id(experiment_id: str) -> str:
    """One workflow per experiment id, so the same spec cannot run twice at once."""
    return f"forklab-{experiment_id}"


class Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Stage(StrEnum):
    starting = "starting"
    rehearsing = "rehearsing"
    resolving_snapshot = "resolving_snapshot"
    checking_capacity = "checking_capacity"
    awaiting_approval = "awaiting_approval"
    running_prefixes = "running_prefixes"
    running_worlds = "running_worlds"
    cleaning_up = "cleaning_up"
    analysing = "analysing"
    recording = "recording"
    done = "done"


class Status(StrEnum):
    running = "running"
    completed = "completed"
    refused = "refused"  # the capacity check said the plan cannot fit
    rejected = "rejected"
    expired = "expired"
    failed = "failed"
    cancelled = "cancelled"


class ApprovalStatus(StrEnum):
    pending = "pending"
    approved = "approved"
    rejected = "rejected"
    expired = "expired"
    not_required = "not_required"


#: Longest approver name (or ``by``) an approve/reject records; longer ones are refused.
MAX_NAME = 100
#: Longest rejection reason recorded.
MAX_REASON = 500
#: Approval attempts kept in the state (the latest ones); ``attempts_total`` counts all.
MAX_ATTEMPTS = 50


class ApproveRequest(Model):
    """The ``approve`` Update's argument: a signature by the run's approver key over
    ``forklab.activities.experiment.approval_keys.approval_payload`` (``forklab approve`` or
    ``forklab sign`` makes it)."""

    approver: str = Field(min_length=1, max_length=MAX_NAME)
    fingerprint: str = Field(max_length=64)
    nonce: str = Field(max_length=64)
    signature: str = Field(max_length=128)


class RejectRequest(Model):
    """The ``reject`` Update's argument. Rejecting needs no key: it only stops compute,
    like ``temporal workflow cancel``."""

    by: str = Field(default="operator", min_length=1, max_length=MAX_NAME)
    reason: str = Field(default="", max_length=MAX_REASON)


class ApprovalAttempt(Model):
    """One message the gate received, as recorded (names and reasons truncated)."""

    at: datetime
    kind: str = Field(description="approve, reject, or the name of a refused message")
    approver: str
    accepted: bool
    reason: str


class ApprovalState(Model):
    status: ApprovalStatus
    policy: str = Field(default="", description="Why approval is required, or why skipped.")
    workflow_id: str = ""
    run_id: str = Field(default="", description="The first run's id: what an approver signs.")
    public_key: str = Field(default="", description="The approver key (Ed25519, hex).")
    key_location: str = Field(default="", description="Host and folder of the private key.")
    nonce: str = Field(default="", description="The nonce the next approval must sign.")
    expires_at: datetime | None = None
    decided_by: str | None = None
    decided_at: datetime | None = None
    attempts: list[ApprovalAttempt] = Field(
        default=[], description=f"The latest {MAX_ATTEMPTS} attempts."
    )
    attempts_total: int = 0
    approvers: list[RegisteredApprover] = Field(
        default=[],
        description="The worker's registered approvers; empty: whoever holds the run's key.",
    )
    requester_may_approve: bool = True
    requester: str = Field(
        default="", description="The registered name whose key signed the start, if any."
    )
    requester_key: str = Field(default="", description="That key (Ed25519, hex).")


class SignedRequest(Model):
    """A start signed by the requester's own key (``forklab keys``) over
    ``forklab.contracts.approval.request_payload``: who asks, provably."""

    public_key: str = Field(pattern=r"^[0-9a-f]{64}$")
    requested_at: datetime
    signature: str = Field(max_length=128)


class Plan(Model):
    """What the approver signs: the rehearsal, the snapshot and the capacity verdict."""

    rehearsal: Rehearsal
    snapshot: PlanSnapshot
    capacity: CapacityVerdict

    @property
    def fingerprint(self) -> str:
        return self.snapshot.fingerprint

    @property
    def prefixes(self) -> str:
        """Where every episode's prefix runs, as the approver and the report read it."""
        handed = self.rehearsal.prefixes
        if handed is None:
            n = self.capacity.prefix_chunks
            return f"run once after approval, in {n} prefix sandbox{'es' if n != 1 else ''}"
        return (
            f"run once by the rehearsal before approval, {handed.chunks} "
            f"chunk{'s' if handed.chunks != 1 else ''} of up to "
            f"{handed.batch_episodes} episodes; their index `{handed.index}` is part of the "
            "plan fingerprint"
        )


class BudgetUse(Model):
    max_world_seconds: float
    estimated_world_seconds: float = 0.0
    spent_world_seconds: float = 0.0
    reserved_world_seconds: float = 0.0
    max_concurrent_sandboxes: int
    peak_concurrent_sandboxes: int = 0
    skipped_batches: int = 0
    #: What worlds a sequential design stopped did not run: their world-episodes, and the
    #: world-seconds those would have cost at each world's own pace (its slowest batch).
    unspent_world_episodes: int = 0
    unspent_world_seconds: float = 0.0


class RunProgress(Model):
    prefix_chunks: int = 0
    prefixes_done: int = 0
    batches: int = 0
    batches_completed: int = 0
    batches_failed: int = 0
    batches_skipped: int = 0
    running: int = 0  # sandboxes running now (a world group's worlds share one)


class Carry(Model):
    """What a continued run inherits: small aggregates and one digest, never big lists."""

    origin_run_id: str
    runs: int
    stage: Stage = Field(description="Where the previous run was (approval, prefixes, worlds).")
    message: str
    plan: Plan
    approval: ApprovalState
    budget: BudgetUse
    slowdown: dict[str, float]
    progress: ProgressTally = Field(
        description="The progress so far: its stored digest and what decisions need."
    )


class ExperimentInput(Model):
    spec: ExperimentSpec
    approver_public_key: str | None = Field(
        default=None,
        pattern=r"^[0-9a-f]{64}$",
        description="Ed25519 public key (hex) of the approver; None: a worker makes a key pair.",
    )
    key_location: str = Field(
        default="", max_length=1000, description="Host and folder of the private key."
    )
    requested_by: str = Field(default="", max_length=MAX_NAME)
    request: SignedRequest | None = Field(
        default=None, description="The requester's signature over the start (forklab keys)."
    )
    batch_episodes: int = Field(
        default=DEFAULT_BATCH_EPISODES,
        ge=BATCH_EPISODES_RANGE[0],
        le=BATCH_EPISODES_RANGE[1],
    )
    rehearsal_episodes: int = Field(
        default=DEFAULT_REHEARSAL_EPISODES,
        ge=REHEARSAL_EPISODES_RANGE[0],
        le=REHEARSAL_EPISODES_RANGE[1],
    )
    workload_bundle: str | None = Field(
        default=None,
        pattern=r"^[0-9a-f]{64}$",
        description=(
            "Digest of the workload bundle forklab start shipped through the artifact store "
            "(docs/workloads.md, What is bundled); None for a workload built into ForkLab."
        ),
    )
    history_events: int = Field(
        default=DEFAULT_HISTORY_EVENTS,
        ge=HISTORY_EVENTS_RANGE[0],
        le=HISTORY_EVENTS_RANGE[1],
        description="Events one run records at most before it continues as new.",
    )
    carry: Carry | None = None


class StatusView(Model):
    experiment_id: str
    status: Status
    stage: Stage
    message: str
    error: str | None
    plan: Plan | None
    approval: ApprovalState
    budget: BudgetUse
    progress: RunProgress
    cleanup: CleanupResult | None
    evidence_log: str | None = Field(
        default=None, description="Whether Braintrust took the evidence, or why not (queued)."
    )
    looks: list[LookResult] = Field(
        default_factory=list,
        description="A sequential design's looks so far: each world's counts, statistic, "
        "boundary and decision.",
    )


class ExperimentResult(Model):
    """The workflow's result: a record with a status and an error, never lost on failure."""

    experiment_id: str
    status: Status
    error: str | None
    #: first after the status, so that the Web UI's Result shows them at its top
    verdicts: list[str] = Field(
        default_factory=list, description="Each judged world's verdict and why."
    )
    plan_fingerprint: str | None
    snapshot_id: str | None
    approval: ApprovalState
    budget: BudgetUse
    cleanup: CleanupResult | None
    analysis: AnalysisResult | None
    skipped: list[str] = Field(
        description=f"The first {MAX_SKIPPED_LINES} skipped batches, and how many more."
    )
    network_isolation: str = Field(description="Private network namespace, or why it fell back.")
    runs: int = Field(description="Workflow runs in the continue-as-new chain.")
    evidence_log: str | None = Field(
        default=None, description="Whether Braintrust took the evidence, or why not (queued)."
    )

    @property
    def worlds(self) -> list[WorldSummary]:
        return self.analysis.worlds if self.analysis else []
