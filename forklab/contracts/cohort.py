"""Messages between the experiment workflow over a cohort and its activities
(``forklab.activities.runfork.cohort_forks``): the rehearsal's plan, one fork's job and
outcome, the cleanup of running forks, the analysis and the ledger."""

from __future__ import annotations

import hashlib
from enum import StrEnum

from pydantic import BaseModel, ConfigDict, Field, model_validator

from forklab.contracts.activity import ActivityRef
from forklab.contracts.experiment import EvidenceLogResult, LookResult, WorldLook
from forklab.experiments.cohort.guard_policy import CohortGuard
from forklab.experiments.cohort.matrix import WorldCosts
from forklab.experiments.cohort.spec import CohortExperimentSpec, ForkWorld
from forklab.experiments.experiment.spec import Spending
from forklab.experiments.experiment.waves import Decision
from forklab.experiments.runfork.policy import ToolPolicy


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


def cohort_fork_id(run_key: str, run: int, world: str, fork: int) -> str:
    """The workflow id of fork ``fork`` of the cohort's run ``run`` in ``world``: derived
    from the experiment's run, so a retried start finds the fork it already started
    instead of starting a second one."""
    tag = hashlib.sha256(run_key.encode()).hexdigest()[:12]
    return f"cohort-{tag}-r{run}-{world}-k{fork}"


class UserCode(_Model):
    """The user's scorer and feature functions the plan runs in boxes: the bundle
    ``forklab cohort start`` shipped (its manifest's digest in the artifact store) and the
    code digest of its files, which the plan fingerprint covers."""

    bundle: str = Field(pattern=r"^[0-9a-f]{64}$")
    digest: str = Field(pattern=r"^[0-9a-f]{64}$")


class CohortRehearseInput(_Model):
    spec: CohortExperimentSpec
    #: the bundle of the user's scorer and feature functions (None: shipped ones only)
    code_bundle: str | None = None


class PlanRef(_Model):
    """The cohort plan as the workflow holds it: the plan itself (every kept run with its
    chain, about 400 bytes a run) is in the artifact store under ``artifact``, and the
    activities that need a run read it from there; the workflow keeps the digests, the
    counts and the tool list the approver signs."""

    #: sha256 of the stored plan (``forklab.activities.runfork.cohort_plans``)
    artifact: str = Field(pattern=r"^[0-9a-f]{64}$")
    #: the cohort digest the plan fingerprint covers (``CohortPlan.digest``)
    digest: str
    runs: int = Field(ge=0)
    excluded: int = Field(ge=0)
    tools: dict[str, ToolPolicy]


class CohortRehearsal(_Model):
    """The plan the approver signs: the cohort (runs, chains, fork steps, prefix digests,
    exclusions, tools with their policies; stored, see ``PlanRef``) and the estimates the
    capacity check read."""

    plan: PlanRef
    scorer: str
    #: the user's code the forks are scored by (None: a shipped scorer, no features)
    code: UserCode | None = None
    forks: int
    #: model calls and tokens the forks are expected to make, from the recorded steps
    #: after each run's fork point
    estimated_model_calls: int
    estimated_tokens: int
    estimated_world_seconds: float
    fingerprint: str
    capacity_ok: bool
    capacity_reason: str = ""
    #: the sequential design over the plan's runs (None: every world runs every run)
    design: PlannedDesign | None = None


class PlannedDesign(_Model):
    """A sequential design as the approver sees it: its waves over the plan's runs, the
    boundary of each look and the share of the forks it is expected to leave unspent
    (``forklab.experiments.cohort.sequential.planned_saving``)."""

    spending: Spending
    #: cumulative runs at the end of each wave (the runs in the design's seeded order)
    wave_ends: list[int]
    bounds: list[float]
    saved_if_inert: float
    saved_if_inert_low: float
    saved_if_inert_high: float
    saved_if_effect: float
    saved_if_effect_low: float
    saved_if_effect_high: float


class ForkJob(_Model):
    """One fork of the plan: the activity reads run ``run_index`` (and the tool list) from
    the stored plan ``plan_artifact``."""

    experiment_id: str
    run_key: str
    seed: int
    plan_artifact: str = Field(pattern=r"^[0-9a-f]{64}$")
    run_index: int = Field(ge=0)
    world: ForkWorld
    fork: int = Field(ge=0)
    scorer: str
    success_threshold: float
    code: UserCode | None = None


class ForkStatus(StrEnum):
    completed = "completed"
    failed = "failed"
    #: the fork could not be started or read (its outcome is missing, not a failure)
    error = "error"


class ForkOutcome(_Model):
    run_index: int
    world: str
    fork: int
    fork_id: str
    status: ForkStatus
    score: float | None = None
    success: bool = False
    tokens: int = 0
    seconds: float = 0.0
    lineage_root: str = ""
    receipt_sha256: str = ""
    error: str | None = None


class ForkCleanupInput(_Model):
    run_key: str


class ForkCleanupResult(_Model):
    cancelled: int
    remaining: int


