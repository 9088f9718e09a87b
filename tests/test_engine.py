"""The fork engine (local twin): the seed's numbers, an independent implementation,
forks that never re-run the prefix, memoisation and parallelism that change nothing."""

from __future__ import annotations

import hashlib
import random
from collections import Counter
from pathlib import Path
from typing import Any, ClassVar

import pytest

from forklab.activities.experiment.twin import run_twin
from forklab.experiments.experiment.columnar import to_lists
from forklab.experiments.experiment.spec import ExperimentSpec
from forklab.runtime.crn import Shocks, uniform
from forklab.runtime.file_format import WorldPlan
from forklab.runtime.runner import continue_world, run_batch, run_prefix
from forklab.workloads.counter_recovery import CounterRecovery
from tests.helpers import ROOT, forklab_in_process, plan_json


def test_recovery_counter_reproduces_the_seed_table(capsys: pytest.CaptureFixture[str]) -> None:
    report = plan_json(capsys, ROOT / "forklab" / "workloads" / "recovery-counter.yaml")
    comp = next(
        c for c in report["comparisons"] if (c["world"], c["vs"]) == ("refresh", "baseline")
    )
    assert (comp["rescue"], comp["harm"], comp["unchanged"], comp["net"]) == (75, 83, 142, -8)
    slices = {
        s["value"]: (s["rescue"], s["harm"], s["unchanged"])
        for s in comp["slices"]
        if s["feature"] == "obs_repeated"
    }
    assert slices == {False: (0, 83, 72), True: (75, 0, 70)}
    assert report["experiment"]["id"] == "recovery-counter"
    assert len(report["experiment"]["fingerprint"]) == 64
    assert len(report["outcomes_digest"]) == 64
    names = [w["name"] for w in report["worlds"]]
    assert names == ["baseline", "refresh", "null-refresh"]
    for world in report["worlds"]:
        assert world["episodes"] == 300
        assert world["failure_rate"] == pytest.approx(world["failures"] / 300)


def independent_pair(seed: int, p: dict[str, Any]) -> tuple[bool, str]:
    """The seed's toy world, written again from its description, with free params."""
    rng = random.Random(seed)
    budget = p["budget_base"] + rng.choice(p["slack_choices"])
    freeze_at = rng.choice(p["freeze_choices"])

    def run(steps: int, v: int, obs: int, frozen: bool, *, until: int | None) -> Any:
        declared = False
        same = False
        while True:
            if until is not None and steps >= until:
                return steps, v, obs, frozen, same
            if steps >= budget:
                return declared and v == p["target"]
            steps += 1
            if obs >= p["target"]:
                declared = True
                return v == p["target"]
            v += 1
            frozen = frozen or freeze_at == v
            before = obs
            obs = obs if frozen else v
            same = obs == before

    steps, v, obs, frozen, same = run(0, 0, 0, False, until=p["fork_step"])
    off = run(steps, v, obs, frozen, until=None)
    on = run(steps + 1, v, v, False, until=None)  # refresh: one action, true reading
    label = "rescue" if on and not off else "harm" if off and not on else "unchanged"
    return same, label


@pytest.mark.parametrize(
    "params",
    [
        {
            "target": 6,
            "fork_step": 3,
            "budget_base": 7,
            "slack_choices": [0, 0, 1, 2],
            "freeze_choices": [None, None, 1, 2],
        },
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
    ],
)
def test_counter_recovery_matches_an_independent_implementation(params: dict[str, Any]) -> None:
    spec = ExperimentSpec.model_validate(
        {
            "id": "indep",
            "hypothesis": {"text": "h"},
            "seed": 11,
            "episodes": 400,
            "workload": {"name": "counter-recovery", "params": params},
            "worlds": [
                {"name": "baseline", "role": "baseline"},
                {"name": "refresh", "role": "treatment", "intervention": {"name": "refresh"}},
            ],
        }
    )
    batch = run_twin(spec, processes=1).batch
    base, ref = batch["worlds"]["baseline"]["outcomes"], batch["worlds"]["refresh"]["outcomes"]
    ours = [
        (f["obs_repeated"], "rescue" if r and not b else "harm" if b and not r else "unchanged")
        for f, b, r in zip(batch["features"], base, ref, strict=True)
    ]
    theirs = [independent_pair(11 + i, params) for i in range(400)]
    assert ours == theirs
    assert len(Counter(label for _, label in ours)) == 3  # the params exercise every label


