"""The Braintrust scores of a world are its part of the experiment's validity checks: a
placebo's and a positive control's score agrees with the experiment's check whatever the
other checks say, and a treatment claims an effect only in a valid experiment."""

from __future__ import annotations

from pathlib import Path

from forklab.cli.experiment.rehearsal import rehearse
from forklab.cli.experiment.specfile import load_spec
from forklab.experiments.experiment.evidence_scores import experiment_scores, world_scores
from forklab.experiments.experiment.spec import Direction, ExperimentSpec

ROOT = Path(__file__).resolve().parent.parent


def _spec(**expected: Direction) -> ExperimentSpec:
    spec = load_spec(str(ROOT / "forklab" / "workloads" / "retry-cascade.yaml"))
    hypothesis = spec.hypothesis.model_copy(
        update={"expected": {**spec.hypothesis.expected, **expected}}
    )
    return spec.model_copy(update={"episodes": 300, "hypothesis": hypothesis})


def test_world_scores_agree_with_the_experiments_checks() -> None:
    report = rehearse(_spec())
    root = experiment_scores(report)
    assert report.valid and root["positive_control_direction"] == root["placebo_fidelity"] == 1
    assert world_scores(report, "latency", {})["positive_control_direction"] == 1.0
    assert world_scores(report, "placebo", {})["placebo_fidelity"] == 1.0
    assert world_scores(report, "broadcast", {})["intervention_effect"] == 1.0


def test_a_control_that_moves_the_wrong_way_scores_zero_and_only_it() -> None:
    report = rehearse(_spec(latency=Direction.decrease))  # latency raises failures
    root = experiment_scores(report)
    assert not report.valid and root["positive_control_direction"] == 0.0
    assert world_scores(report, "latency", {})["positive_control_direction"] == 0.0
    # the placebo still held; the invalid run claims no effect for any treatment
    assert world_scores(report, "placebo", {})["placebo_fidelity"] == root["placebo_fidelity"]
    assert root["placebo_fidelity"] == 1.0
    assert world_scores(report, "broadcast", {})["intervention_effect"] == 0.0
    assert root["intervention_effect"] == 0.0
