"""Teams as the episodes of an experiment over a cohort (``cohort.team``), on a real dev
server: recorded runs of the example team (a researcher, a writer, a reviewer exchanging
a signal and an update; the stand-in model's ``fast`` researcher writes a thin conclusion
the reviewer rejects), each forked whole by the experiment's worlds through the team-fork
path of ``forklab fork-team``, and scored on the team's result (the reviewer's verdict).

Checked: the rehearsal lists each team's consistent cut (members, run ids, steps, prefix
digests) without starting anything, and the signed plan covers it; a world overriding the
researcher's conclusion rescues exactly the rejected teams and harms none, a placebo stays
inside the noise floor; the report links each rescued team to its fork pair; every fork's
ledger row names its team; the originals' histories are byte for byte the same; a cancel
mid-experiment leaves no member fork (nor coordinator) running."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from agent_fixtures import AgentTestLab
from cohort_lab import CohortLab, cohort_spec, running_cohort_lab
from cohort_user_code import ship_package
from temporalio.client import WorkflowExecutionStatus, WorkflowFailureError

from forklab.agents.team import CONCLUSION_STEP, ResearcherInput, ResearcherWorkflow
from forklab.agents.team_start import TeamHandles, start_team
from forklab.cli.experiment.cohort_commands import render_status
from forklab.contracts.cohort import cohort_fork_id
from forklab.contracts.runfork import fork_task_queue
from forklab.experiments.cohort.plan import cohort_digest
from forklab.experiments.runfork.policy import ToolPolicy
from forklab.experiments.runfork.team_receipt import SlotRole
from forklab.workers.runfork.team_worker import build_team_worker, team_task_queue
from forklab.workflows.experiment.messages import Stage, Status

APPROVED = "forklab.experiments.cohort.scorers:approved"
FULL = (
    "adopt durable execution for every agent workflow, because recorded histories make "
    "each run replayable, auditable and cheap to fork"
)


@pytest.fixture
async def cohort(agent_lab: AgentTestLab, tmp_path: Path) -> AsyncIterator[CohortLab]:
    async with (
        build_team_worker(agent_lab.client, agent_lab.agent),
        running_cohort_lab(agent_lab, tmp_path) as lab,
    ):
        yield lab


async def _record(lab: CohortLab, models: list[str]) -> list[TeamHandles]:
    """One team per researcher model, run to the end (``fast`` ones are rejected)."""
    queue = team_task_queue(lab.agents.agent)
    teams = [
        await start_team(
            lab.client, f"tc-{uuid.uuid4().hex[:8]}", f"topic {i}", queue, researcher_model=m
        )
        for i, m in enumerate(models)
    ]
    for team in teams:
        await team.results()
    return teams


def _members(teams: list[TeamHandles]) -> list[str]:
    return [w for t in teams for w in (t.ids.researcher, t.ids.writer, t.ids.reviewer)]


async def _history(lab: CohortLab, workflow_id: str) -> bytes:
    history = await lab.client.get_workflow_handle(workflow_id).fetch_history()
    return b"".join(e.SerializeToString(deterministic=True) for e in history.events)


def _team_spec(
    teams: list[TeamHandles], *worlds: dict[str, Any], extra: Sequence[str] = (), **more: Any
) -> Any:
    ids = [t.ids.researcher for t in teams] + list(extra)
    return cohort_spec(
        {
            "workflow_ids": ids,
            "limit": len(ids),
            "fork_at": f"step:{CONCLUSION_STEP - 1}",
            "outcome": APPROVED,
            "success_threshold": 1.0,
            "team": {"result_member": "TeamReviewer"},
        },
        list(worlds),
        **more,
    )


OVERRIDE = {
    "name": "full",
    "role": "treatment",
    "override": {"part": "result", "value": {"content": FULL, "model": "override"}},
}
PLACEBO = {"name": "noop", "role": "placebo", "prompt_patch": {"text": "Be yourself."}}


async def test_a_cohort_of_teams_forks_each_team_whole_and_scores_the_team(
    cohort: CohortLab,
) -> None:
    teams = await _record(cohort, ["fast", "slow", "fast", "slow"])
    rejected = {t.ids.researcher for t in teams if not (await t.reviewer.result())["approved"]}
    assert len(rejected) == 2
    before = {w: await _history(cohort, w) for w in _members(teams)}
    # a researcher whose writer never existed: its team is itself alone, with no reviewer
    # whose verdict is the team's result
    lone = await cohort.client.start_workflow(
        ResearcherWorkflow.run,
        ResearcherInput(topic="alone", writer=f"nobody-{uuid.uuid4().hex[:6]}"),
        id=f"tc-{uuid.uuid4().hex[:8]}-researcher",
        task_queue=team_task_queue(cohort.agents.agent),
    )
    with pytest.raises(WorkflowFailureError):
        await lone.result()
    spec = _team_spec(teams, OVERRIDE, PLACEBO, extra=[lone.id])
    handle = await cohort.start(spec)
    shown = await cohort.until_stage(handle, Stage.awaiting_approval)

    # the rehearsal resolved every team and its cuts, and started nothing; the team it
    # cannot score is excluded with the reason, not forked alone
    assert shown.runs == 4 and shown.excluded == 1
    queue = fork_task_queue(team_task_queue(cohort.agents.agent))
    assert [e async for e in cohort.client.list_workflows(f"TaskQueue = '{queue}'")] == []
    # the signed tool list: the writer's update to the reviewer is live (it reaches the
    # reviewer's fork, never the original)
    assert shown.tools == {"team.send_update": ToolPolicy.live.value}
    assert shown.plan_artifact is not None
    plan = cohort.plans.get(shown.plan_artifact)
    assert plan.digest == cohort_digest(plan)
    assert [(e.workflow_id, e.reason) for e in plan.excluded] == [
        (
            lone.id,
            "team: 0 members have the result member's type 'TeamReviewer'; exactly one must",
        )
    ]
    for run, team in zip(plan.runs, sorted(teams, key=lambda t: t.ids.researcher), strict=True):
        assert run.workflow_id == team.ids.researcher and run.team is not None
        assert run.team.result_member == team.ids.reviewer
        # the fork point (the researcher re-runs its conclusion) and the override's (it
        # inherits the conclusion, replaced): both cuts move the writer and the reviewer
        # back to their starts
        assert [c.requested_step for c in run.team.cuts] == [CONCLUSION_STEP - 1, CONCLUSION_STEP]
        for cut in run.team.cuts:
            steps = {m.workflow_id: m.at_step for m in cut.members}
            assert steps == {
                team.ids.researcher: cut.requested_step,
                team.ids.writer: 0,
                team.ids.reviewer: 0,
            }
            assert all(
                m.role is SlotRole.forked and len(m.prefix_sha256) == 64 for m in cut.members
            )
            assert all(m.run_id for m in cut.members)

    # `forklab cohort status` shows every team's cuts, member by member
    text = render_status(shown, plan)
    for team in teams:
        assert f"team of {team.ids.researcher} (result: {team.ids.reviewer}):" in text
        assert f"cut at {team.ids.researcher} step {CONCLUSION_STEP}:" in text
        assert f"{team.ids.writer:<34} forked    at step 0" in text

    await cohort.approve(handle)
    result = await asyncio.wait_for(handle.result(), timeout=900)
    assert result.status is Status.completed, result.error
    assert result.forks_done == 4 * 3 * 3 and result.forks_missing == 0
    assert result.cleanup is not None and result.cleanup.remaining == 0

    report = result.report
    assert report is not None
    lines = {w.world: w for w in report.worlds}
    # the override of the researcher's conclusion rescues exactly the rejected teams
    assert lines["full"].rescues == 2 and lines["full"].harms == 0
    assert lines["noop"].verdict == "inside_noise_floor" and lines["noop"].as_expected
    saved = json.loads((Path(report.report_dir) / "report.json").read_text())
    ids = [r.workflow_id for r in plan.runs]
    for i, row in enumerate(saved["outcomes"]["baseline"]):
        assert row == ("000" if ids[i] in rejected else "111"), (ids[i], row)
    # each rescued team links to the pair of its result member's forks
    run_key = f"{handle.id}/{handle.result_run_id}"
    reviewers = {t.ids.researcher: t.ids.reviewer for t in teams}
    rescued = {
        f"forklab diff {cohort_fork_id(run_key, i, 'baseline', 0)}/{reviewers[wid]} "
        f"{cohort_fork_id(run_key, i, 'full', 0)}/{reviewers[wid]}"
        for i, wid in enumerate(ids)
        if wid in rejected
    }
    assert set(lines["full"].rescued) == rescued

    # one ledger row per team fork, naming its team and each member's fork
    row = cohort.ledger.experiment(spec.id)
    assert row is not None
    forks = cohort.ledger.forks(spec.id, row.run_id)
    assert len(forks) == 36
    one = next(f for f in forks if f.world == "full" and f.run_index == 0 and f.fork == 0)
    assert one.team_json is not None
    team = json.loads(one.team_json)
    assert team["requested_member"] == ids[0] and team["team_fork"] == one.fork_id
    assert (
        team["members"] == {m: f"{one.fork_id}/{m}" for m in json.loads(one.team_json)["members"]}
        and len(team["members"]) == 3
    )
    # the member forks really ran, on the team's fork queue, as a team fork's members
    receipt = cohort.registry.receipt(f"{one.fork_id}/{team['result_member']}")
    assert receipt is not None and receipt.parent_workflow_id == team["result_member"]
    # the originals were never touched
    assert {w: await _history(cohort, w) for w in _members(teams)} == before


async def test_cancel_mid_experiment_leaves_no_team_member_fork_running(
    cohort: CohortLab,
) -> None:
    teams = await _record(cohort, ["fast", "slow", "fast", "slow"])
    # a brownout fails the researcher's live model call: its writer and reviewer forks
    # wait for messages that never come (for an hour), so they are running at the cancel
    outage = {
        "name": "outage",
        "role": "positive_control",
        "faults": [{"kind": "brownout", "rate": 1.0}],
    }
    # the requested members by a visibility query over their workflow type
    query = (
        f"WorkflowType = 'TeamResearcher' AND TaskQueue = '{team_task_queue(cohort.agents.agent)}'"
    )
    for _ in range(200):
        if len([e async for e in cohort.client.list_workflows(query)]) >= len(teams):
            break
        await asyncio.sleep(0.1)
    spec = _team_spec(teams, outage, budget={"max_forks": 100, "max_concurrent_forks": 3})
    spec = spec.model_copy(
        update={"cohort": spec.cohort.model_copy(update={"workflow_ids": None, "query": query})}
    )
    handle = await cohort.start(spec)
    await cohort.approve(handle)
    queue = fork_task_queue(team_task_queue(cohort.agents.agent))
    on_queue = f"TaskQueue = '{queue}'"
    waiting = f"{on_queue} AND ExecutionStatus = 'Running'"
    for _ in range(600):
        ids = [e.id async for e in cohort.client.list_workflows(waiting)]
        if any("-outage-" in w and w.endswith("-writer") for w in ids):
            break
        await asyncio.sleep(0.1)
    else:
        raise AssertionError("no waiting member fork of a team fork")
    await handle.cancel()
    with pytest.raises(WorkflowFailureError):
        await handle.result()
    view = await cohort.status(handle)
    assert view.status is Status.cancelled and view.forks_done < 24
    assert view.runs == len(teams)
    # nothing of any team fork runs: neither a member fork nor a coordinator (all on the
    # team's fork queue), found by the queue, not by the tag cleanup used (visibility is
    # eventually consistent: wait until it lists what closed)
    for _ in range(100):
        running = [e.id async for e in cohort.client.list_workflows(waiting)]
        if not running:
            break
        await asyncio.sleep(0.1)
    assert running == []
    for wid in [e.id async for e in cohort.client.list_workflows(on_queue)]:
        desc = await cohort.client.get_workflow_handle(wid).describe()
        assert desc.status is not WorkflowExecutionStatus.RUNNING, wid
    started = [e.id async for e in cohort.client.list_workflows(on_queue)]
    assert any("/" in w for w in started), "no member fork had started"


async def test_a_users_scorer_reads_the_teams_view_in_its_box(
    cohort: CohortLab, tmp_path: Path
) -> None:
    teams = await _record(cohort, ["fast", "slow"])
    spec = _team_spec(teams, OVERRIDE)
    spec = spec.model_copy(
        update={
            "cohort": spec.cohort.model_copy(update={"outcome": "usercode.scoring:team_approved"})
        }
    )
    bundle = ship_package(cohort.store, tmp_path / "src")
    handle = await cohort.start(spec, code_bundle=bundle)
    # the rehearsal tried the scorer on the recorded teams' views (it asserts their shape)
    await cohort.approve(handle)
    result = await asyncio.wait_for(handle.result(), timeout=900)
    assert result.status is Status.completed, result.error
    assert result.forks_missing == 0
    assert result.report is not None
    lines = {w.world: w for w in result.report.worlds}
    assert lines["full"].rescues == 1 and lines["full"].harms == 0
