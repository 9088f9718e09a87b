"""The experiment workflow over a cohort: its input, the state it carries across
continue-as-new (aggregates, never a list of forks), its status and its result.

The outcomes are a compact matrix: per world, per cohort run, one character per fork
(``1`` success, ``0`` failure, ``-`` no outcome, ``~`` saved: the majority was decided,
``/`` unspent: a sequential design stopped the world, ``*`` running, ``.`` not started
yet), so a 2,000-run × 5-world × k = 3 experiment carries 30,000 characters, whatever
happened to each fork.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from forklab.contracts.cohort import (
    CohortRehearsal,
    CohortReport,
    ForkCleanupResult,
    PlannedDesign,
)
from forklab.contracts.experiment import LookResult
from forklab.experiments.cohort.matrix import WorldCosts
from forklab.experiments.cohort.spec import CohortExperimentSpec
from forklab.workflows.experiment.messages import (
    MAX_NAME,
    ApprovalState,
    SignedRequest,
    Stage,
    Status,
)

WORKFLOW_TYPE = "ForkLabCohortExperiment"
STATUS_QUERY = "status"
#: a fork not started yet (in the matrix)
PENDING = "."
#: a fork running (in the matrix; never across continue-as-new, which waits for them)
RUNNING = "*"


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class CohortProgress(_Model):
    #: world -> run -> one character per fork
    outcomes: dict[str, list[str]] = Field(default_factory=dict)
    costs: dict[str, WorldCosts] = Field(default_factory=dict)
    #: the next job (run-major, then fork, then world) not started yet
    next_job: int = 0
    done: int = 0
    #: jobs set aside until an earlier fork of their run in their world finishes
    waiting: list[int] = Field(default_factory=list)
    #: forks without an outcome (not started, unreadable) and jobs skipped by the budget
    missing: int = 0
    skipped: int = 0
    #: forks not run because their run's majority was decided (``stop_when_decided``)
    saved: int = 0
    tokens: int = 0
    world_seconds: float = 0.0
    #: forks not run because a sequential design stopped their world (``analysis.sequential``)
    unspent: int = 0
    #: a sequential design's looks decided so far, in order (each: the worlds that ran
    #: into it, with their counts, statistic, boundary and decision)
    looks: list[LookResult] = Field(default_factory=list)


class CohortCarry(_Model):
    """What continue-as-new hands over: the rehearsal (the plan as a stored digest), the
    approval and the aggregates; never the plan's runs."""

    origin_run_id: str
    runs: int
    stage: Stage
    message: str
    rehearsal: CohortRehearsal
    approval: ApprovalState
    progress: CohortProgress


class CohortInput(_Model):
    spec: CohortExperimentSpec
    approver_public_key: str | None = Field(default=None, pattern=r"^[0-9a-f]{64}$")
    key_location: str = Field(default="", max_length=500)
    requested_by: str = Field(default="", max_length=MAX_NAME)
    request: SignedRequest | None = None
    #: the bundle of the user's scorer and feature functions ``forklab cohort start``
    #: shipped through the artifact store (None: the spec names shipped scorers only)
    code_bundle: str | None = Field(default=None, pattern=r"^[0-9a-f]{64}$")
    #: each run of the experiment's chain stays under this many history events: it
    #: starts no fork its running forks could carry past it, and continues as new
    history_events: int = Field(default=4000, ge=50, le=50_000)
    carry: CohortCarry | None = None


class CohortStatusView(_Model):
    experiment_id: str
    status: Status
    stage: Stage
    message: str
    error: str | None
    fingerprint: str | None
    approval: ApprovalState
    #: the stored plan (``forklab.activities.runfork.cohort_plans``): its runs and exclusions
    plan_artifact: str | None
    runs: int
    excluded: int
    tools: dict[str, str]
    forks_total: int
    forks_done: int
    forks_missing: int
    forks_saved: int
    running: int
    tokens: int
    runs_of_chain: int
    #: the sequential design the plan signs (its waves, boundaries and expected saving),
    #: the forks it left unspent and its looks so far
    design: PlannedDesign | None = None
    forks_unspent: int = 0
    looks: list[LookResult] = Field(default_factory=list)
    #: the code digest of the user's scorer and feature functions the plan runs (None:
    #: shipped scorers only); the fingerprint covers it
    code_digest: str | None = None


class CohortResult(_Model):
    experiment_id: str
    status: Status
    error: str | None
    fingerprint: str | None
    plan_artifact: str | None
    runs: int
    report: CohortReport | None
    cleanup: ForkCleanupResult | None
    forks_done: int
    forks_missing: int
    forks_saved: int
    tokens: int
    runs_of_chain: int
    #: forks a sequential design left unspent (``analysis.sequential``)
    forks_unspent: int = 0
    #: what became of the Braintrust spans (None: Braintrust is off)
    evidence_log: str | None = None
