"""The plan of a cohort of teams, pure: each team's cut becomes the plan's record (members,
run ids, steps, roles, prefix digests), a cut that cannot be forked exactly is refused
with its reason, a team that cannot be resolved excludes its run (never forked alone),
and the digest the approver signs covers every member's step and prefix."""

from __future__ import annotations

import json

import pytest
from test_team_cut import at, msg, research_team

from forklab.experiments.cohort.plan import (
    CohortPlan,
    CohortRun,
    RunStatus,
    attach_teams,
    check_digest,
    cohort_digest,
    plan_fingerprint,
)
from forklab.experiments.cohort.spec import CohortExperimentSpec, parse_cohort_spec
from forklab.experiments.cohort.team_episode import TeamEpisode, plan_team_cut
from forklab.experiments.experiment.spec import SpecError
from forklab.experiments.runfork.policy import ToolPolicy
from forklab.experiments.runfork.steps import Step, StepStatus
from forklab.experiments.runfork.team_cut import Member, MessageKind, Team, consistent_cut
from forklab.experiments.runfork.team_receipt import SlotRole

MESSAGE_TOOL = "team.send_update"


def _steps(n: int, run_id: str, status: StepStatus = StepStatus.completed) -> list[Step]:
    return [
        Step(
            index=i,
            activity_type="chat_model",
            input_sha256=f"{run_id}-in-{i}",
            result_sha256=f"{run_id}-out-{i}",
            status=status,
            run_id=run_id,
        )
        for i in range(1, n + 1)
    ]


STEPS = {"R": _steps(5, "r1"), "W": _steps(3, "w1"), "V": _steps(2, "v1")}
TYPES = {"R": "TeamResearcher", "W": "TeamWriter", "V": "TeamReviewer"}


def _spec(**tools: str) -> CohortExperimentSpec:
    raw = {
        "id": "teams",
        "hypothesis": {"text": "another conclusion changes the team's verdict"},
        "seed": 3,
        "cohort": {
            "workflow_ids": ["R"],
            "fork_at": "step:2",
            "outcome": "forklab.experiments.cohort.scorers:approved",
            "team": {"result_member": "TeamReviewer"},
        },
        "tools": tools,
        "worlds": [
            {"name": "baseline", "role": "baseline"},
            {"name": "slow", "role": "treatment", "model": "slow"},
        ],
    }
    return parse_cohort_spec(json.dumps(raw), "cohort.yaml")


def _run(workflow_id: str = "R") -> CohortRun:
    return CohortRun(
        workflow_id=workflow_id,
        run_id="r1",
        chain_run_ids=["r1"],
        workflow_type="TeamResearcher",
        status=RunStatus.completed,
        fork_point="step:2",
        at_step=2,
        decisive_step=3,
        prefix_sha256="p" * 64,
        failed=False,
    )


def _episode(at_step: int = 2) -> TeamEpisode:
    planned = plan_team_cut(consistent_cut(research_team(), "R", at_step), STEPS, TYPES)
    assert not isinstance(planned, str), planned
    return TeamEpisode(result_member="V", cuts=[planned])


def _plan(runs: list[CohortRun]) -> CohortPlan:
    plan = CohortPlan(runs=runs, excluded=[], tools={"chat_model": ToolPolicy.live})
    plan.digest = cohort_digest(plan)
    return plan


def test_a_teams_cut_becomes_the_plans_record_of_every_member() -> None:
    cut = _episode(2).cuts[0]
    assert cut.requested_step == 2
    members = {m.workflow_id: m for m in cut.members}
    # the researcher before its conclusion: the writer back before the findings (step
    # 0), which moves the reviewer back before the review it got from the writer
    assert {w: (m.at_step, m.role) for w, m in members.items()} == {
        "R": (2, SlotRole.forked),
        "W": (0, SlotRole.forked),
        "V": (0, SlotRole.forked),
    }
    assert {w: m.run_id for w, m in members.items()} == {"R": "r1", "W": "w1", "V": "v1"}
    assert members["V"].workflow_type == "TeamReviewer"
    assert members["R"].prefix_sha256 != members["W"].prefix_sha256
    assert cut.forked() == {"R": 2, "W": 0, "V": 0}


