"""Experiments over a cohort with the user's own scorer and feature function (run in
boxes from the bundle shipped through the artifact store), slices and a guard policy by
those features, and ``override`` worlds, on a real dev server with real forks of the
research pipeline against the local stand-in over HTTP.

Checked: the features of every run are read at the rehearsal, signed in the plan and
slice the report, whose guard is learned and validated on held-out runs; a world that
overrides the decisive step's result never does worse than the baseline fork for fork
(the seeds line up after the fork point); one that overrides its input runs it live
with the new input; a hostile scorer is refused before approval with its sentence and
nothing is forked; a scorer that breaks its contract only on forks stops the experiment
with its sentence and leaves no fork running."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from agent_fixtures import AgentTestLab
from cohort_lab import CohortLab, cohort_spec, running_cohort_lab
from cohort_user_code import ship_package
from temporalio.client import WorkflowFailureError

from forklab.contracts.cohort import cohort_fork_id
from forklab.workflows.experiment.messages import Status

FULL = (
    "Recommendations: adopt durable execution for every long-running workflow, measure "
    "the retries, and review the results each quarter with the team."
)


@pytest.fixture
async def cohort(agent_lab: AgentTestLab, tmp_path: Path) -> AsyncIterator[CohortLab]:
    async with running_cohort_lab(agent_lab, tmp_path) as lab:
        yield lab


async def test_user_code_slices_a_guard_and_override_worlds(
    cohort: CohortLab, tmp_path: Path
) -> None:
    # `fast` at temperature 1 writes thin recommendations (step 5) most of the time
    ids = await cohort.record(["fast"] * 6)
    bundle = ship_package(cohort.store, tmp_path / "src")
    spec = cohort_spec(
        {
            "workflow_ids": ids,
            "limit": 6,
            "fork_at": "step:4",  # research, insights, risks, charge inherited
            "outcome": "usercode.scoring:resolved",
            "features": "usercode.scoring:features",
        },
        [
            {
                "name": "fixed",
                "role": "treatment",
                "override": {"part": "result", "value": {"content": FULL, "model": "fast"}},
            },
            {
                "name": "asked",
                "role": "treatment",
                "override": {
                    "part": "input",
                    "value": {
                        "model": "candidate",
                        "messages": [{"role": "user", "content": "STEP: recommendations"}],
                        "temperature": 1.0,
                    },
                },
            },
        ],
        analysis={"guard": {"world": "fixed"}},
    )
    handle = await cohort.start(spec, code_bundle=bundle)
    await cohort.approve(handle)
    result = await handle.result()
    assert result.status is Status.completed, result.error
    assert result.forks_done == 6 * 3 * 3 and result.forks_missing == 0
    report = result.report
    assert report is not None
    saved = json.loads((Path(report.report_dir) / "report.json").read_text())

    # the features, read in a box at the rehearsal, are in the signed plan
    for run in saved["runs"]:
        assert run["features"] == {
            "steps_before": 4,
            "last_failed": False,
            "tool": "chat_model (fast)",
            "tool_calls": 1,
        }
    # the result override: the fork inherits the decisive step with the given answer
    run_key = f"{handle.id}/{handle.result_run_id}"
    fixed = cohort.registry.receipt(cohort_fork_id(run_key, 0, "fixed", 0))
    assert fixed is not None and fixed.result_override is not None
    assert fixed.result_override.step == 5 and fixed.result_override.value["content"] == FULL
    asked = cohort.registry.receipt(cohort_fork_id(run_key, 0, "asked", 0))
    assert asked is not None and asked.input_override is not None
    assert asked.input_override.step == 5
    assert asked.input_override.value["model"] == "candidate"
    # seeds line up after the fork point: the good section never makes a fork worse
    outcomes = saved["outcomes"]
    for base_row, fixed_row in zip(outcomes["baseline"], outcomes["fixed"], strict=True):
        assert all(f >= b for b, f in zip(base_row, fixed_row, strict=True))
    lines = {w.world: w for w in report.worlds}
    assert lines["fixed"].harms == 0 and lines["asked"].harms == 0

    text = cohort.markdown(report)
    assert "- fixed (treatment): override the decisive step's result with {" in text
    assert "- asked (treatment): override the decisive step's input with {" in text
    assert "## Slices by the pre-decision features" in text
    assert "| fixed | steps_before | 4 | 6 |" in text
    assert report.guard is not None and report.guard.world == "fixed"
    assert "## Guard policy for fixed" in text and "Held-out validation: the rule" in text
    held = report.guard.held_out_before.runs
    assert held == 2 and report.guard.training_before.runs == 4  # 30% of 6 runs
    assert saved["slices"]["fixed"][0]["feature"] == "last_failed"


async def test_a_hostile_scorer_is_refused_before_approval(
    cohort: CohortLab, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FORKLAB_TEST_SECRET", "x")  # in the worker's environment
    ids = await cohort.record(["slow"])
    bundle = ship_package(cohort.store, tmp_path / "src")
    spec = cohort_spec(
        {"workflow_ids": ids, "limit": 1, "outcome": "usercode.scoring:reads_env"},
        [{"name": "bigger", "role": "treatment", "model": "candidate"}],
    )
    handle = await cohort.start(spec, code_bundle=bundle)
    with pytest.raises(WorkflowFailureError) as failed:
        await handle.result()
    cause = str(failed.value.cause)
    assert (
        "cohort.outcome usercode.scoring:reads_env raised KeyError: 'FORKLAB_TEST_SECRET' "
        "at usercode/scoring.py:"
    ) in cause
    assert f"(recorded run {ids[0]})" in cause
    assert cohort.registry.children(ids[0]) == []


async def test_a_scorer_breaking_its_contract_on_forks_stops_the_experiment(
    cohort: CohortLab, tmp_path: Path
) -> None:
    ids = await cohort.record(["slow", "slow"])
    bundle = ship_package(cohort.store, tmp_path / "src")
    spec = cohort_spec(
        {"workflow_ids": ids, "limit": 2, "outcome": "usercode.scoring:breaks_on_forks"},
        [{"name": "bigger", "role": "treatment", "model": "candidate"}],
    )
    handle = await cohort.start(spec, code_bundle=bundle)
    await cohort.approve(handle)  # the recorded runs score honestly at the rehearsal
    result = await handle.result()
    assert result.status is Status.failed and result.report is None
    assert result.error is not None
    assert "cohort.outcome usercode.scoring:breaks_on_forks returned float nan" in result.error
    assert ", world " in result.error and ", fork " in result.error
    assert result.cleanup is not None and result.cleanup.remaining == 0
    row = cohort.ledger.experiment(spec.id)
    assert row is not None and row.status == "failed" and row.error == result.error
