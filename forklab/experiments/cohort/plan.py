"""The cohort part of an experiment's plan: which recorded runs are forked where, which
are excluded and why, and which tools their histories call, with each tool's policy.

Pure: the rehearsal reads each run's chain (``forklab.activities.runfork.cohort_reads``)
and hands the parsed steps here. The plan's ``digest`` covers every run id, the run ids
of each chain, the fork steps, the prefix digests and the tool list, so the approver's
signature names exactly the runs that will be forked: a run recorded after the approval
is not in the plan, and the experiment never runs it. An excluded run is listed with its
reason and never replaced by another run or forked at another step.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from enum import StrEnum

from pydantic import BaseModel, ConfigDict, Field

from forklab.experiments.cohort.fork_point import (
    MODEL_ACTIVITY_TYPES,
    ForkPoint,
    ForkPointKind,
    ResolvedForkPoint,
    Unresolved,
    resolve_fork_point,
)
from forklab.experiments.cohort.spec import CohortExperimentSpec, ForkWorld
from forklab.experiments.cohort.team_episode import TeamEpisode
from forklab.experiments.runfork.policy import DEFAULT_KEY, ToolPolicy
from forklab.experiments.runfork.steps import Step, StepStatus
from forklab.runtime.canon import digest
from forklab.runtime.workload import Feature


class RunStatus(StrEnum):
    """A recorded chain's status as the run-fork reader spells it (Temporal's execution
    status, lower case)."""

    running = "running"
    completed = "completed"
    failed = "failed"
    canceled = "canceled"
    terminated = "terminated"
    continued_as_new = "continued_as_new"
    timed_out = "timed_out"


#: Run statuses whose histories are final (a run still running is no recorded run).
CLOSED = frozenset(
    {
        RunStatus.completed,
        RunStatus.failed,
        RunStatus.terminated,
        RunStatus.timed_out,
        RunStatus.canceled,
    }
)


class RecordedRun(BaseModel):
    """One recorded run (its whole continue-as-new chain) as the rehearsal read it."""

    model_config = ConfigDict(frozen=True)

    workflow_id: str
    #: the latest run of the chain, and every run of it, oldest first
    run_id: str
    chain_run_ids: list[str]
    workflow_type: str
    status: RunStatus
    steps: list[Step]


class CohortRun(BaseModel):
    """A run of the cohort and where it is forked."""

    model_config = ConfigDict(frozen=True)

    workflow_id: str
    run_id: str
    chain_run_ids: list[str]
    workflow_type: str
    status: RunStatus
    fork_point: str
    at_step: int
    decisive_step: int | None
    prefix_sha256: str
    #: the run failed (harms are counted on the runs that did not)
    failed: bool
    #: the pre-decision features the spec's ``cohort.features`` read at the fork point
    #: (empty without one): what slices and the guard group the runs by
    features: dict[str, Feature] = Field(default_factory=dict)
    #: with ``cohort.team``: the run's team and its signed cuts (the run is the requested
    #: member); None for a run forked alone
    team: TeamEpisode | None = None


class ExcludedRun(BaseModel):
    model_config = ConfigDict(frozen=True)

    workflow_id: str
    reason: str


class CohortPlan(BaseModel):
    runs: list[CohortRun]
    excluded: list[ExcludedRun]
    #: every tool the cohort's histories call, with its policy on the experiment's forks
    tools: dict[str, ToolPolicy]
    digest: str = Field(default="")


def _needs_failure(point: ForkPoint) -> bool:
    return point.kind in (ForkPointKind.failed, ForkPointKind.last_model_call_before_failure)


def _point_for(spec: CohortExperimentSpec, steps: Sequence[Step]) -> ForkPoint:
    """``fork_at``, or ``fork_at_succeeded`` for a run with no failed step when
    ``fork_at`` needs one (the spec says so: no substitution)."""
    cohort = spec.cohort
    has_failed = any(s.status is StepStatus.failed for s in steps)
    if not has_failed and _needs_failure(cohort.fork_at) and cohort.fork_at_succeeded:
        return cohort.fork_at_succeeded
    return cohort.fork_at


def plan_cohort(
    spec: CohortExperimentSpec,
    recorded: Sequence[RecordedRun],
    missing: Sequence[ExcludedRun] = (),
) -> CohortPlan:
    """Resolve every recorded run's fork point (in workflow id order) and list the tools.

    ``missing`` are runs the rehearsal could not read (named by id, not found), excluded
    with their reason.
    """
    runs: list[CohortRun] = []
    excluded = list(missing)
    overrides = [w.name for w in spec.worlds if w.override is not None]
    tools: set[str] = set()
    for rec in sorted(recorded, key=lambda r: r.workflow_id):
        tools.update(
            s.label or s.activity_type
            for s in rec.steps
            if s.activity_type not in MODEL_ACTIVITY_TYPES
        )
        if rec.status not in CLOSED:
            excluded.append(
                ExcludedRun(
                    workflow_id=rec.workflow_id,
                    reason=f"the run is {rec.status.value}, not recorded",
                )
            )
            continue
        point = _point_for(spec, rec.steps)
        found: ResolvedForkPoint | Unresolved = resolve_fork_point(rec.steps, point)
        if isinstance(found, Unresolved):
            excluded.append(
                ExcludedRun(workflow_id=rec.workflow_id, reason=f"{point.text}: {found.reason}")
            )
            continue
        if found.decisive_step is None and overrides:
            excluded.append(
                ExcludedRun(
                    workflow_id=rec.workflow_id,
                    reason=f"{point.text}: the run has no decisive step for the override of "
                    f"world {overrides[0]} to replace",
                )
            )
            continue
        runs.append(
            CohortRun(
                workflow_id=rec.workflow_id,
                run_id=rec.run_id,
                chain_run_ids=rec.chain_run_ids,
                workflow_type=rec.workflow_type,
                status=rec.status,
                fork_point=point.text,
                at_step=found.at_step,
                decisive_step=found.decisive_step,
                prefix_sha256=found.prefix_sha256,
                failed=rec.status is not RunStatus.completed,
            )
        )
    excluded.sort(key=lambda e: e.workflow_id)
    policies = {tool: spec.policy(tool) for tool in sorted(tools)}
    plan = CohortPlan(runs=runs, excluded=excluded, tools=policies)
    plan.digest = cohort_digest(plan)
    return plan


def cohort_digest(plan: CohortPlan) -> str:
    """The digest the approver signs: runs, chains, fork steps, prefixes, tools, and the
    runs' pre-decision features when the spec reads any."""
    covered = {
        "runs": [
            [r.workflow_id, r.run_id, r.chain_run_ids, r.at_step, r.prefix_sha256]
            for r in plan.runs
        ],
        "excluded": [[e.workflow_id, e.reason] for e in plan.excluded],
        "tools": {t: p.value for t, p in plan.tools.items()},
    }
    if any(r.features for r in plan.runs):
        covered["features"] = [r.features for r in plan.runs]
    if any(r.team is not None for r in plan.runs):
        covered["teams"] = [
            None if r.team is None else r.team.model_dump(mode="json") for r in plan.runs
        ]
    return digest(covered)