def test_a_cut_that_is_not_exact_is_refused_with_its_reason() -> None:
    pending = {**STEPS, "R": _steps(5, "r1", StepStatus.pending)}
    found = plan_team_cut(consistent_cut(research_team(), "R", 2), pending, TYPES)
    assert isinstance(found, str) and "member R's step 1 before its cut is pending" in found
    short = {**STEPS, "R": _steps(1, "r1")}
    found = plan_team_cut(consistent_cut(research_team(), "R", 2), short, TYPES)
    assert isinstance(found, str) and "fewer than 2 steps" in found
    # a parent cut between its child's start and result is forked at no step
    team = Team(
        members=[
            Member(workflow_id="P", run_id="p1", steps=2, closed=True),
            Member(workflow_id="C", run_id="c1", steps=1, closed=True),
        ],
        messages=[
            msg("start", "P", "C", at(1), at(0), MessageKind.child_start),
            msg("result", "C", "P", at(1), at(1, 1), MessageKind.child_result),
        ],
    )
    found = plan_team_cut(
        consistent_cut(team, "C", 0), {"P": _steps(2, "p1"), "C": _steps(1, "c1")}, {}
    )
    assert isinstance(found, str) and "between two messages" in found


def test_an_unresolved_team_excludes_its_run_and_the_messages_tool_is_live() -> None:
    spec = _spec()
    plan = attach_teams(
        spec,
        _plan([_run("R"), _run("R2")]),
        {"R": _episode(), "R2": "the team of 'R2' has more than 20 members"},
        ["team.send_update", "chat_model", "lookup"],
        MESSAGE_TOOL,
    )
    assert [r.workflow_id for r in plan.runs] == ["R"]
    assert plan.runs[0].team == _episode()
    assert [(e.workflow_id, e.reason) for e in plan.excluded] == [
        ("R2", "team: the team of 'R2' has more than 20 members")
    ]
    # the members' tools are in the signed list: their default (block), and the team's
    # messages live unless the spec says otherwise
    assert plan.tools == {
        "chat_model": ToolPolicy.live,
        "lookup": ToolPolicy.block,
        MESSAGE_TOOL: ToolPolicy.live,
    }
    check_digest(plan)
    blocked = attach_teams(
        _spec(**{MESSAGE_TOOL: "block"}),
        _plan([_run("R")]),
        {"R": _episode()},
        [MESSAGE_TOOL],
        MESSAGE_TOOL,
    )
    assert blocked.tools[MESSAGE_TOOL] is ToolPolicy.block


@pytest.mark.parametrize("field", ["at_step", "prefix_sha256", "run_id", "role"])
def test_the_signed_digest_covers_every_members_cut(field: str) -> None:
    spec = _spec()
    plan = attach_teams(spec, _plan([_run()]), {"R": _episode()}, [], MESSAGE_TOOL)
    signed = plan_fingerprint(spec, plan)
    team = plan.runs[0].team
    assert team is not None
    cut = team.cuts[0]
    writer = next(m for m in cut.members if m.workflow_id == "W")
    changed_value = {
        "at_step": 1,
        "prefix_sha256": "0" * 64,
        "run_id": "w2",
        "role": SlotRole.inherited,
    }[field]
    moved = cut.model_copy(
        update={
            "members": [
                m.model_copy(update={field: changed_value}) if m is writer else m
                for m in cut.members
            ]
        }
    )
    forged = plan.model_copy(
        update={
            "runs": [
                plan.runs[0].model_copy(update={"team": team.model_copy(update={"cuts": [moved]})})
            ]
        }
    )
    # a plan whose cut differs from what was signed is refused before anything forks
    with pytest.raises(ValueError, match="differs from its signed digest"):
        check_digest(forged)
    forged.digest = cohort_digest(forged)
    assert plan_fingerprint(spec, forged) != signed


@pytest.mark.parametrize(
    ("team", "field"),
    [
        ({"result_member": "Team Reviewer"}, "cohort.team.result_member"),
        ({"max_members": 0}, "cohort.team.max_members"),
        ({"members": ["a"]}, "cohort.team.members"),
    ],
)
def test_a_bad_team_field_is_one_sentence_naming_it(team: dict[str, object], field: str) -> None:
    raw = json.loads(_spec().model_dump_json())
    raw["cohort"]["team"] = team
    with pytest.raises(SpecError) as exc:
        parse_cohort_spec(json.dumps(raw), "cohort.yaml")
    text = str(exc.value)
    assert text.startswith(f"cohort.yaml: field {field}") and "\n" not in text, text