class CountingNoisyCounter(CounterRecovery):
    """counter-recovery with noise (so nothing is memoised) counting calls."""

    initial_states = 0
    prefix_steps = 0

    def initial_state(self, episode_seed: int, shocks: Shocks) -> dict[str, Any]:
        type(self).initial_states += 1
        return super().initial_state(episode_seed, shocks)

    def step(self, state: dict[str, Any], shocks: Shocks) -> None:
        # Every step from below the boundary (step 3) belongs to a prefix: no world
        # starts there, since each starts from the checkpoint at step 3 or later.
        if state["steps"] < self.params["fork_step"]:
            type(self).prefix_steps += 1
        super().step(state, shocks)


WORLDS = [
    WorldPlan(name="baseline"),
    WorldPlan(name="refresh", intervention="refresh"),
    WorldPlan(name="null", intervention="null-refresh"),
]


def test_a_fork_never_reruns_the_prefix() -> None:
    wl = CountingNoisyCounter({"noise": 0.2})
    batch = run_batch(wl, 5, range(200), WORLDS)
    assert CountingNoisyCounter.initial_states == 200  # once per episode, not per world
    assert CountingNoisyCounter.prefix_steps == 200 * 3  # three prefix steps, once each
    # Continuations start from the checkpoint: every world inherited each episode's digest.
    for cols in batch["worlds"].values():
        assert cols["inherited"] == batch["checkpoints"]
    assert batch["resolved"] == batch["requested"] == [3] * 200


def test_memoisation_changes_no_result() -> None:
    """run_batch reuses randomness-free prefixes/continuations; compare with the plain loop."""
    for params in ({}, {"noise": 0.15}):
        wl = CounterRecovery(params)
        batch = run_batch(wl, 3, range(300), WORLDS)
        for i, episode in enumerate(range(300)):
            cp = run_prefix(wl, 3, episode)
            assert batch["checkpoints"][i] == cp["sha256"]
            assert batch["features"][i] == cp["features"]
            for world in WORLDS:
                ok, did, fp, _ = continue_world(wl, cp["state"], 3, episode, world)
                cols = batch["worlds"][world.name]
                assert (cols["outcomes"][i], cols["intervened"][i], cols["shocks"][i]) == (
                    ok,
                    did,
                    fp,
                )


def spec_for(episodes: int, **params: Any) -> ExperimentSpec:
    return ExperimentSpec.model_validate(
        {
            "id": "par",
            "hypothesis": {"text": "h"},
            "seed": 2,
            "episodes": episodes,
            "workload": {"name": "counter-recovery", "params": params},
            "worlds": [
                {"name": "baseline", "role": "baseline"},
                {"name": "refresh", "role": "treatment", "intervention": {"name": "refresh"}},
            ],
        }
    )


@pytest.mark.parametrize("params", [{}, {"noise": 0.1}])
def test_two_processes_give_identical_results(params: dict[str, Any]) -> None:
    spec = spec_for(3001, **params)
    one = run_twin(spec, processes=1)
    two = run_twin(spec, processes=2)
    assert two.processes == 2
    assert to_lists(one.batch) == to_lists(two.batch)


def test_majority_vote_over_replicates() -> None:
    wl = CounterRecovery({"noise": 0.25})
    world = WorldPlan(name="baseline", forks=3)
    single = WorldPlan(name="baseline", forks=1)
    differs = 0
    for episode in range(200):
        cp = run_prefix(wl, 9, episode)
        voted, *_ = continue_world(wl, cp["state"], 9, episode, world)
        # Replicate r draws the agent stream "#r{r}"; recompute each vote by hand.
        votes = []
        for r in range(3):
            import json

            state = json.loads(cp["state"])
            shocks = Shocks(9, episode, r)
            while not wl.done(state):
                wl.step(state, shocks)
            votes.append(wl.outcome(state))
        assert voted == (sum(votes) >= 2)
        first, *_ = continue_world(wl, cp["state"], 9, episode, single)
        assert first == votes[0]
        differs += voted != first
    assert differs > 0  # the vote actually changes some outcomes at this noise level