def attach_teams(
    spec: CohortExperimentSpec,
    plan: CohortPlan,
    teams: Mapping[str, TeamEpisode | str],
    member_tools: Iterable[str],
    message_tool: str,
) -> CohortPlan:
    """The plan of a cohort of teams (``cohort.team``): each kept run with its team's
    cuts, or excluded with the reason ``teams`` gives for it (never forked alone instead).

    ``member_tools`` are the tools the other members' histories call, added to the signed
    list; ``message_tool`` (the team's messaging activity) is ``live`` unless the spec
    names it: a member's message after the cut must reach the receiver's fork (the team
    fork addresses it there, never to an original), and served from the record it would
    not."""
    runs: list[CohortRun] = []
    excluded = list(plan.excluded)
    for run in plan.runs:
        team = teams.get(run.workflow_id, "its team was not read")
        if isinstance(team, str):
            excluded.append(ExcludedRun(workflow_id=run.workflow_id, reason=f"team: {team}"))
            continue
        runs.append(run.model_copy(update={"team": team}))
    excluded.sort(key=lambda e: e.workflow_id)
    tools = dict(plan.tools)
    for tool in sorted(set(member_tools) - MODEL_ACTIVITY_TYPES):
        tools.setdefault(tool, spec.policy(tool))
    if message_tool in tools and message_tool not in spec.tools:
        tools[message_tool] = ToolPolicy.live
    out = CohortPlan(runs=runs, excluded=excluded, tools=dict(sorted(tools.items())))
    out.digest = cohort_digest(out)
    return out


def check_digest(plan: CohortPlan) -> None:
    """Refuse a plan whose runs, chains, fork steps or tools differ from what its digest
    (the one the approver signed) covers."""
    if cohort_digest(plan) != plan.digest:
        raise ValueError(
            "the cohort plan differs from its signed digest; rehearse and approve it again"
        )


def plan_fingerprint(
    spec: CohortExperimentSpec, plan: CohortPlan, code_digest: str | None = None
) -> str:
    """What the approver signs: the spec (worlds, seed, budget, scorer), the cohort's
    digest (runs, chains, fork steps, prefix digests, exclusions, tools and policies,
    features) and the code digest of the user's scorer and feature functions, if any."""
    check_digest(plan)
    signed = {"spec": spec.digest(), "cohort": plan.digest}
    if code_digest is not None:
        signed["code"] = code_digest
    return digest(signed)


def fork_policies(plan: CohortPlan, world: ForkWorld) -> dict[str, ToolPolicy]:
    """The tool policies of a world's forks: the signed list (every tool the cohort's
    histories call, ``block`` unless the spec says otherwise), the world's own changes,
    ``block`` for any tool the list does not name, and model calls live (a fork
    continues live from its fork point: that is what the A/A world measures)."""
    policies = {DEFAULT_KEY: ToolPolicy.block, **plan.tools, **world.tool_policies}
    policies.update(dict.fromkeys(MODEL_ACTIVITY_TYPES, ToolPolicy.live))
    return policies
