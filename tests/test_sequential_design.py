"""The sequential design: spec block, boundaries, per-look decisions, p-values, paths."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import yaml
from pydantic import ValidationError
from scipy.stats import norm
from temporalio.api.common.v1 import Payload
from temporalio.contrib.pydantic import pydantic_data_converter

from forklab.experiments.experiment.analysis.verdicts import Verdict
from forklab.experiments.experiment.sequential import (
    Decision,
    Rule,
    Stop,
    decide,
    design_for,
    make_design,
    sequential_report,
)
from forklab.experiments.experiment.sequential_bounds import (
    efficacy_bounds,
    exit_probabilities,
    stagewise_p,
)
from forklab.experiments.experiment.spec import Sequential, Spending, parse_spec
from forklab.workflows.experiment.messages import ExperimentInput
from tests.helpers import ROOT, run_cli

GOOD = yaml.safe_load((ROOT / "forklab" / "workloads" / "recovery-counter.yaml").read_text())
FIVE = [0.2, 0.4, 0.6, 0.8, 1.0]


def spec_with(sequential: object, **changes: object) -> dict[str, object]:
    data = yaml.safe_load(yaml.safe_dump(GOOD))
    data.update(changes)
    data["analysis"]["sequential"] = sequential
    return data


def test_obrien_fleming_bounds_match_the_published_table() -> None:
    # DeMets & Lan (1994), Jennison & Turnbull table 2.7: K = 5, two-sided α = 0.05.
    bounds = efficacy_bounds(FIVE, 0.05, Spending.obrien_fleming)
    assert bounds == pytest.approx([4.877, 3.357, 2.680, 2.290, 2.031], abs=2e-3)


@pytest.mark.parametrize("spending", list(Spending))
@pytest.mark.parametrize("fractions", [FIVE, [0.1, 0.5, 1.0], [0.3, 0.35, 0.9, 1.0]])
def test_the_design_spends_exactly_alpha(spending: Spending, fractions: list[float]) -> None:
    bounds = efficacy_bounds(fractions, 0.05, spending)
    up, down = exit_probabilities(fractions, bounds, 0.0)
    assert up.sum() + down.sum() == pytest.approx(0.05, abs=1e-9)
    assert up == pytest.approx(down)  # symmetric


def test_exit_probabilities_agree_with_brownian_motion_simulation() -> None:
    rng = np.random.default_rng(7)
    bounds = efficacy_bounds(FIVE, 0.05, Spending.pocock)
    theta = 2.5
    steps = rng.normal(theta * 0.2, np.sqrt(0.2), size=(200_000, 5))
    z = np.cumsum(steps, axis=1) / np.sqrt(FIVE)
    crossed = (np.abs(z) >= bounds).any(axis=1).mean()
    up, down = exit_probabilities(FIVE, bounds, theta)
    assert crossed == pytest.approx(up.sum() + down.sum(), abs=0.004)


def test_stagewise_p_is_uniform_under_the_null() -> None:
    bounds = efficacy_bounds(FIVE, 0.05, Spending.obrien_fleming)
    rng = np.random.default_rng(3)
    z = np.cumsum(rng.normal(0, np.sqrt(0.2), size=(4000, 5)), axis=1) / np.sqrt(FIVE)
    crossed = np.abs(z) >= bounds
    look = np.where(crossed.any(axis=1), crossed.argmax(axis=1), 4)
    p = np.array([stagewise_p(FIVE, bounds, k, z[i, k]) for i, k in enumerate(look)])
    for u in (0.01, 0.05, 0.2, 0.5):
        assert (p <= u).mean() == pytest.approx(u, abs=3 * np.sqrt(u * (1 - u) / 4000) + 0.003)
    # a first-look stop is the normal tail; the last look's boundary gives exactly α
    assert stagewise_p(FIVE, bounds, 0, 3.0) == pytest.approx(2 * norm.sf(3.0))
    assert stagewise_p(FIVE, bounds, 4, bounds[4]) == pytest.approx(0.05, abs=1e-9)


def test_decide_stops_each_rule_where_it_should() -> None:
    design = make_design(Sequential(looks=4, futility=0.1), 400, 0.05)
    # cumulative (rescue, harm) at each look for three worlds
    rescue = np.array([[40, 80, 120, 160], [3, 6, 9, 12], [0, 0, 1, 1]])
    harm = np.array([[0, 0, 0, 0], [3, 6, 9, 12], [0, 0, 0, 0]])
    at, why = decide(design, rescue, harm, Rule.treatment)
    assert list(at[:2]) == [0, 0] and list(why[:2]) == [Stop.efficacy, Stop.futility]
    at, why = decide(design, rescue, harm, Rule.control)  # no futility for a control
    assert list(at[:2]) == [0, 3] and list(why[:2]) == [Stop.efficacy, Stop.ran_out]
    at, why = decide(design, rescue, harm, Rule.placebo)
    assert list(at) == [0, 0, 2] and all(w == Stop.check_decided for w in why)
    with pytest.raises(ValueError, match="shape"):
        decide(design, rescue[:, :2], harm[:, :2], Rule.treatment)


def test_the_design_is_part_of_the_fingerprint_and_absent_when_not_declared() -> None:
    plain = parse_spec(yaml.safe_dump(spec_with(None)), "s.yaml")
    assert "sequential" not in plain.canonical()["analysis"]
    seq = parse_spec(yaml.safe_dump(spec_with({"looks": 4})), "s.yaml")
    other = parse_spec(yaml.safe_dump(spec_with({"looks": 5})), "s.yaml")
    assert seq.canonical()["analysis"]["sequential"]["looks"] == 4
    assert len({plain.digest(), seq.digest(), other.digest()}) == 3
    design = design_for(seq)
    assert design is not None and design.wave_ends == [75, 150, 225, 300]


@pytest.mark.parametrize(
    ("sequential", "needles"),
    [
        ({"looks": 1}, ["analysis.sequential.looks", "greater than or equal to 2"]),
        ({"looks": 50}, ["analysis.sequential.looks", "50 looks need at least as many"]),
        ({"method": "bayes"}, ["analysis.sequential.method", "group_sequential"]),
        ({"spending": "linear"}, ["analysis.sequential.spending", "obrien_fleming"]),
        ({"futility": 0.7}, ["analysis.sequential.futility", "less than 0.5"]),
        ({"looks": "5"}, ["analysis.sequential.looks", "without quotes"]),
        ({"wave": 10}, ["analysis.sequential.wave", "unknown field", "looks"]),
        ({"looks": True}, ["analysis.sequential.looks", "not the boolean true"]),
        ({"futility": float("nan")}, ["analysis.sequential.futility", "finite number"]),
        ([5], ["analysis.sequential", "valid dictionary"]),
    ],
)
def test_a_bad_design_is_one_sentence_naming_the_field(
    sequential: object, needles: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec_with(sequential, episodes=30)))
    code, out, err = run_cli(capsys, "plan", str(path))
    assert code == 2 and out == ""
    assert err.count("\n") == 1, err
    for needle in needles:
        assert needle in err, err


def test_the_report_gives_each_worlds_path_and_the_unspent_budget() -> None:
    spec = parse_spec(
        yaml.safe_dump(spec_with({"looks": 4, "futility": 0}, episodes=400)), "s.yaml"
    )
    design = design_for(spec)
    assert design is not None
    rng = np.random.default_rng(1)
    base = rng.random(400) < 0.5
    refresh = base | (rng.random(400) < 0.6)  # rescues many, harms none
    null = base.copy()
    null[::3] = False  # harms every third success: the positive control moves
    report = sequential_report(
        spec, design, {"baseline": base, "refresh": refresh, "null-refresh": null}
    )
    paths = {p.world: p for p in report.worlds}
    assert paths["refresh"].stopped is Decision.efficacy
    assert paths["refresh"].episodes == 100 and paths["refresh"].unspent_episodes == 300
    assert paths["refresh"].p_value < 0.05
    assert paths["refresh"].ci_low > 0
    assert paths["null-refresh"].stopped is Decision.efficacy
    assert paths["null-refresh"].ci_high < 0
    # refresh is meant to cut failures and does; null-refresh is registered as an increase
    assert paths["refresh"].verdict is Verdict.supported
    assert paths["null-refresh"].verdict is Verdict.supported
    look = paths["refresh"].looks[0]
    assert (look.episodes, look.harm, look.boundary) == (100, 0, design.bounds[0])
    assert report.baseline_episodes == max(p.episodes for p in paths.values())
    assert report.unspent_world_episodes == 3 * 400 - report.sequential_world_episodes
    # a world whose columns end before its decision is still running
    short = sequential_report(
        spec, design, {"baseline": base[:200], "refresh": base[:200], "null-refresh": base[:200]}
    )
    assert all(p.stopped is Decision.continue_ for p in short.worlds)
    assert all(len(p.looks) == 2 for p in short.worlds)
    # with the default futility a treatment identical to the baseline stops once its
    # conditional power falls below 0.005 (look 2)
    default = parse_spec(yaml.safe_dump(spec_with({"looks": 4}, episodes=400)), "s.yaml")
    design = design_for(default)
    assert design is not None
    same = sequential_report(
        default, design, {"baseline": base, "refresh": base, "null-refresh": base}
    )
    paths = {p.world: p for p in same.worlds}
    assert paths["refresh"].stopped is Decision.futility and paths["refresh"].episodes == 200
    assert paths["refresh"].p_value >= 0.05
    assert paths["refresh"].verdict is Verdict.inconclusive
    assert paths["null-refresh"].stopped is Decision.futility


def test_plan_rehearses_the_design_and_prints_the_compute_saved(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec_with({"looks": 4})))
    code, out, _ = run_cli(capsys, "plan", str(path))
    assert code == 0
    section = out[out.index("sequential design (group_sequential") :]
    # null-refresh only harms: it crosses early; the baseline runs as long as refresh does
    assert "null-refresh: SUPPORTED, stopped for efficacy at look" in section
    code, js, _ = run_cli(capsys, "plan", str(path), "--json")
    seq = json.loads(js)["sequential"]
    assert seq["fixed_world_episodes"] == 3 * 300
    paths = {p["world"]: p for p in seq["worlds"]}
    used = seq["baseline_episodes"] + sum(p["episodes"] for p in paths.values())
    assert seq["sequential_world_episodes"] == used < 900
    assert f"{seq['saved_fraction']:.1%} saved" in section
    # the expected saving resamples the rehearsal's episodes: a spread around a mean
    low, mean, high = (seq[f"expected_saved_{k}"] for k in ("low", "fraction", "high"))
    assert 0.0 <= low <= mean <= high < 1.0 and low < high
    assert f"expected over experiments like this one: {mean:.1%} saved" in section


def test_the_design_crosses_the_workers_converter_unchanged_and_as_strictly() -> None:
    """A spec reaches the workflow as JSON through the pydantic converter: the design it
    signs must arrive as parsed, and a wrong type be refused there too."""

    def start_input(spec: dict[str, object]) -> ExperimentInput:
        payload = Payload(
            metadata={"encoding": b"json/plain"}, data=json.dumps({"spec": spec}).encode()
        )
        [value] = pydantic_data_converter.payload_converter.from_payloads(
            [payload], [ExperimentInput]
        )
        assert isinstance(value, ExperimentInput)
        return value

    data = spec_with({"looks": 4, "spending": "pocock"})
    spec = start_input(data).spec
    assert spec == parse_spec(yaml.safe_dump(data), "spec.yaml")
    assert spec.digest() == parse_spec(yaml.safe_dump(data), "spec.yaml").digest()
    assert spec.analysis.sequential == Sequential(looks=4, spending=Spending.pocock)
    with pytest.raises(ValidationError):
        start_input(spec_with({"looks": "4"}))
