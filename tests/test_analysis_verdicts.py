"""Verdicts claim only what the numbers support; a failed validity check voids them all."""

from __future__ import annotations

import pytest

from forklab.activities.experiment.twin import rehearse_outcomes, twin_held_out
from forklab.cli.experiment.rehearsal import workload_code_digest
from forklab.experiments.experiment.analysis.build import build_report
from forklab.experiments.experiment.analysis.pairs import paired_effect, paired_table
from forklab.experiments.experiment.analysis.verdicts import Verdict, judge
from forklab.experiments.experiment.report.render_html import render_html
from forklab.experiments.experiment.report.render_markdown import render_markdown
from forklab.experiments.experiment.report.render_text import render_text
from forklab.experiments.experiment.results import InfraUsage
from forklab.experiments.experiment.spec import Direction, ExperimentSpec, parse_spec
from tests.helpers import ROOT

RECOVERY = ROOT / "forklab" / "workloads" / "recovery-counter.yaml"


def _table(n11: int, n10: int, n01: int, n00: int) -> tuple[list[bool], list[bool]]:
    pairs = [(True, True)] * n11 + [(True, False)] * n10 + [(False, True)] * n01
    pairs += [(False, False)] * n00
    return [a for a, _ in pairs], [b for _, b in pairs]


@pytest.mark.parametrize(
    "table",
    [
        (40, 10, 14, 36),  # more rescues than harms, but the interval crosses zero
        (142, 83, 75, 0),
        (0, 1, 3, 0),  # tiny n, all but one in the expected direction
    ],
)
def test_interval_crossing_zero_is_inconclusive(table: tuple[int, int, int, int]) -> None:
    effect = paired_effect(paired_table(*_table(*table)))
    assert effect.ci_low < 0 < effect.ci_high
    for expected in (Direction.decrease, Direction.increase):
        # even with the most lenient p, an interval across zero is never a win
        assert judge(effect, 0.0, expected, 0.05) is Verdict.inconclusive


def test_clear_effects_are_supported_or_refuted() -> None:
    effect = paired_effect(paired_table(*_table(50, 0, 40, 10)))
    assert effect.ci_low > 0
    assert judge(effect, effect.mcnemar_p, Direction.decrease, 0.05) is Verdict.supported
    assert judge(effect, effect.mcnemar_p, Direction.increase, 0.05) is Verdict.refuted
    assert judge(effect, effect.mcnemar_p, Direction.none, 0.05) is Verdict.refuted
    # the same interval with a Holm p that is not small enough claims nothing
    assert judge(effect, 0.2, Direction.decrease, 0.05) is Verdict.inconclusive


def test_none_is_supported_only_by_identical_worlds() -> None:
    same = paired_effect(paired_table(*_table(30, 0, 0, 20)))
    assert judge(same, 1.0, Direction.none, 0.05) is Verdict.supported
    close = paired_effect(paired_table(*_table(30, 1, 0, 19)))
    assert judge(close, close.mcnemar_p, Direction.none, 0.05) is Verdict.inconclusive


def _spec() -> ExperimentSpec:
    return parse_spec(RECOVERY.read_text(), str(RECOVERY))


def test_a_failed_validity_check_makes_every_verdict_invalid() -> None:
    spec = _spec()
    outcomes = rehearse_outcomes(spec, workload_code_digest(spec))
    digest = workload_code_digest(spec)
    tampered = outcomes.model_copy(deep=True)
    tampered.worlds[1].code_digest = "0" * 64  # refresh ran other code than the plan's
    report = build_report(spec, tampered, digest, held_out=twin_held_out(1))
    identity = next(c for c in report.checks if c.name == "workload_identity")
    assert not identity.passed and "refresh" in identity.reason
    assert report.valid is False
    assert {v.verdict for v in report.verdicts} == {Verdict.invalid}
    assert render_text(report).endswith("INVALID: a validity check failed")
    assert "The verdicts above are void" in render_markdown(report)
    page = render_html(report)
    assert "Invalid: workload_identity failed; the effects below are not evidence." in page
    assert "Hypothesis not judged: the experiment is invalid." in page
    # the untampered outcomes give real verdicts
    clean = build_report(spec, outcomes, digest, held_out=twin_held_out(1))
    assert clean.valid and Verdict.invalid not in {v.verdict for v in clean.verdicts}


def test_infrastructure_fit_reads_the_durable_usage() -> None:
    spec = _spec()
    outcomes = rehearse_outcomes(spec, workload_code_digest(spec))
    digest = workload_code_digest(spec)
    fine = InfraUsage(
        world_seconds_budget=600,
        world_seconds_spent=12.5,
        max_concurrent_sandboxes=2,
        peak_concurrent_sandboxes=2,
    )
    report = build_report(spec, outcomes, digest, fine, held_out=twin_held_out(1))
    check = next(c for c in report.checks if c.name == "infrastructure_fit")
    assert check.passed and "12.5 of 600.0" in check.reason
    over = fine.model_copy(update={"world_seconds_spent": 601.0, "sandboxes_left": 1})
    report = build_report(spec, outcomes, digest, over, held_out=twin_held_out(1))
    check = next(c for c in report.checks if c.name == "infrastructure_fit")
    assert not check.passed
    assert "601.0 of a 600.0" in check.reason and "1 sandboxes left" in check.reason
    assert report.valid is False


def test_snapshot_provenance_must_be_common() -> None:
    spec = _spec()
    outcomes = rehearse_outcomes(spec, workload_code_digest(spec))
    mixed = outcomes.model_copy(deep=True)
    mixed.worlds[2].snapshot = "another-image"
    report = build_report(spec, mixed, workload_code_digest(spec), held_out=twin_held_out(1))
    check = next(c for c in report.checks if c.name == "common_snapshot")
    assert not check.passed and "another-image" in check.reason


def test_a_partial_world_is_reported_not_crashed_on() -> None:
    spec = _spec()
    outcomes = rehearse_outcomes(spec, workload_code_digest(spec))
    partial = outcomes.model_copy(deep=True)
    w = partial.worlds[1]
    w.outcomes, w.intervened, w.shocks, w.inherited = (
        w.outcomes[:200],
        w.intervened[:200],
        w.shocks[:200],
        w.inherited[:200],
    )
    report = build_report(spec, partial, workload_code_digest(spec), held_out=twin_held_out(1))
    completion = next(c for c in report.checks if c.name == "completion")
    assert (
        not completion.passed and "refresh" in completion.reason and "200/300" in completion.reason
    )
    assert [c.world for c in report.comparisons] == ["null-refresh"]
    assert report.valid is False and report.guard is None
