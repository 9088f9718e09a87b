"""A sequential design on the durable path: waves, a look after each, stopped worlds that
start no more work, and a report that is the pure analysis' on the same episodes."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

from helpers import forklab_in_process as forklab
from orchestration_lab import (
    Lab,
    WorkerProcesses,
    cli_env,
    lab_settings,
    make_spec,
    signed,
)
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Replayer

from forklab.activities.experiment.approval_keys import new_private_key, public_key_hex
from forklab.activities.experiment.planning import plan_fingerprint
from forklab.cli.experiment.rehearsal import rehearse
from forklab.cli.experiment.status_commands import render_status
from forklab.experiments.experiment.spec import ExperimentSpec
from forklab.workers.experiment.worker import workflow_runner
from forklab.workflows.experiment.messages import (
    ExperimentInput,
    ExperimentResult,
    Stage,
    Status,
    workflow_id,
)
from forklab.workflows.experiment.workflow import ExperimentWorkflow

#: Four waves of 60 episodes, each cut into two chunks of 30.
EPISODES, LOOKS, BATCH = 240, 4, 30


def sequential_spec(*extra: dict[str, Any]) -> ExperimentSpec:
    worlds = [
        {"name": "baseline", "role": "baseline"},
        {"name": "boost", "role": "treatment", "intervention": {"name": "boost"}},
        *extra,
    ]
    expected = {"boost": "decrease", "inert": "decrease", "drag": "increase"}
    return make_spec(
        episodes=EPISODES,
        worlds=worlds,
        hypothesis={
            "text": "boost wins more episodes, inert changes nothing, drag loses them",
            "expected": {w["name"]: expected[w["name"]] for w in worlds if w["name"] in expected},
        },
        analysis={"sequential": {"looks": LOOKS}},
    )


def world_groups(kinds: list[tuple[str, str]]) -> list[str]:
    return [summary for kind, summary in kinds if kind == "run_world_group"]


async def summaries(lab: Lab, handle: Any) -> list[tuple[str, str]]:
    history = await handle.fetch_history()
    return [
        (
            e.activity_task_scheduled_event_attributes.activity_type.name,
            json.loads(e.user_metadata.summary.data) if e.user_metadata.HasField("summary") else "",
        )
        for e in history.events
        if e.HasField("activity_task_scheduled_event_attributes")
    ]


async def test_an_effective_world_stops_early_and_nothing_more_runs(lab: Lab) -> None:
    """boost rescues most episodes: it crosses the first boundary; with it stopped no
    world but the baseline is left, so the baseline stops too and waves 2-4 never run."""
    spec = sequential_spec()
    handle, key = await lab.start(spec, batch_episodes=BATCH)
    view = await lab.approve(handle, key)
    assert view.plan is not None
    # the design is part of the plan the approver signed: its waves fix the chunks
    assert view.plan.capacity.wave_ends == [60, 120, 180, 240]
    assert "in 4 waves (at most)" in view.plan.capacity.reason
    result = await handle.result()
    assert result.status is Status.completed, result.error
    assert result.analysis is not None and result.analysis.valid

    # only wave 1 ran: its two chunks, one sandbox each for both worlds
    kinds = await summaries(lab, handle)
    assert sorted(world_groups(kinds)) == [
        "baseline, boost · episodes 0..29 · attempt 1",
        "baseline, boost · episodes 30..59 · attempt 1",
    ]
    assert [k for k, _ in kinds].count("decide_look") == 1
    report = lab.store.get_json(result.analysis.report_digest)
    seq = report["sequential"]
    (boost,) = seq["worlds"]
    assert (boost["stopped"], boost["episodes"], boost["unspent_episodes"]) == ("efficacy", 60, 180)
    assert boost["verdict"] == "supported"
    assert seq["sequential_world_episodes"] == 120 and seq["fixed_world_episodes"] == 480
    # the unspent budget is reported: by the workflow's ledger and by the report alike
    assert result.budget.unspent_world_episodes == seq["unspent_world_episodes"] == 360
    assert result.budget.unspent_world_seconds > 0
    assert [w.episodes for w in result.worlds] == [60, 60]
    assert [w.status.value for w in result.worlds] == ["stopped", "stopped"]
    assert "every world ran what its sequential design asked" in json.dumps(report["checks"])
    # the status shows the looks so far
    status = await lab.status(handle)
    assert [(w.world, w.decision.value) for w in status.looks[0].worlds] == [("boost", "efficacy")]
    text = render_status(status)
    assert "sequential design: 1 of 4 looks decided" in text
    assert "boost: 60 episodes, rescue" in text and ": efficacy" in text
    assert lab.sandboxes(spec.id) == [] and lab.sandbox_folders() == []


async def test_controls_run_until_decided_and_the_verdicts_are_the_pure_analysis(lab: Lab) -> None:
    """boost stops for efficacy and the positive control once it crosses (look 1), the
    null world for futility (look 2); the placebo never differs, so it and the baseline
    run every episode. The report is the twin's rehearsal of the design on the same
    episodes: every path, p-value, interval and verdict."""
    spec = sequential_spec(
        {"name": "inert", "role": "treatment", "intervention": {"name": "noop"}},
        {"name": "placebo", "role": "placebo", "intervention": {"name": "noop"}},
        {"name": "drag", "role": "positive_control", "intervention": {"name": "drag"}},
    )
    handle, key = await lab.start(spec, batch_episodes=BATCH)
    await lab.approve(handle, key)
    result = await handle.result()
    assert result.status is Status.completed, result.error
    assert result.analysis is not None and result.analysis.valid
    report = lab.store.get_json(result.analysis.report_digest)
    seq = report["sequential"]
    paths = {p["world"]: p for p in seq["worlds"]}
    stops = {w: (p["stopped"], p["episodes"]) for w, p in paths.items()}
    assert stops == {
        "boost": ("efficacy", 60),
        "inert": ("futility", 120),
        "placebo": ("completed", 240),
        "drag": ("efficacy", 60),
    }
    ran = {w.name: w.episodes for w in result.worlds}
    assert ran == {"baseline": 240, "boost": 60, "inert": 120, "placebo": 240, "drag": 60}
    assert sum(ran.values()) == seq["sequential_world_episodes"] < 5 * EPISODES
    assert result.budget.unspent_world_episodes == seq["unspent_world_episodes"] == 480

    twin = json.loads(rehearse(spec).model_dump_json())
    assert seq["worlds"] == twin["sequential"]["worlds"]
    assert seq["design"] == twin["sequential"]["design"]
    assert report["verdicts"] == twin["verdicts"]
    verdicts = {v["world"]: v["verdict"] for v in report["verdicts"]}
    assert verdicts == {
        "boost": "supported",
        "inert": "inconclusive",
        "placebo": "supported",
        "drag": "supported",
    }
    checks = {c["name"]: c for c in report["checks"]}
    assert checks["placebo_fidelity"]["passed"] and checks["positive_control"]["passed"]
    assert checks["common_random_numbers"]["passed"]
    # each look decided only the worlds still running into it
    status = await lab.status(handle)
    looks = [[(w.world, w.decision.value) for w in look.worlds] for look in status.looks]
    assert looks == [
        [
            ("boost", "efficacy"),
            ("inert", "continue"),
            ("placebo", "continue"),
            ("drag", "efficacy"),
        ],
        [("inert", "futility"), ("placebo", "continue")],
        [("placebo", "continue")],
        [("placebo", "completed")],
    ]
    markdown = lab.store.get_bytes(result.analysis.markdown_digest).decode()
    assert (
        "## Sequential design" in markdown and "boost: SUPPORTED, stopped for efficacy" in markdown
    )
    html = lab.store.get_bytes(result.analysis.html_digest).decode()
    assert "<h2>Sequential design</h2>" in html
    assert "boost: SUPPORTED, stopped for efficacy" in html
    assert "<td>futility</td>" in html  # inert's second look
    assert "480 world-episodes (~" in markdown and "after 4 of 4 looks" in markdown


async def test_an_approval_is_bound_to_the_design(lab: Lab) -> None:
    """The design is in the fingerprint: a signature over the same plan with another
    design (here one look more) is refused, and nothing runs."""
    spec = sequential_spec()
    handle, key = await lab.start(spec, batch_episodes=BATCH)
    view = await lab.wait_for(handle, Stage.awaiting_approval)
    assert view.plan is not None
    snap = view.plan.snapshot
    prefixes = view.plan.rehearsal.prefixes
    index = prefixes.index if prefixes else None
    assert plan_fingerprint(spec, snap.code_digest, snap.snapshot_id, index) == snap.fingerprint
    other = spec.model_copy(
        update={
            "analysis": spec.analysis.model_copy(
                update={"sequential": spec.analysis.sequential.model_copy(update={"looks": 5})}  # type: ignore[union-attr]
            )
        }
    )
    changed = plan_fingerprint(other, snap.code_digest, snap.snapshot_id, index)
    assert changed != snap.fingerprint
    attempt = await lab.send(handle, "approve", signed(view, key, "mallory", fingerprint=changed))
    assert not attempt.accepted and "fingerprint" in attempt.reason
    after = await lab.status(handle)
    assert after.stage is Stage.awaiting_approval and after.approval.status.value == "pending"
    assert lab.sandbox_folders() == []
    await handle.cancel()


def five_worlds(**params: Any) -> ExperimentSpec:
    spec = sequential_spec(
        {"name": "inert", "role": "treatment", "intervention": {"name": "noop"}},
        {"name": "placebo", "role": "placebo", "intervention": {"name": "noop"}},
        {"name": "drag", "role": "positive_control", "intervention": {"name": "drag"}},
    )
    if params:
        workload = spec.workload.model_copy(update={"params": params})
        spec = spec.model_copy(update={"workload": workload})
    return spec


async def test_a_chain_continued_as_new_mid_waves_decides_each_look_once(lab: Lab) -> None:
    """A low history limit: the run continues as new between and within waves. The looks
    travel in the carry, so each is decided once, each batch runs once, and the report
    is the twin's; every run of the chain replays."""
    spec = five_worlds()
    key = new_private_key()
    handle = await lab.client.start_workflow(
        ExperimentWorkflow.run,
        ExperimentInput(
            spec=spec,
            approver_public_key=public_key_hex(key),
            batch_episodes=10,  # six chunks a wave
            rehearsal_episodes=0,
            history_events=120,
            workload_bundle=lab.ship(spec),
        ),
        id=workflow_id(spec.id),
        task_queue=lab.settings.task_queue,
        result_type=ExperimentResult,
    )
    await lab.approve(handle, key)
    result = await asyncio.wait_for(handle.result(), timeout=240)
    assert result.status is Status.completed, result.error
    assert result.runs >= 3
    assert result.analysis is not None
    report = lab.store.get_json(result.analysis.report_digest)
    twin = json.loads(rehearse(spec).model_dump_json())
    assert report["sequential"]["worlds"] == twin["sequential"]["worlds"]
    ran = {w.name: w.episodes for w in result.worlds}
    assert ran == {"baseline": 240, "boost": 60, "inert": 120, "placebo": 240, "drag": 60}
    status = await lab.status(handle)
    assert [look.look for look in status.looks] == [1, 2, 3, 4]
    replayer = Replayer(
        workflows=[ExperimentWorkflow],
        data_converter=pydantic_data_converter,
        workflow_runner=workflow_runner(),
    )
    run = handle.first_execution_run_id or ""
    runs = 0
    while run:
        history = await lab.client.get_workflow_handle(handle.id, run_id=run).fetch_history()
        await replayer.replay_workflow(history)
        runs += 1
        last = history.events[-1]
        attrs = last.workflow_execution_continued_as_new_event_attributes
        run = (
            attrs.new_execution_run_id
            if last.HasField("workflow_execution_continued_as_new_event_attributes")
            else ""
        )
    assert runs == result.runs


