"""The pure parts of user code, slices, the guard and override worlds over a cohort: which
functions are the user's (and refused without their bundle or inside ForkLab's package),
what a step looks like to them, the override's spec rules, one-line description and fork
arguments, a plan that excludes runs an override cannot apply to and signs the features,
the held-out split, and slices and a guard learned and validated as for workloads."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from temporalio.api.common.v1 import Payload

from forklab.activities.experiment.workload_bundles import WorkloadBundles
from forklab.activities.runfork.cohort_code import check_names, step_view, user_functions
from forklab.activities.runfork.cohort_overrides import fork_override
from forklab.cli.errors import CliError
from forklab.cli.experiment.cohort_bundle import ship_cohort_code
from forklab.experiments.cohort.matrix import WorldCosts
from forklab.experiments.cohort.plan import (
    RecordedRun,
    RunStatus,
    check_digest,
    cohort_digest,
    plan_cohort,
    plan_fingerprint,
)
from forklab.experiments.cohort.report import render_markdown, summarise
from forklab.experiments.cohort.slices import cohort_guard, held_out_runs
from forklab.experiments.cohort.spec import CohortExperimentSpec, parse_cohort_spec
from forklab.experiments.experiment.spec import SpecError
from forklab.experiments.runfork.overrides import MAX_OVERRIDE_BYTES
from forklab.experiments.runfork.steps import Step, StepOrigin, StepStatus
from forklab.workers.config import Settings
from forklab.workers.stores import artifact_store

SHIPPED = "forklab.experiments.cohort.scorers:completed"


def _spec(worlds: list[dict[str, Any]] | None = None, **cohort: Any) -> CohortExperimentSpec:
    raw: dict[str, Any] = {
        "id": "unit",
        "hypothesis": {"text": "t"},
        "seed": 3,
        "cohort": {
            "workflow_ids": [f"r{i}" for i in range(8)],
            "limit": 8,
            "fork_at": "step:2",
            "forks_per_world": 3,
            "outcome": SHIPPED,
            **cohort,
        },
        "worlds": [
            {"name": "baseline", "role": "baseline"},
            *(worlds or [{"name": "bigger", "role": "treatment", "model": "slow"}]),
        ],
        "budget": {"max_forks": 1000},
    }
    return parse_cohort_spec(json.dumps(raw), "s.yaml")


def _refused(raw_worlds: list[dict[str, Any]], match: str, **analysis: Any) -> None:
    spec = _spec().model_dump(mode="json")
    spec["worlds"] = [spec["worlds"][0], *raw_worlds]
    if analysis:
        spec["analysis"] = analysis
    with pytest.raises(SpecError, match=match):
        parse_cohort_spec(json.dumps(spec), "s.yaml")


def _step(i: int, status: StepStatus = StepStatus.completed, result: Any = None) -> Step:
    b64 = None
    if result is not None:
        payload = Payload(metadata={"encoding": b"json/plain"}, data=json.dumps(result).encode())
        b64 = base64.b64encode(payload.SerializeToString()).decode()
    return Step(
        index=i,
        activity_type="chat_model" if i % 2 else "search",
        input_sha256=f"in{i}",
        result_sha256=f"out{i}",
        status=status,
        run_id="run",
        label="fast" if i % 2 else "search",
        result_b64=b64,
    )


def _recorded(wid: str, steps: int) -> RecordedRun:
    return RecordedRun(
        workflow_id=wid,
        run_id="run",
        chain_run_ids=["run"],
        workflow_type="Agent",
        status=RunStatus.completed,
        steps=[_step(i) for i in range(1, steps + 1)],
    )


# --- whose code, and what it sees -------------------------------------------------------
def test_shipped_scorers_are_forklabs_and_anything_else_is_the_users() -> None:
    assert user_functions(_spec()) == {}
    check_names(_spec(), None)
    own = _spec(outcome="mypkg.scoring:resolved", features="mypkg.scoring:features")
    assert user_functions(own) == {
        "cohort.outcome": "mypkg.scoring:resolved",
        "cohort.features": "mypkg.scoring:features",
    }
    check_names(own, "a" * 64)
    with pytest.raises(ValueError, match=r"cohort.outcome: 'mypkg.scoring:resolved' is your own"):
        check_names(own, None)
    with pytest.raises(ValueError, match="is not one of ForkLab's shipped scorers"):
        check_names(_spec(outcome="forklab.runtime.launch:main"), "a" * 64)
    with pytest.raises(ValueError, match=r"cohort.features: .* shipped scorers \(no feature"):
        check_names(_spec(features="forklab.experiments.cohort.scorers:completed"), "a" * 64)


def test_a_step_reaches_the_users_code_as_plain_json() -> None:
    view = step_view(_step(2, StepStatus.failed, {"rows": [1, 2]}))
    assert view == {
        "index": 2,
        "type": "search",
        "label": "search",
        "status": "failed",
        "origin": StepOrigin.own.value,
        "seconds": None,
        "result": {"rows": [1, 2]},
    }
    other = Payload(metadata={"encoding": b"binary/plain"}, data=b"\x00")
    step = _step(1).model_copy(
        update={"result_b64": base64.b64encode(other.SerializeToString()).decode()}
    )
    assert step_view(step)["result"] is None


# --- override worlds --------------------------------------------------------------------
def test_an_override_world_is_one_line_and_small_json() -> None:
    spec = _spec(
        [
            {
                "name": "fixed",
                "role": "treatment",
                "override": {"part": "result", "value": {"status": "ok", "rows": [1, 2]}},
            },
            {
                "name": "long",
                "role": "treatment",
                "override": {"part": "input", "value": {"query": "x" * 100}},
            },
        ]
    )
    assert spec.worlds[1].describe() == (
        'fixed (treatment): override the decisive step\'s result with {"rows":[1,2],"status":"ok"}'
    )
    assert spec.worlds[2].describe() == (
        "long (treatment): override the decisive step's input with "
        '{"query":"xxxxxxxxxxxxxxxxxxxxxxxxxxxxx…'
    )
    big = {"name": "big", "role": "treatment", "override": {"value": "x" * MAX_OVERRIDE_BYTES}}
    _refused([big], r"worlds\[1\].override.value: .* bytes of JSON; keep it under")
    placebo = {"name": "p", "role": "placebo", "override": {"value": 1}}
    _refused([placebo], "a placebo is an inert change")


def test_an_override_forks_at_or_after_the_decisive_step() -> None:
    spec = _spec(
        [
            {"name": "res", "role": "treatment", "override": {"part": "result", "value": [1]}},
            {"name": "inp", "role": "treatment", "override": {"part": "input", "value": {"q": 2}}},
        ]
    )
    plan = plan_cohort(spec, [_recorded("a", 4), _recorded("b", 2)])
    # run b has no step after its fork point: no decisive step for the overrides
    assert [r.workflow_id for r in plan.runs] == ["a"]
    assert plan.excluded[0].reason == (
        "step:2: the run has no decisive step for the override of world res to replace"
    )
    run = plan.runs[0]
    assert fork_override(run, spec.baseline).at_step == 2
    res = fork_override(run, spec.worlds[1])
    assert res.at_step == 3 and res.result is not None and res.result.step == 3
    assert res.result.value == [1] and res.input is None
    inp = fork_override(run, spec.worlds[2])
    assert inp.at_step == 2 and inp.input == (3, {"q": 2}) and inp.result is None


# --- features in the signed plan --------------------------------------------------------
def test_the_plan_signs_the_features_and_the_code() -> None:
    spec = _spec()
    plan = plan_cohort(spec, [_recorded("a", 4), _recorded("b", 4)])
    bare = plan.digest
    runs = [r.model_copy(update={"features": {"tool": "search"}}) for r in plan.runs]
    featured = plan.model_copy(update={"runs": runs})
    with pytest.raises(ValueError, match="differs from its signed digest"):
        check_digest(featured)
    featured.digest = cohort_digest(featured)
    assert featured.digest != bare
    assert plan_fingerprint(spec, featured, "c" * 64) != plan_fingerprint(spec, featured)


def test_the_guard_spec_rules_for_a_cohort() -> None:
    treatment = {"name": "bigger", "role": "treatment", "model": "slow"}
    _refused([treatment], "set cohort.holdout_share instead", guard={"holdout_episodes": 5})
    _refused([treatment], "'noop' is not a treatment", guard={"world": "noop"})
    spec = _spec().model_dump(mode="json")
    spec["cohort"]["holdout_share"] = 0.9
    with pytest.raises(SpecError, match="holdout_share"):
        parse_cohort_spec(json.dumps(spec), "s.yaml")


# --- held-out runs, slices and the guard ------------------------------------------------
def test_held_out_runs_are_a_function_of_the_seed_and_the_ids() -> None:
    ids = [f"run-{i}" for i in range(20)]
    held = held_out_runs(7, ids, 0.3)
    assert len(held) == 6 and held == held_out_runs(7, ids, 0.3)
    assert held != held_out_runs(8, ids, 0.3)
    # a run's membership does not depend on where it stands in the list
    back = held_out_runs(7, ids[::-1], 0.3)
    assert {ids[i] for i in held} == {ids[::-1][i] for i in back}
    assert held_out_runs(7, ids[:1], 0.3) == set()
    assert len(held_out_runs(7, ids[:2], 0.3)) == 1


def _guard_case(n: int) -> tuple[list[dict[str, Any]], np.ndarray, np.ndarray]:
    """The world rescues every run whose last tool failed and harms every other one."""
    features = [{"last_failed": i % 2 == 0, "steps": i % 3} for i in range(n)]
    base = np.array([not f["last_failed"] for f in features])
    world = np.array([bool(f["last_failed"]) for f in features])
    return features, base, world


def test_a_guard_is_learned_on_training_runs_and_validated_on_held_out_ones() -> None:
    spec = _spec()
    features, base, world = _guard_case(20)
    held = held_out_runs(spec.seed, [f"r{i}" for i in range(20)], 0.3)
    guard = cohort_guard(spec, spec.worlds[1], features, base, world, held)
    assert guard.words == "apply bigger only when last_failed is true"
    assert guard.basis == "last_failed"
    after, before = guard.held_out_after, guard.held_out_before
    assert after.harm == 0 and after.rescue == before.rescue and after.net >= before.net
    assert guard.validated and guard.validation.startswith("the rule validated: on the 6 held-out")
    assert guard.training_before.runs == 14

    # a held-out set where the world harms where it rescued in training: not validated
    flipped = world.copy()
    for i in held:
        flipped[i] = not flipped[i] if features[i]["last_failed"] else flipped[i]
        base[i] = True
    bad = cohort_guard(spec, spec.worlds[1], features, base, flipped, held)
    assert not bad.validated and "the rule did not validate" in bad.validation


def test_the_report_slices_the_runs_and_shows_the_guard() -> None:
    spec = _spec()
    features, base, world = _guard_case(8)

    def rows(ok: np.ndarray) -> list[str]:
        return ["111" if x else "000" for x in ok]

    outcomes = {"baseline": rows(base), "bigger": rows(world)}
    ids = [f"r{i}" for i in range(8)]
    summary = summarise(spec, outcomes, {"bigger": WorldCosts()}, features, ids)
    slices = {(s.feature, str(s.value)): s for s in summary.slices["bigger"]}
    assert slices[("last_failed", "True")].rescue == 4
    assert slices[("last_failed", "False")].harm == 4
    assert summary.guard is not None
    diffs = {"bigger": {i: f"forklab diff b{i} w{i}" for i in range(8)}}
    text = render_markdown(spec, summary, ids, diffs)
    assert "| bigger | last_failed | true | 4 | 4 | 0 | 0 | +100.0%" in text
    assert "## Guard policy for bigger" in text
    assert "Held-out validation: the rule" in text
    # without features: no slices, no guard
    plain = summarise(spec, outcomes, {"bigger": WorldCosts()})
    assert plain.slices == {} and plain.guard is None
    assert "Slices" not in render_markdown(spec, plain, ids, diffs)


# --- forklab cohort start ships the user's code -----------------------------------------
def test_cohort_start_bundles_the_users_package_and_ships_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pkg = tmp_path / "src" / "scorepkg"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "scoring.py").write_text("def resolved(r, s, steps):\n    return True\n")
    monkeypatch.syspath_prepend(str(tmp_path / "src"))
    settings = Settings(home=tmp_path / "home")
    assert ship_cohort_code(settings, _spec()) is None  # shipped scorers only
    own = _spec(outcome="scorepkg.scoring:resolved", features="scorepkg.scoring:features")
    bundle = ship_cohort_code(settings, own)
    assert bundle is not None
    files = WorkloadBundles(artifact_store(settings), tmp_path / "bundles").files(bundle.digest)
    assert sorted(f.relpath for f in files) == ["scorepkg/__init__.py", "scorepkg/scoring.py"]
    with pytest.raises(
        CliError, match=r"s\.yaml: field cohort\.outcome: cannot find module 'nopkg'"
    ):
        ship_cohort_code(settings, _spec(outcome="nopkg.scoring:resolved"), "s.yaml")
