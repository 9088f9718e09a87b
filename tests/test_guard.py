"""Guard policies: learned from slices within the harm cap, run by the real runner."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from forklab.activities.experiment.runner_bundle import bundle_files
from forklab.activities.experiment.twin import run_twin, twin_held_out
from forklab.activities.sandbox.workload_calls import (
    WorkloadCallError,
    WorkloadCalls,
    _held_out_batch,
)
from forklab.cli.experiment.rehearsal import rehearse, workload_code_digest
from forklab.experiments.experiment.analysis.guard import (
    GuardCounts,
    GuardEvaluation,
    guarded_outcomes,
    held_out_validation,
    learn_rule,
    rule_words,
    validate_guard,
)
from forklab.experiments.experiment.analysis.held_out_plan import DEFAULT_HOLDOUT_CAP, holdout_size
from forklab.experiments.experiment.analysis.slices import (
    MAX_CATEGORIES,
    Dimension,
    SliceEffect,
    dimensions,
    slice_effects,
)
from forklab.experiments.experiment.report.render_html import render_html
from forklab.experiments.experiment.report.render_markdown import render_markdown
from forklab.experiments.experiment.report.render_text import render_text
from forklab.experiments.experiment.spec import ExperimentSpec, parse_spec
from forklab.experiments.experiment.worlds import world_plan
from forklab.runtime.file_format import WorldPlan
from forklab.runtime.runner import rule_fires, run_batch
from forklab.runtime.workload import Feature
from forklab.workloads.counter_recovery import CounterRecovery
from tests.helpers import ROOT, restart_spec

RECOVERY = ROOT / "forklab" / "workloads" / "recovery-counter.yaml"


def _slice(value: str, rescue: int, harm: int) -> SliceEffect:
    return SliceEffect(
        feature="kind",
        value=value,
        rescue=rescue,
        harm=harm,
        unchanged=10,
        net=rescue - harm,
        n=rescue + harm + 10,
        difference=0.0,
        ci_low=-1.0,
        ci_high=1.0,
        clause={"kind": {"eq": value}},
    )


SLICES = [_slice("a", 9, 4), _slice("b", 5, 0), _slice("c", 3, 3), _slice("d", 2, 6)]


def test_default_cap_takes_every_slice_without_more_harms_than_rescues() -> None:
    basis, clauses, chosen = learn_rule([SLICES], None)
    assert basis == "kind"
    assert [s.value for s in chosen] == ["a", "b", "c"]
    assert clauses == [{"kind": {"eq": v}} for v in "abc"]


def test_harm_cap_is_an_exact_knapsack() -> None:
    assert [s.value for s in learn_rule([SLICES], 0)[2]] == ["b"]
    assert [s.value for s in learn_rule([SLICES], 3)[2]] == ["b", "c"]
    assert [s.value for s in learn_rule([SLICES], 4)[2]] == ["a", "b"]
    assert [s.value for s in learn_rule([SLICES], 7)[2]] == ["a", "b", "c"]


def test_no_paying_slice_means_never_intervene() -> None:
    basis, clauses, chosen = learn_rule([[_slice("d", 0, 6)]], None)
    assert (basis, clauses, chosen) == ("", [], [])
    assert rule_fires({"any": clauses}, {"kind": "d"}) is False
    assert rule_words("refresh", clauses, None).startswith("never apply refresh")


def test_adjacent_numeric_bins_merge_into_one_range_the_runner_understands() -> None:
    values = list(range(20))
    features = [{"depth": v} for v in values]
    dim = dimensions(features, 4)["depth"]
    assert isinstance(dim, Dimension) and dim.edges == (5.0, 10.0, 15.0)
    # the world rescues every episode with depth ≥ 5 and harms the shallow ones
    reference = [v < 5 for v in values]
    world = [v >= 5 for v in values]
    slices = slice_effects(reference, world, features, [dim])
    assert [s.value for s in slices] == ["0..4", "5..9", "10..14", "15..19"]  # the integers held
    _, clauses, _ = learn_rule([slices], 0)
    assert clauses == [{"depth": {"ge": 5.0}}]
    rule = {"any": clauses}
    assert [rule_fires(rule, f) for f in features] == world
    assert rule_fires(rule, {"depth": 1e9})  # values never seen in training still fall in a bin
    assert rule_words("broadcast", clauses, 0) == "apply broadcast only when depth ≥ 5"


def test_counter_recovery_rule_removes_held_out_harms_with_harm_cap_zero() -> None:
    text = RECOVERY.read_text() + "  guard: {harm_cap: 0, holdout_episodes: 200}\n"
    report = rehearse(parse_spec(text, "capped"))
    guard = report.guard
    assert guard is not None
    assert guard.rule == {"any": [{"obs_repeated": {"eq": True}}]}
    assert guard.words == "apply refresh only when obs_repeated is true"
    assert guard.training.after.harm == 0
    held = guard.held_out
    assert (held.first_episode, held.last_episode) == (300, 499)
    assert held.before.harm > 0 and held.after.harm == 0
    assert held.after.rescue == held.before.rescue
    assert held.after.intervened < held.before.intervened == 200


def test_equal_rescues_prefer_the_rule_that_intervenes_less() -> None:
    wide = [_slice("a", 4, 0).model_copy(update={"feature": "wide", "n": 90})]
    narrow = [_slice("a", 4, 0).model_copy(update={"feature": "narrow", "n": 20})]
    narrow.append(_slice("b", 0, 2).model_copy(update={"feature": "narrow", "n": 70}))
    basis, _, chosen = learn_rule([wide, narrow], None)
    assert basis == "narrow" and sum(s.n for s in chosen) == 20


def _evaluation(always: int, guarded: int) -> GuardEvaluation:
    def counts(net: int) -> GuardCounts:
        rescue, harm = max(net, 0) + 5, 5 - min(net, 0)
        return GuardCounts(episodes=100, intervened=50, rescue=rescue, harm=harm, net=net)

    return GuardEvaluation(
        first_episode=300, last_episode=399, before=counts(always), after=counts(guarded)
    )


def test_a_rule_below_always_or_never_does_not_validate_in_words_and_verdicts() -> None:
    assert held_out_validation(_evaluation(always=7, guarded=3)) == (
        False,
        "the rule did not validate: on held-out episodes 300..399 its net +3 is below "
        "always applying it (+7)",
    )
    assert held_out_validation(_evaluation(always=-9, guarded=-2)) == (
        False,
        "the rule did not validate: on held-out episodes 300..399 its net -2 is below "
        "never applying it (+0)",
    )
    assert held_out_validation(_evaluation(always=1, guarded=-2))[1].endswith(
        "its net -2 is below always applying it (+1) and never applying it (+0)"
    )
    assert held_out_validation(_evaluation(always=2, guarded=2))[0] is True
    # The report says so in words and in the verdict table, in every rendering.
    report = rehearse(parse_spec(RECOVERY.read_text(), "recovery"))
    assert report.guard is not None and report.guard.validated
    held = _evaluation(always=7, guarded=3)
    validated, why = held_out_validation(held)
    bad = report.model_copy(
        update={
            "guard": report.guard.model_copy(
                update={"held_out": held, "validated": validated, "validation": why}
            )
        }
    )
    assert f"  guard policy for refresh: NOT VALIDATED ({why})" in render_text(bad)
    row = (
        f"| guard on refresh | guard policy | beats always and never | **not validated** | {why} |"
    )
    assert row in render_markdown(bad)
    badge = f'<span class="badge refuted">not validated</span></td><td>{why}</td>'
    assert badge in render_html(bad)


@pytest.mark.parametrize(
    ("workload", "params", "treatment", "rule", "forks"),
    [
        ("counter-recovery", {}, "refresh", {"any": [{"obs_repeated": {"eq": True}}]}, 1),
        (
            "counter-recovery",
            {"noise": 0.2},
            "refresh",
            {"any": [{"obs_repeated": {"eq": True}}]},
            3,
        ),
        (
            "retry-cascade",
            {},
            "restart",
            {"any": [{"queue_depth": {"ge": 1}}, {"upstream": {"eq": "healthy"}}]},
            1,
        ),
    ],
)
def test_the_derived_guarded_world_is_the_simulated_one(
    workload: str, params: dict[str, Any], treatment: str, rule: dict[str, Any], forks: int
) -> None:
    """Deriving the guarded world (treatment where the rule fires, baseline elsewhere)
    gives exactly what running it gives, outcome and intervention, episode by episode."""
    spec = ExperimentSpec.model_validate(
        {
            "id": "derive",
            "hypothesis": {"text": "h"},
            "seed": 3,
            "episodes": 300,
            "workload": {"name": workload, "params": params},
            "worlds": [
                {"name": "baseline", "role": "baseline"},
                {"name": treatment, "role": "treatment", "intervention": {"name": treatment}},
            ],
        }
    )
    plans = [
        world_plan(spec.worlds[0], forks),
        world_plan(spec.worlds[1], forks),
        world_plan(spec.worlds[1], forks, guard=rule, name="guarded"),
    ]
    batch = run_twin(spec, worlds=plans, processes=1).batch
    cols = batch["worlds"]
    derived = guarded_outcomes(
        rule,
        batch["features"],
        cols["baseline"]["outcomes"],
        cols[treatment]["outcomes"],
        cols[treatment]["intervened"],
    )
    assert derived[0].tolist() == cols["guarded"]["outcomes"].tolist()
    assert derived[1].tolist() == cols["guarded"]["intervened"].tolist()
    fired = int(derived[1].sum())
    assert 0 < fired < 300  # the rule splits the episodes, so both branches are checked
    for other in (cols[treatment]["outcomes"], cols["baseline"]["outcomes"]):
        assert derived[0].tolist() != other.tolist()


def test_held_out_episodes_are_capped_by_default() -> None:
    spec = parse_spec(RECOVERY.read_text(), str(RECOVERY))
    assert holdout_size(spec) == spec.episodes == 300
    big = spec.model_copy(update={"episodes": 2_000_000})
    assert holdout_size(big) == DEFAULT_HOLDOUT_CAP
    chosen = big.analysis.guard.model_copy(update={"holdout_episodes": 50_000})
    asked = big.model_copy(update={"analysis": big.analysis.model_copy(update={"guard": chosen})})
    assert holdout_size(asked) == 50_000


def test_the_durable_guard_runs_two_worlds_in_its_box_and_equals_the_twin(
    tmp_path: Path,
) -> None:
    """The sandboxed held-out check (the durable path) runs baseline and treatment only,
    answers the features with them, and derives the guarded world as the twin does."""
    spec = restart_spec("durable-guard", 5, 100)
    rule = {"any": [{"queue_depth": {"ge": 1}}, {"upstream": {"eq": "healthy"}}]}
    calls = WorkloadCalls(tmp_path / "calls")
    in_box = calls.held_out_runner(bundle_files(spec.workload.name), workload_code_digest(spec))
    asked: list[list[str]] = []

    def sandboxed(spec: ExperimentSpec, episodes: Sequence[int], plans: Sequence[WorldPlan]) -> Any:
        asked.append([p.name for p in plans])
        return in_box(spec, episodes, plans)

    twin = validate_guard(spec, spec.worlds[1], rule, 150, twin_held_out(1))
    durable = validate_guard(spec, spec.worlds[1], rule, 150, sandboxed)
    assert asked == [["baseline", "restart"]]
    assert durable == twin
    assert 0 < twin.after.intervened < twin.before.intervened  # the rule splits the episodes
    assert twin.after != twin.before


def test_a_held_out_box_that_answers_no_features_is_refused(tmp_path: Path) -> None:
    answer = dict(run_batch(CounterRecovery({}), 0, range(4), [WorldPlan("baseline")]))
    assert _held_out_batch(answer, ["baseline"], [0, 1, 2, 3])["episodes"] == [0, 1, 2, 3]
    for broken, why in (
        ({**answer, "features": []}, "features are not 4 entries"),
        ({**answer, "features": [{"x": [1]}] * 4}, "other than feature values"),
        ({**answer, "episodes": [0, 1, 2, 5]}, "the episodes asked"),
    ):
        with pytest.raises(WorkloadCallError, match=why):
            _held_out_batch(broken, ["baseline"], [0, 1, 2, 3])


def test_a_string_feature_past_the_cap_folds_its_rare_values_into_other() -> None:
    """An id-like feature (a distinct value per episode) made a slice per episode: each
    one episode, nothing to learn from, and a report (charts above all) that grew with
    the episodes. Past MAX_CATEGORIES values the commonest keep their slice and the rest
    are one slice, "other", whose clause the runner understands."""
    common = [f"c{k}" for k in range(MAX_CATEGORIES - 1)]
    tags = [common[i % len(common)] for i in range(400)] + [f"id{i}" for i in range(300)]
    features: list[dict[str, Feature]] = [{"tag": t} for t in tags] + [{"tag": None}] * 5
    dim = dimensions(features, 4)["tag"]
    assert dim.kept == tuple(sorted(common)) and dim.folded == 300
    # the world rescues the rare ones only
    reference = [False] * len(features)
    world = [t is not None and t.startswith("id") for t in (f["tag"] for f in features)]
    slices = slice_effects(reference, world, features, [dim])
    assert len(slices) == MAX_CATEGORIES + 1  # the kept values, other, missing
    other = next(s for s in slices if s.value == "other (300 values)")
    assert (other.n, other.rescue, other.harm) == (300, 300, 0)
    assert [s.value for s in slices][-2:] == ["other (300 values)", None]
    assert sum(s.n for s in slices) == len(features)
    # every episode is selected by exactly one slice's clause
    for f in features:
        assert sum(rule_fires({"any": [s.clause]}, f) for s in slices) == 1
    _, clauses, chosen = learn_rule([slices], 0)
    assert chosen == [other]
    rule = {"any": clauses}
    assert [rule_fires(rule, f) for f in features] == world
    assert rule_fires(rule, {"tag": "never-seen"})  # a new value is "other" too
    assert not rule_fires(rule, {"tag": None})  # a missing value is not
    words = rule_words("retry", clauses, 0)
    assert words.startswith("apply retry only when tag is none of c0, c1,")


def test_a_string_feature_at_the_cap_keeps_a_slice_per_value() -> None:
    features: list[dict[str, Feature]] = [{"tag": f"v{k}"} for k in range(MAX_CATEGORIES)] * 2
    dim = dimensions(features, 4)["tag"]
    assert dim.kept is None
    slices = slice_effects([False] * len(features), [True] * len(features), features, [dim])
    assert len(slices) == MAX_CATEGORIES and all(s.n == 2 for s in slices)


def test_the_kept_values_are_the_commonest_ties_in_slice_order() -> None:
    counts = {f"v{k:02d}": 1 + (k % 3) for k in range(MAX_CATEGORIES + 5)}
    features: list[dict[str, Feature]] = [{"tag": v} for v, n in counts.items() for _ in range(n)]
    dim = dimensions(features, 4)["tag"]
    ranked = sorted(counts, key=lambda v: (-counts[v], v))[: MAX_CATEGORIES - 1]
    assert dim.kept == tuple(sorted(ranked)) and dim.folded == 6