def test_crn_draws_are_pure_functions_of_coordinates() -> None:
    a = uniform(1, 2, 3, 4, "s")
    assert a == uniform(1, 2, 3, 4, "s")
    assert 0.0 <= a < 1.0
    assert len({uniform(1, 2, 3, t, "s") for t in range(1000)}) == 1000
    assert uniform(1, 2, 3, 4, "s") != uniform(1, 2, 3, 4, "t")
    one, two = Shocks(1, 2), Shocks(1, 2)
    for t in range(50):  # draw in opposite orders, with an extra agent draw in between
        one.exogenous(0, t, "x")
        two.exogenous(0, 49 - t, "x")
        two.agent(0, t, "noise")
    assert one.fingerprint() == two.fingerprint()
    assert Shocks(1, 2, replicate=1).agent(0, 0, "n") != Shocks(1, 2).agent(0, 0, "n")


def test_external_workload_runs_through_plan(tmp_path: Path) -> None:
    """The example workload lives outside the package and is loaded by import path."""
    import json
    import os

    env = {**os.environ, "PYTHONPATH": str(ROOT / "examples")}
    proc = forklab_in_process(env, "plan", "examples/flaky-tool.yaml", "--json", cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["experiment"]["workload"] == "flaky_tool:FlakyTool"
    assert [c["name"] for c in report["checks"] if not c["passed"]] == []
    (comp,) = [c for c in report["comparisons"] if c["vs"] == "baseline"]
    assert comp["rescue"] + comp["harm"] + comp["unchanged"] == 500


def test_docs_show_the_example_workload_verbatim() -> None:
    doc = (ROOT / "docs" / "workloads.md").read_text()
    source = (ROOT / "examples" / "flaky_tool.py").read_text()
    assert source in doc


@pytest.mark.parametrize(
    ("name", "intervention"), [("counter-recovery", "refresh"), ("retry-cascade", "jitter")]
)
def test_memo_off_runs_everything_and_changes_no_result(name: str, intervention: str) -> None:
    from forklab.runtime.runner import workload_class

    wl = workload_class(name)({})
    plans = [WORLDS[0], WorldPlan(name="treated", intervention=intervention)]
    assert run_batch(wl, 4, range(120), plans, memo=False) == run_batch(wl, 4, range(120), plans)


def test_shared_draws_change_no_value_and_fingerprints_see_every_coordinate() -> None:
    from forklab.runtime.crn import EpisodeDraws

    draws = EpisodeDraws(1, 2)
    shared, alone = Shocks(1, 2, draws=draws), Shocks(1, 2)
    for t in range(30):
        assert shared.exogenous(0, t, "x") == alone.exogenous(0, t, "x") == uniform(1, 2, 0, t, "x")
    assert shared.fingerprint() == alone.fingerprint()
    # The table hashes the episode's part of the key once and continues a copy per
    # coordinate: the same word as hashing the whole key (agent draws too).
    for entity, stream in ((-1, "capacity"), (12, "wörk|7")):
        assert shared.exogenous(entity, 3, stream) == uniform(1, 2, entity, 3, stream)
        assert Shocks(1, 2, 1).agent(entity, 3, stream) == uniform(1, 2, entity, 3, stream + "#r1")
    # A world that draws one more coordinate, or sees another value for one, differs.
    extra = Shocks(1, 2, draws=draws)
    for t in range(30):
        extra.exogenous(0, t, "x")
    extra.exogenous(0, 30, "x")
    assert extra.fingerprint() != alone.fingerprint()
    poisoned = EpisodeDraws(1, 2)
    poisoned.exogenous[(0, 7, "x")] = 12345
    other = Shocks(1, 2, draws=poisoned)
    for t in range(30):
        other.exogenous(0, t, "x")
    assert other.fingerprint() != alone.fingerprint()
    with pytest.raises(ValueError):
        Shocks(1, 3, draws=draws)  # a table belongs to one (seed, episode)


def test_the_coordinate_key_cache_keeps_equal_but_differently_written_coordinates_apart() -> None:
    """A table keeps each coordinate's key bytes; a coordinate equal to a kept one but
    written otherwise (``True`` for ``1``, a float, a str subclass) still draws the word
    of its own text, as ``uniform`` does."""
    from forklab.runtime.crn import EpisodeDraws

    class Stream(str):
        def __format__(self, spec: str) -> str:
            return "other"

    first = EpisodeDraws(5, 6)
    assert first.word(1, 2, "s") == EpisodeDraws(5, 6).word(1, 2, "s")  # kept, then read
    for entity, tick, stream in ((True, 2, "s"), (1.0, 2, "s"), (1, 2, Stream("s"))):
        expected = int.from_bytes(
            hashlib.blake2b(f"5|6|{entity}|{tick}|{stream}".encode(), digest_size=8).digest(),
            "little",
        )
        assert EpisodeDraws(5, 6).word(entity, tick, stream) == expected  # type: ignore[arg-type]
        assert expected != first.word(1, 2, "s")


def test_untracked_draws_read_the_shared_values_and_know_whether_they_drew() -> None:
    from forklab.runtime.crn import EpisodeDraws, UntrackedShocks

    prefix = UntrackedShocks(1, 2)
    assert not prefix.drawn and prefix.fingerprint() == "0:0000000000000000"
    first, second = UntrackedShocks(1, 2, 0, prefix), UntrackedShocks(1, 2, 0, prefix)
    tracked = Shocks(1, 2, source=prefix)
    for t in range(20):  # the first draws each value, the others read it from the table
        assert first.exogenous(0, t, "x") == uniform(1, 2, 0, t, "x")
        assert (
            second.exogenous(0, t, "x") == tracked.exogenous(0, t, "x") == uniform(1, 2, 0, t, "x")
        )
    assert first.drawn and second.drawn and prefix.draws is first.draws
    assert first.fingerprint() == "" and tracked.fingerprint() != "0:0000000000000000"
    # A run that only read the table another run filled still drew (the memo's rule),
    # and one that drew nothing did not, though the episode's table exists.
    idle = UntrackedShocks(1, 2, 0, prefix)
    assert not idle.drawn
    assert idle.exogenous(0, 3, "x") == uniform(1, 2, 0, 3, "x") and idle.drawn
    # A value drawn by a tracked run first is read the same way.
    table = EpisodeDraws(1, 2)
    Shocks(1, 2, draws=table).exogenous(5, 5, "y")
    assert UntrackedShocks(1, 2, 0, Shocks(1, 2, draws=table)).exogenous(5, 5, "y") == uniform(
        1, 2, 5, 5, "y"
    )
    with pytest.raises(ValueError):
        UntrackedShocks(1, 3, 0, prefix)  # a source run belongs to one (seed, episode)


def test_the_twin_takes_the_cores_nobody_else_is_running_on(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import os

    from forklab.activities.experiment import twin

    usable = len(os.sched_getaffinity(0))
    monkeypatch.setattr(twin, "_others_running", lambda: 0)
    assert twin.default_processes() == usable
    monkeypatch.setattr(twin, "_others_running", lambda: usable + 5)
    assert twin.default_processes() == 1
    monkeypatch.undo()
    assert twin._others_running() >= 0 and 1 <= twin.default_processes() <= usable


def test_the_twin_does_not_count_its_own_busy_thread_as_another_s_core() -> None:
    """The CLI imports the analysis in a thread while the twin starts: that thread is
    running in every count of ``/proc/loadavg``, and is this process's own."""
    import threading

    from forklab.activities.experiment import twin

    stop = threading.Event()

    def spin() -> None:
        while not stop.is_set():
            pass

    thread = threading.Thread(target=spin)
    thread.start()
    try:
        seen = max(twin._own_running() for _ in range(50))
    finally:
        stop.set()
        thread.join()
    assert seen >= 2  # the spinning thread and this one, each in its turn on the GIL


class DivergentDraws(CounterRecovery):
    """counter-recovery whose ``refresh`` world draws a shock the baseline never draws:
    a broken common-random-numbers design that the validity check must catch."""

    def step(self, state: dict[str, Any], shocks: Shocks) -> None:
        shocks.exogenous(0, int(state["steps"]), "weather")
        if not state["frozen"] and state.get("refreshed"):
            shocks.exogenous(1, int(state["steps"]), "weather")
        super().step(state, shocks)

    def intervene(self, state: dict[str, Any], name: str, params: Any, shocks: Shocks) -> None:
        super().intervene(state, name, params, shocks)
        state["refreshed"] = True


def test_the_crn_check_fails_when_worlds_see_different_shocks() -> None:
    from forklab.experiments.experiment.analysis.checks import common_random_numbers
    from forklab.experiments.experiment.outcomes import from_batch

    good = from_batch(run_batch(CounterRecovery({}), 0, range(50), WORLDS), "c", "s", 1.0)
    assert common_random_numbers(good).passed
    batch = run_batch(DivergentDraws({}), 0, range(50), WORLDS)
    check = common_random_numbers(from_batch(batch, "c", "s", 1.0))
    assert not check.passed and "refresh" in check.reason


def test_a_sampled_crn_check_still_fails_and_states_its_rate() -> None:
    """The twin fingerprints every 8th episode of a large run: a workload whose worlds draw
    differently still fails the check, and a faithful one passes saying what it checked.
    Episodes between the fingerprinted ones report UNCHECKED in every world."""
    from forklab.experiments.experiment.analysis.checks import common_random_numbers
    from forklab.experiments.experiment.outcomes import from_batch
    from forklab.runtime.crn import UNCHECKED

    good = run_batch(CounterRecovery({"noise": 0.2}), 0, range(80), WORLDS, fingerprint_every=8)
    shocks = good["worlds"]["baseline"]["shocks"]
    assert all((s == UNCHECKED) == bool(e % 8) for e, s in enumerate(shocks))
    check = common_random_numbers(from_batch(good, "c", "s", 1.0))
    assert check.passed and "10 of 80 episodes fingerprinted (a 12.5% sample" in check.reason
    full = run_batch(CounterRecovery({"noise": 0.2}), 0, range(80), WORLDS)
    for name, cols in full["worlds"].items():
        assert cols["outcomes"] == good["worlds"][name]["outcomes"]
        assert cols["shocks"][::8] == good["worlds"][name]["shocks"][::8]
    bad = run_batch(DivergentDraws({}), 0, range(80), WORLDS, fingerprint_every=8)
    check = common_random_numbers(from_batch(bad, "c", "s", 1.0))
    assert not check.passed and "refresh" in check.reason


def test_outcomes_digest_is_the_digest_of_the_canonical_json() -> None:
    from forklab.experiments.experiment.outcomes import outcomes_digest
    from forklab.runtime.canon import digest

    batch = run_batch(CounterRecovery({"noise": 0.1}), 0, range(257), WORLDS)
    out = from_batch_for_test(batch)
    names = ["null", "baseline", "refresh"]
    expected = digest([[n, [int(o) for o in batch["worlds"][n]["outcomes"]]] for n in names])
    assert outcomes_digest(out, names) == expected
    empty = from_batch_for_test(run_batch(CounterRecovery({}), 0, [], WORLDS))
    assert outcomes_digest(empty, ["baseline"]) == digest([["baseline", []]])


def from_batch_for_test(batch: Any) -> Any:
    from forklab.experiments.experiment.outcomes import from_batch

    return from_batch(batch, "code", "snap", 1.0)


class TypedFeatures(CounterRecovery):
    """A feature whose values are equal as Python values but not as JSON (-0.0, 0.0)."""

    feature_types: ClassVar[dict[str, Any]] = {"x": float}

    def features(self, state: dict[str, Any]) -> dict[str, Any]:
        return {"x": [-0.0, 0.0, 1.0][state["budget"] % 3]}


def test_shared_feature_dicts_keep_true_apart_from_one() -> None:
    batch = run_batch(TypedFeatures({}), 0, range(200), WORLDS, memo=False)
    for episode, feats in zip(batch["episodes"], batch["features"], strict=True):
        wl = TypedFeatures({})
        expected = run_prefix(wl, 0, episode)["features"]
        assert repr(feats) == repr(expected)
    assert len({repr(f) for f in batch["features"]}) >= 3


class LateTuple(CounterRecovery):
    """A JSON state in every episode but one, where a list becomes a tuple: the same
    canonical text as the list, but not a state that reads back equal."""

    def initial_state(self, episode_seed: int, shocks: Shocks) -> dict[str, Any]:
        state = super().initial_state(episode_seed, shocks)
        state["path"] = (1, 2) if episode_seed == 150 else [1, 2]
        return state


def test_a_state_met_before_is_still_checked_in_every_episode() -> None:
    """The batch keeps the digest and parse of states it met (memo off too); a state
    that only encodes like one of them is not let through."""
    from forklab.runtime.contract import ContractViolation

    with pytest.raises(ContractViolation, match=r"a tuple at state\['path'\].*episode 150"):
        run_batch(LateTuple({}), 0, range(200), WORLDS, memo=False)


@pytest.mark.parametrize("kept", [0, 1, 4096])
@pytest.mark.parametrize("memo", [False, True])
def test_kept_checkpoint_states_change_no_result(
    kept: int, memo: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Whether a checkpoint's state is kept (shared: every world copies it) or not (the
    last world takes it), on a flat state and a nested one, every column equals the
    sandbox's path (run_prefix + continue_world, nothing kept)."""
    from forklab.runtime import runner

    monkeypatch.setattr(runner, "STATES_KEPT", kept)
    for wl, worlds in (
        (CounterRecovery({"noise": 0.15}), WORLDS),
        (
            runner.workload_class("retry-cascade")({}),
            [WorldPlan(name="baseline"), WorldPlan(name="restart", intervention="restart")],
        ),
    ):
        batch = run_batch(wl, 3, range(40), worlds, memo)
        for i in range(40):
            cp = run_prefix(wl, 3, i)
            assert (batch["checkpoints"][i], batch["features"][i]) == (cp["sha256"], cp["features"])
            for world in worlds:
                ok, did, fp, _ = continue_world(wl, cp["state"], 3, i, world)
                cols = batch["worlds"][world.name]
                assert (cols["outcomes"][i], cols["intervened"][i], cols["shocks"][i]) == (
                    ok,
                    did,
                    fp,
                )


def test_a_block_is_its_coordinates_drawn_one_by_one_and_decoded_once_per_episode() -> None:
    from forklab.runtime.crn import Block, EpisodeDraws

    decoded: list[tuple[float, ...]] = []

    def decode(values: tuple[float, ...]) -> tuple[float, ...]:
        decoded.append(values)
        return values

    block = Block([(-1, "cap"), (0, "work"), (1, "work")], decode)
    draws = EpisodeDraws(5, 6)
    worlds = [Shocks(5, 6, draws=draws) for _ in range(3)]
    plain = Shocks(5, 6)
    expected = tuple(tuple(uniform(5, 6, e, t, s) for e, s in block.pairs) for t in range(20))
    for shocks in worlds:
        assert shocks.exogenous_blocks(block, 0, 20) == expected
    for t in range(20):
        for entity, stream in block.pairs:
            plain.exogenous(entity, t, stream)
    assert len(decoded) == 20  # once per tick for the episode, not once per world
    # The same fingerprint as drawing the coordinates one by one; a coordinate drawn both
    # ways, or a tick in two runs, counts once.
    mixed = Shocks(5, 6, draws=draws)
    mixed.exogenous(0, 7, "work")
    assert mixed.exogenous_blocks(block, 5, 20) == expected[5:]
    assert mixed.exogenous_blocks(block, 0, 6) == expected[:6]
    assert len(decoded) == 20  # the words and decodings of each tick are shared too
    assert {s.fingerprint() for s in (*worlds, mixed)} == {plain.fingerprint()}
    short = Shocks(5, 6, draws=draws)
    short.exogenous_blocks(block, 0, 19)
    assert short.fingerprint() != plain.fingerprint()


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ("{items: true}", "items"),
        ("{p_fail: '0.3'}", "p_fail"),
        ("{p_fail_backup: true}", "p_fail_backup"),
    ],
)
def test_the_example_workload_refuses_params_of_the_wrong_type(
    tmp_path: Path, params: str, field: str
) -> None:
    """`true` is an int to Python and "0.3" a string: the example's checks said nothing
    of the first and crashed on the second with a TypeError."""
    import shutil

    shutil.copy(ROOT / "examples" / "flaky_tool.py", tmp_path)
    spec = (ROOT / "examples" / "flaky-tool.yaml").read_text()
    spec = spec.replace(
        "  params: {items: 4, budget: 7, fork_at: 2, p_fail: 0.35, p_fail_backup: 0.1}",
        f"  params: {params}",
    )
    (tmp_path / "flaky-tool.yaml").write_text(spec)
    proc = forklab_in_process(None, "plan", str(tmp_path / "flaky-tool.yaml"), cwd=ROOT)
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert f"workload.params.{field}" in proc.stderr and "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr


