"""The twin's batched episode path (forklab/experiments/experiment/vector.py) gives the scalar
runner's columns exactly, episode by episode, and falls back to it (or refuses) when it cannot
vouch."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pytest

from forklab.activities.experiment.twin import run_twin
from forklab.experiments.experiment import vector
from forklab.experiments.experiment.columnar import ColumnBatch, to_columns, to_lists
from forklab.experiments.experiment.spec import ExperimentSpec
from forklab.experiments.experiment.vector import batchable, run_columns
from forklab.experiments.experiment.worlds import spec_world_plans
from forklab.runtime.contract import BoundaryMissingError, ContractViolation, StuckWorldError
from forklab.runtime.file_format import WorldPlan
from forklab.runtime.runner import continue_checkpoints, run_batch, run_prefix
from forklab.runtime.workload import Column, Columns, State
from forklab.workloads.counter_recovery import CounterRecovery

WORLDS = [
    WorldPlan(name="baseline"),
    WorldPlan(name="refresh", intervention="refresh"),
    WorldPlan(name="null", intervention="null-refresh"),
    WorldPlan(
        name="guarded", intervention="refresh", guard={"any": [{"obs_repeated": {"eq": True}}]}
    ),
    WorldPlan(name="voted", intervention="refresh", forks=3),
]

PARAMS: list[dict[str, Any]] = [
    {},  # the seed's world
    {
        "target": 5,
        "fork_step": 2,
        "budget_base": 6,
        "slack_choices": [0, 1, 3],
        "freeze_choices": [None, 1, 3, 4],
    },
    {
        "target": 9,
        "fork_step": 4,
        "budget_base": 10,
        "slack_choices": [0, 2],
        "freeze_choices": [None, 2, 3, 5, 7],
    },
    {  # a boundary after one step, freezes that never hit, budgets short of the target
        "target": 4,
        "fork_step": 1,
        "budget_base": 2,
        "slack_choices": [0, 1, 2, 5],
        "freeze_choices": [1, None, 0, -1],
        "noise": 0.0,
    },
    {"fork_step": 0},  # the boundary at the start: no prefix step
]


def differences(got: ColumnBatch, want: ColumnBatch) -> list[str]:
    """Every column where ``got`` differs from ``want`` — values, dtypes, and the order of
    the tables of distinct strings and feature rows (what ``to_columns`` makes)."""
    found: list[str] = []
    for name in ("episodes", "requested", "resolved"):
        a, b = got[name], want[name]
        if a.dtype != b.dtype or not np.array_equal(a, b):
            found.append(name)
    for name in ("checkpoints",):
        if got[name].values != want[name].values or not np.array_equal(
            got[name].codes, want[name].codes
        ):
            found.append(name)
    rows = [repr(r) for r in got["features"].rows], [repr(r) for r in want["features"].rows]
    if rows[0] != rows[1] or not np.array_equal(got["features"].codes, want["features"].codes):
        found.append("features")
    if list(got["worlds"]) != list(want["worlds"]):
        return [*found, "worlds"]
    for world, cols in got["worlds"].items():
        ref = want["worlds"][world]
        for name in ("outcomes", "intervened"):
            if cols[name].dtype != ref[name].dtype or not np.array_equal(cols[name], ref[name]):
                found.append(f"{world}.{name}")
        for name in ("shocks", "inherited"):
            if cols[name].values != ref[name].values or not np.array_equal(
                cols[name].codes, ref[name].codes
            ):
                found.append(f"{world}.{name}")
        if (cols["inherited"] is got["checkpoints"]) != (ref["inherited"] is want["checkpoints"]):
            found.append(f"{world}.inherited is the checkpoint column")
    # (the forks a decided vote saved are counted per run, not per episode: not a column)
    lists = [{k: v for k, v in to_lists(b).items() if k != "forks_saved"} for b in (got, want)]
    if lists[0] != lists[1] and not found:
        found.append("lists")
    return found


@pytest.mark.parametrize("memo", [False, True])
@pytest.mark.parametrize("params", PARAMS)
def test_batched_columns_equal_the_scalar_runners(
    params: dict[str, Any], memo: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """3,000 episodes, five worlds (guarded, majority vote), column by column; the spot
    check is off so that the comparison alone is tested."""
    monkeypatch.setattr(vector, "SPOT_EPISODES", 0)
    wl = CounterRecovery(params)
    assert batchable(wl)
    episodes = range(100, 3100)
    batched = run_columns(wl, 7, episodes, WORLDS, memo)
    assert differences(batched, to_columns(run_batch(wl, 7, episodes, WORLDS, memo))) == []
    assert len(batched["checkpoints"].values) > 1
    # the params exercise successes and failures, and the guard fires in some episodes only
    base, guarded = batched["worlds"]["baseline"], batched["worlds"]["guarded"]
    assert 0 < base["outcomes"].sum() < len(episodes)
    if wl.params["fork_step"]:  # at step 0 no observation has repeated yet
        assert 0 < guarded["intervened"].sum() < len(episodes)


def test_batched_columns_equal_the_sandbox_path() -> None:
    """What a sandbox runs: each prefix alone (run_prefix), each world from the checkpoint
    text (continue_checkpoints, which recomputes inherited from the text it received)."""
    wl = CounterRecovery(PARAMS[1])
    batched = to_lists(run_columns(wl, 3, range(400), WORLDS))
    checkpoints = [run_prefix(wl, 3, e) for e in range(400)]
    assert batched["checkpoints"] == [cp["sha256"] for cp in checkpoints]
    assert batched["features"] == [cp["features"] for cp in checkpoints]
    assert batched["requested"] == [cp["requested"] for cp in checkpoints]
    for world in WORLDS:
        assert batched["worlds"][world.name] == continue_checkpoints(wl, 3, checkpoints, world)


class RareSlip(CounterRecovery):
    """Batch methods one off in about one episode in a thousand (a budget one larger),
    which a spot check of a few episodes would likely miss."""

    def batch_ok(self) -> bool:
        return super().batch_ok()

    def batch_initial(self, episode_seeds: Sequence[int]) -> Mapping[str, Any]:
        cols = dict(super().batch_initial(episode_seeds))
        cols["budget"] = [
            b + (s % 997 == 0) for b, s in zip(cols["budget"], episode_seeds, strict=True)
        ]
        return cols


def test_the_comparison_fails_on_a_rare_slip(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(vector, "SPOT_EPISODES", 0)
    wl = RareSlip({})
    assert batchable(wl)
    episodes = range(3000)
    found = differences(
        run_columns(wl, 0, episodes, WORLDS), to_columns(run_batch(wl, 0, episodes, WORLDS))
    )
    assert "checkpoints" in found


class Inverted(CounterRecovery):
    """Batch outcomes negated: wrong in every episode."""

    def batch_ok(self) -> bool:
        return super().batch_ok()

    def batch_outcome(self, cols: Columns) -> Column:
        return ~super().batch_outcome(cols)


def test_the_twin_refuses_batch_methods_that_disagree_with_the_scalar_ones() -> None:
    with pytest.raises(
        ContractViolation,
        match=r"Inverted's batch methods disagree .*episode 0's world baseline outcome",
    ):
        run_twin(_spec(500), processes=1, batched=True).batch  # noqa: B018
    with pytest.raises(ContractViolation, match="disagree"):
        run_columns(Inverted({}), 0, range(500), WORLDS)
    # the scalar methods alone are fine
    assert run_twin(_spec(500), processes=1, batched=False).processes == 1


def _spec(
    episodes: int, workload: str = "tests.test_vector:Inverted", **params: Any
) -> ExperimentSpec:
    return ExperimentSpec.model_validate(
        {
            "id": "vec",
            "hypothesis": {"text": "h"},
            "seed": 5,
            "episodes": episodes,
            "workload": {"name": workload, "params": params},
            "worlds": [
                {"name": "baseline", "role": "baseline"},
                {"name": "refresh", "role": "treatment", "intervention": {"name": "refresh"}},
            ],
        }
    )


def test_noise_falls_back_to_the_scalar_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """Batch methods get no shocks, so counter-recovery with noise says no (batch_ok);
    the twin then never enters the batched path, and without noise it does."""
    from forklab.experiments.experiment import chunks as engine

    def refuse(*args: Any, **kwargs: Any) -> ColumnBatch:
        raise AssertionError("the batched path ran")

    monkeypatch.setattr(engine, "run_columns", refuse)
    noisy = _spec(2000, "counter-recovery", noise=0.1)
    assert not batchable(CounterRecovery({"noise": 0.1}))
    got = run_twin(noisy, processes=1).batch
    plans = spec_world_plans(noisy)
    assert to_lists(got) == run_batch(CounterRecovery({"noise": 0.1}), 5, range(2000), plans)
    quiet = run_batch(CounterRecovery({}), 5, range(2000), plans)
    assert (
        to_lists(got)["worlds"]["baseline"]["outcomes"] != quiet["worlds"]["baseline"]["outcomes"]
    )  # the noise was applied: misreads change outcomes
    with pytest.raises(AssertionError, match="the batched path ran"):
        run_twin(_spec(2000, "counter-recovery"), processes=1)
    run_twin(_spec(2000, "counter-recovery"), processes=1, batched=False)  # scalar on request


class ScalarOverride(CounterRecovery):
    """Overrides ``step`` without defining ``batch_ok``: its inherited batch methods no
    longer describe it."""

    def step(self, state: State, shocks: Any) -> None:
        super().step(state, shocks)


def test_batch_methods_count_only_for_the_class_that_defines_batch_ok() -> None:
    assert batchable(CounterRecovery({}))
    assert not batchable(ScalarOverride({}))
    assert batchable(Inverted({}))  # it defines batch_ok: its batch methods are its claim
    assert not batchable(CounterRecovery({"budget_base": 2**62}))  # beyond int64 columns
    from forklab.runtime.runner import workload_class

    assert not batchable(workload_class("retry-cascade")({}))  # no batch methods


class Short(CounterRecovery):
    max_steps = 2


class BadFeatures(CounterRecovery):
    def batch_ok(self) -> bool:
        return True

    def features(self, state: State) -> dict[str, Any]:
        return {"obs_repeated": int(state["same_obs"])}


class Raises(CounterRecovery):
    def batch_ok(self) -> bool:
        return True

    def batch_step(self, cols: Columns, active: Column) -> None:
        raise ZeroDivisionError("oops")


@pytest.mark.parametrize(
    ("workload", "error"),
    [
        (Short({}), StuckWorldError),
        (CounterRecovery({"fork_step": 20}), BoundaryMissingError),
        (BadFeatures({}), ContractViolation),
    ],
)
def test_a_violation_gives_the_scalar_runners_sentence(workload: Any, error: type) -> None:
    """The batched path stops, the chunk reruns on the scalar runner, its sentence (episode,
    world, step) is the error."""
    assert batchable(workload)
    with pytest.raises(error) as scalar:
        run_batch(workload, 0, range(50), WORLDS, memo=False)
    with pytest.raises(error) as batched:
        run_columns(workload, 0, range(50), WORLDS)
    assert str(batched.value) == str(scalar.value)
    assert "episode 0" in str(batched.value)


def test_a_batch_method_that_raises_where_the_scalar_ones_do_not_is_refused() -> None:
    with pytest.raises(
        ContractViolation, match=r"Raises's batch methods disagree.*ZeroDivisionError: oops"
    ):
        run_columns(Raises({}), 0, range(50), WORLDS)