async def test_a_worker_killed_mid_wave_loses_nothing_and_counts_nothing_twice(
    temporal_env: WorkflowEnvironment, tmp_path: Path, worker_processes: WorkerProcesses
) -> None:
    """A ``forklab worker`` SIGKILLed while wave 2 runs (its sandbox holds the worlds
    still running after look 1) and replaced: the group runs again, each look is decided
    once, every world runs exactly what its design gives it, and the report is the
    twin's."""
    settings = lab_settings(temporal_env, tmp_path / "home")
    env = cli_env(settings)
    lab = Lab(client=temporal_env.client, settings=settings)
    spec = five_worlds(sandbox_sleep=0.04)  # about 1.2 s per chunk of 30
    spec_file = tmp_path / "spec.json"
    spec_file.write_text(spec.model_dump_json())
    log = tmp_path / "worker.log"
    first = worker_processes.start(env, log)
    started = await asyncio.to_thread(
        forklab, env, "start", str(spec_file), "--batch-episodes", "30", "--rehearsal-episodes", "4"
    )
    assert started.returncode == 0, started.stderr
    handle = temporal_env.client.get_workflow_handle(
        workflow_id(spec.id), result_type=ExperimentResult
    )
    await lab.wait_for(handle, Stage.awaiting_approval)
    approved = await asyncio.to_thread(forklab, env, "approve", spec.id)
    assert approved.returncode == 0, approved.stderr

    labels = {"forklab.experiment": spec.id, "forklab.world": "baseline+inert+placebo"}
    for _ in range(1200):
        if lab.backend.list(labels):
            break
        await asyncio.sleep(0.05)
    assert lab.backend.list(labels), "wave 2's sandbox should be running"
    worker_processes.kill(first)
    worker_processes.start(env, log)

    result = await asyncio.wait_for(handle.result(), timeout=180)
    assert result.status is Status.completed, result.error
    ran = {w.name: w.episodes for w in result.worlds}
    assert ran == {"baseline": 240, "boost": 60, "inert": 120, "placebo": 240, "drag": 60}
    kinds = await lab.activity_types(handle)
    assert kinds.count("decide_look") == 4
    status = await lab.status(handle)
    assert [look.look for look in status.looks] == [1, 2, 3, 4]
    shown = await asyncio.to_thread(forklab, env, "status", spec.id)
    assert shown.returncode == 0 and "sequential design: 4 of 4 looks decided" in shown.stdout
    assert result.analysis is not None
    report = lab.store.get_json(result.analysis.report_digest)
    twin = json.loads(rehearse(five_worlds()).model_dump_json())
    assert report["sequential"]["worlds"] == twin["sequential"]["worlds"]
    assert lab.sandboxes(spec.id) == [] and lab.sandbox_folders() == []
