"""A pre-registered sequential design over a cohort, durably, on a real dev server with real
forks of the shipped research pipeline: the forks run in waves of runs (the design's
seeded order); a world with a big effect (a model-provider outage) stops for efficacy at
its first look and starts no more forks — counted in Temporal, not in the workflow's own
tally; an inert treatment stops (or runs on) as the design's rules say on its counts; the
report shows each world's path; and a design whose looks cross continue-as-new carries
them (each look decided once), with early-stopping votes composed."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from agent_fixtures import AgentTestLab
from cohort_lab import CohortLab, cohort_spec, running_cohort_lab
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Replayer

from forklab.cli.experiment.cohort_commands import render_status
from forklab.experiments.cohort.sequential import cohort_design, world_paths_at
from forklab.experiments.cohort.waves import run_order
from forklab.experiments.experiment.waves import Decision
from forklab.workers.experiment.worker import workflow_runner
from forklab.workflows.experiment.cohort_workflow import CohortExperimentWorkflow
from forklab.workflows.experiment.messages import Stage, Status


@pytest.fixture
async def cohort(agent_lab: AgentTestLab, tmp_path: Path) -> AsyncIterator[CohortLab]:
    async with running_cohort_lab(agent_lab, tmp_path) as lab:
        yield lab


async def _started_forks(lab: CohortLab, run_key: str) -> list[str]:
    return [e.id async for e in lab.client.list_workflows(f"ForkLabExperiment = '{run_key}'")]


async def test_a_big_effect_stops_for_efficacy_and_starts_no_more_forks(cohort: CohortLab) -> None:
    ids = await cohort.record(["slow"] * 16)
    spec = cohort_spec(
        {"workflow_ids": ids, "limit": 16},
        [
            {"name": "noop", "role": "treatment", "prompt_patch": {"text": "Be yourself."}},
            {"name": "outage", "role": "treatment", "faults": [{"kind": "brownout", "rate": 1.0}]},
            {"name": "same", "role": "placebo", "prompt_patch": {"text": "Be yourself."}},
        ],
        hypothesis={
            "text": "an outage fails runs; a no-op instruction rescues none",
            "expected": {"outage": "increase", "noop": "decrease"},
        },
        analysis={"sequential": {"looks": 2, "spending": "pocock"}},
    )
    handle = await cohort.start(spec)
    shown = await cohort.until_stage(handle, Stage.awaiting_approval)
    # the approver sees the design over the plan's runs and the compute it should save
    assert shown.design is not None and shown.design.wave_ends == [8, 16]
    assert 0.0 <= shown.design.saved_if_inert <= shown.design.saved_if_inert_high <= 1.0
    assert "expected compute saved: " in render_status(shown)
    await cohort.approve(handle)
    result = await handle.result()
    assert result.status is Status.completed, result.error

    view = await cohort.status(handle)
    first, second = view.looks
    decided = {w.world: w for w in first.worlds}
    assert decided["outage"].decision is Decision.efficacy
    assert decided["outage"].harm >= 5 and decided["outage"].statistic <= -2.157
    # the inert treatment's decision is the design's own rule on its counts (futility)
    design = cohort_design(spec, 16)
    assert design is not None
    noop = decided["noop"]
    (path,) = world_paths_at(spec, design, {"noop": ([noop.rescue], [noop.harm])})
    assert noop.decision is path.looks[-1].decision is Decision.futility
    # the placebo's check is "inside the noise floor": it runs every wave, with the baseline
    assert decided["same"].decision is Decision.continue_
    assert [(w.world, w.decision) for w in second.worlds] == [("same", Decision.completed)]

    # forks actually started in Temporal: the stopped worlds' forks of the first wave's
    # runs only; the baseline's and the placebo's of every run
    run_key = f"{handle.id}/{handle.result_run_id}"
    started = await _started_forks(cohort, run_key)
    assert len(started) == len(set(started)) == 8 * 4 * 3 + 8 * 2 * 3 == result.forks_done
    wave = set(run_order(spec.seed, 16)[:8])
    rows = cohort.ledger.forks(spec.id, handle.result_run_id or "")
    assert len(rows) == 144
    for world in ("noop", "outage"):
        assert {r.run_index for r in rows if r.world == world} == wave
    for world in ("baseline", "same"):
        assert {r.run_index for r in rows if r.world == world} == set(range(16))
    assert result.forks_unspent == 8 * 2 * 3

    report = result.report
    assert report is not None and report.unspent_forks == 48
    paths = {d.world: d for d in report.design}
    assert paths["outage"].stopped is Decision.efficacy and paths["outage"].runs == 8
    assert paths["outage"].verdict == "harms" and paths["outage"].as_expected
    assert paths["outage"].unspent_forks == 24 and paths["outage"].unspent_seconds > 0
    assert [(x.look, x.decision) for x in paths["outage"].looks] == [(1, Decision.efficacy)]
    assert paths["noop"].stopped is Decision.futility
    assert paths["noop"].verdict == "inside_noise_floor"
    assert paths["same"].stopped is Decision.completed and paths["same"].unspent_forks == 0
    lines = {w.world: w for w in report.worlds}
    assert lines["outage"].verdict == "harms" and "sequential design" in lines["outage"].text
    markdown = cohort.markdown(report)
    assert "## Sequential design" in markdown
    assert "| outage | 1 | 8 |" in markdown and "| efficacy |" in markdown
    # the history replays on the code as it is (its waves, looks and unspent forks)
    await Replayer(
        workflows=[CohortExperimentWorkflow],
        data_converter=pydantic_data_converter,
        workflow_runner=workflow_runner(),
    ).replay_workflow(await handle.fetch_history())


async def test_waves_cross_continue_as_new_with_their_looks(cohort: CohortLab) -> None:
    """A placebo runs every wave (an inert change stops only by crossing a boundary); the
    looks travel in the carry: each is decided once, whichever run of the chain decided
    it; votes that stop once decided compose with the waves."""
    ids = await cohort.record(["slow"] * 6)
    spec = cohort_spec(
        {"workflow_ids": ids, "limit": 6, "stop_when_decided": True},
        [{"name": "noop", "role": "placebo", "prompt_patch": {"text": "Be yourself."}}],
        budget={"max_forks": 100, "max_concurrent_forks": 4},
        analysis={"sequential": {"looks": 3}},
    )
    handle = await cohort.start(spec, history_events=100)
    await cohort.approve(handle)
    result = await handle.result()
    assert result.status is Status.completed, result.error
    assert result.runs_of_chain > 2  # the history limit made it continue as new
    view = await cohort.status(handle)
    assert [look.look for look in view.looks] == [1, 2, 3]
    assert all(w.decision is not Decision.check_decided for look in view.looks for w in look.worlds)
    assert result.forks_unspent == 0
    assert result.forks_done + result.forks_saved == 6 * 2 * 3 and result.forks_missing == 0
    run_key = f"{handle.id}/{handle.result_run_id}"
    started = await _started_forks(cohort, run_key)
    assert len(started) == len(set(started)) == result.forks_done
    report = result.report
    assert report is not None
    (path,) = report.design
    assert [x.look for x in path.looks] == [1, 2, 3] and path.runs == 6
    assert path.stopped is Decision.completed and path.verdict == "inside_noise_floor"
    lengths = [
        e.history_length async for e in cohort.client.list_workflows(f"WorkflowId = '{handle.id}'")
    ]
    assert len(lengths) == result.runs_of_chain and max(lengths) < 100, lengths