class DistinctStates(CounterRecovery):
    """counter-recovery with a state of its own in every episode (a ticket number nothing
    reads): the memo and the checkpoint cache can never hit."""

    def initial_state(self, episode_seed: int, shocks: Shocks) -> dict[str, Any]:
        return {**super().initial_state(episode_seed, shocks), "ticket": episode_seed}


def test_caches_that_never_hit_turn_themselves_off(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where every state is distinct, the memo (keyed by ``repr`` of the start state) and
    the checkpoint cache (keyed by ``_exact_key`` of the boundary state) stop keying after
    the probe; where states repeat, they stay on. Either way every column is the one the
    sandbox's path gives (run_prefix + continue_world, nothing cached)."""
    from forklab.runtime import runner

    reprs: list[object] = []
    keyed: list[object] = []
    exact_key = runner._exact_key
    monkeypatch.setattr(runner, "_exact_key", lambda v: keyed.append(v) or exact_key(v))
    monkeypatch.setattr(runner, "repr", lambda v: reprs.append(v) or repr(v), raising=False)
    probe = runner.PROBE_EPISODES
    episodes = probe + 200
    for wl, distinct in ((DistinctStates({}), True), (CounterRecovery({}), False)):
        for memo in (True, False):
            reprs.clear()
            keyed.clear()
            batch = run_batch(wl, 3, range(episodes), WORLDS, memo)
            states = [k for k in keyed if isinstance(k, dict) and "steps" in k]
            if distinct:  # one key an episode while probing, none after it
                assert len(reprs) == (probe if memo else 0)
                assert len(states) == probe
            elif memo:  # the memo pays: every start state keyed, the prefix run 9 times
                assert len(reprs) == episodes and len(states) == 9
            else:  # the checkpoint cache pays: every boundary state keyed
                assert len(reprs) == 0 and len(states) == episodes
            for i in range(0, episodes, 37):
                cp = run_prefix(wl, 3, i)
                assert batch["checkpoints"][i] == cp["sha256"]
                for world in WORLDS:
                    ok, did, fp, _ = continue_world(wl, cp["state"], 3, i, world)
                    cols = batch["worlds"][world.name]
                    got = (cols["outcomes"][i], cols["intervened"][i], cols["shocks"][i])
                    assert got == (ok, did, fp)


def test_a_cache_pays_when_one_lookup_in_eight_hits() -> None:
    from forklab.runtime.runner import pays

    assert pays(1, 8) and pays(100, 100) and pays(0, 0)
    assert not pays(0, 1) and not pays(31, 256)


def test_the_ticket_triage_example_plans_valid_with_five_worlds_and_distinct_states(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The third-party example the speed benchmark uses (bench/plain_loop.py): every check
    passes, its five worlds move as pre-registered, and no two episodes share a state."""
    report = plan_json(capsys, ROOT / "examples" / "ticket-triage.yaml")
    assert report["valid"] and len(report["worlds"]) == 5
    assert [c["name"] for c in report["checks"] if not c["passed"]] == []
    assert {v["world"]: v["verdict"] for v in report["verdicts"]} == dict.fromkeys(
        ["escalate", "clarify", "note", "rush"], "supported"
    )
    from ticket_triage import TicketTriage

    wl = TicketTriage({})
    states = {run_prefix(wl, 11, e)["sha256"] for e in range(500)}
    assert len(states) == 500


def test_a_file_beside_the_spec_cannot_stand_in_for_a_dependency(tmp_path: Path) -> None:
    """forklab plan imports the analysis (scipy) while the twin runs, after the spec's
    folder went first on the import path: it imports it from ForkLab's own path, so a
    ``scipy.py`` beside the spec is never imported."""
    import json
    import subprocess
    import sys

    folder = tmp_path / "specs"
    folder.mkdir()
    (folder / "scipy.py").write_text("raise SystemExit('the spec folder shadowed scipy')\n")
    spec = {
        "id": "shadow",
        "hypothesis": {"text": "h"},
        "seed": 0,
        "episodes": 30,
        "workload": {"name": "counter-recovery"},
        "worlds": [
            {"name": "baseline", "role": "baseline"},
            {"name": "refresh", "role": "treatment", "intervention": {"name": "refresh"}},
        ],
    }
    (folder / "spec.json").write_text(json.dumps(spec))
    proc = subprocess.run(  # (run elsewhere: ``-m`` puts the current folder first itself)
        [sys.executable, "-m", "forklab.cli", "plan", str(folder / "spec.json"), "--json"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["valid"]