class CohortAnalyseInput(_Model):
    spec: CohortExperimentSpec
    plan_artifact: str = Field(pattern=r"^[0-9a-f]{64}$")
    run_key: str
    workflow_id: str
    #: per world, per run: one character per fork (``SUCCESS``, ``FAILURE``, ``MISSING``)
    outcomes: dict[str, list[str]]
    costs: dict[str, WorldCosts]


class WorldCounts(_Model):
    """A world's cumulative rescues and harms (by majority, against the baseline) at each
    look it ran into."""

    rescue: list[int]
    harm: list[int]


class CohortLookInput(_Model):
    """A sequential design's look ``look`` (0-based) over the plan's ``runs``: the counts
    of every world still running, up to the end of the look's wave."""

    spec: CohortExperimentSpec
    runs: int = Field(ge=1)
    look: int = Field(ge=0, le=49)
    counts: dict[str, WorldCounts]


class DesignLine(_Model):
    """A world's path through the sequential design (looks: counts, statistic, boundary,
    decision), its verdict valid for the design and what its stop left unspent."""

    world: str
    stopped: Decision
    looks: list[WorldLook]
    runs: int
    p_value: float
    holm_p: float
    ci_low: float
    ci_high: float
    verdict: str
    as_expected: bool
    unspent_forks: int
    unspent_tokens: float
    unspent_seconds: float
    text: str


#: The rescued and harmed runs a report's world line names. The line travels in
#: payloads (the analysis' result, the ledger's input, the experiment's result), which
#: Temporal refuses above its limit (2 MB by default) and a workflow task that sends one
#: fails for ever: the lines must not grow with the harm an experiment finds. Every run
#: is named in the stored report (``CohortReport.markdown_artifact``, ``report.json``).
LISTED_RUNS = 20


class WorldLine(_Model):
    world: str
    role: str
    description: str
    verdict: str
    as_expected: bool
    rescues: int
    harms: int
    unchanged: int
    rate_difference: float
    holm_p: float
    cost_per_rescue_tokens: float | None
    cost_per_rescue_seconds: float | None
    text: str
    #: ``forklab diff`` of the rescued and harmed runs' fork pairs (baseline, world): the
    #: first ``LISTED_RUNS`` of each (``rescues`` and ``harms`` count them all; the stored
    #: report lists every one)
    rescued: list[str] = Field(default_factory=list)
    harmed: list[str] = Field(default_factory=list)


class CohortReport(_Model):
    experiment_id: str
    runs: int
    forks_per_world: int
    missing_forks: int
    #: forks not run because their run's majority was decided (``stop_when_decided``)
    saved_forks: int = 0
    flip_rate: float
    flip_ci_low: float
    flip_ci_high: float
    worlds: list[WorldLine]
    #: the report's Markdown in the artifact store (it names every rescued and harmed run,
    #: so it grows with them: it is not carried in the payload)
    markdown_artifact: str | None = Field(default=None, pattern=r"^[0-9a-f]{64}$")
    #: the Markdown itself, in a report recorded before it moved to the artifact store (an
    #: experiment's history holds the report as its analysis returned it)
    markdown: str | None = None
    report_dir: str
    report_sha256: str
    #: the guard policy of the gated world, learned and validated on held-out runs (None
    #: without pre-decision features or a treatment)
    guard: CohortGuard | None = None
    #: with ``analysis.sequential``: every world's path and verdict valid for the design,
    #: and the forks the design left unspent (every world's, the baseline's too)
    design: list[DesignLine] = Field(default_factory=list)
    unspent_forks: int = 0

    @model_validator(mode="after")
    def _one_markdown(self) -> CohortReport:
        if (self.markdown is None) == (self.markdown_artifact is None):
            raise ValueError("a report holds its Markdown or names it in the artifact store")
        return self


class CohortLedgerInput(_Model):
    experiment_id: str
    run_id: str
    status: str
    spec: CohortExperimentSpec
    fingerprint: str
    approval_json: str
    budget_json: str
    error: str | None = None
    report: CohortReport | None = None
    plan_digest: str = ""
    #: what each world's forks spent (the world rows' world-seconds)
    costs: dict[str, WorldCosts] = Field(default_factory=dict)


#: The activities, by typed reference (``forklab.workflows.activity_calls.execute``).
REHEARSE = ActivityRef[CohortRehearseInput, CohortRehearsal](
    "cohort_rehearse", CohortRehearseInput, CohortRehearsal
)
RUN_FORK = ActivityRef[ForkJob, ForkOutcome]("cohort_fork", ForkJob, ForkOutcome)
CLEANUP_FORKS = ActivityRef[ForkCleanupInput, ForkCleanupResult](
    "cohort_cleanup", ForkCleanupInput, ForkCleanupResult
)
ANALYSE = ActivityRef[CohortAnalyseInput, CohortReport](
    "cohort_analyse", CohortAnalyseInput, CohortReport
)
LOOK = ActivityRef[CohortLookInput, LookResult]("cohort_look", CohortLookInput, LookResult)
#: None when Braintrust is off (or on histories recorded before it reported)
RECORD_LEDGER = ActivityRef[CohortLedgerInput, EvidenceLogResult | None](
    "cohort_ledger", CohortLedgerInput, EvidenceLogResult | None
)
