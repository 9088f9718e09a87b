"""The retry-cascade workload: calibration, common random numbers, validation, determinism."""

from __future__ import annotations

import json
from typing import Any

import pytest

from forklab.runtime.crn import Shocks, uniform
from forklab.runtime.file_format import Batch, WorldPlan
from forklab.runtime.runner import (
    continue_checkpoints,
    run_batch,
    run_prefix,
    workload_class,
)
from forklab.runtime.workload import WorkloadError
from forklab.workloads.retry_cascade import RetryCascade

WORLDS = [
    "baseline",
    "jitter",
    "broadcast",
    "queue-memory",
    "latency",
    "broadcast-jitter",
    "restart",
    "placebo",
]
EPISODES = 160


def plans(names: list[str] = WORLDS) -> list[WorldPlan]:
    return [WorldPlan(name=n, intervention=None if n == "baseline" else n) for n in names]


def failure_rate(batch: Batch, world: str) -> float:
    outcomes = batch["worlds"][world]["outcomes"]
    return 1.0 - sum(outcomes) / len(outcomes)


@pytest.fixture(scope="module")
def seed0() -> Batch:
    return run_batch(RetryCascade(), 0, range(EPISODES), plans())


# --- calibration ---------------------------------------------------------------------
def test_calibrated_pattern_at_defaults(seed0: Batch) -> None:
    base = failure_rate(seed0, "baseline")
    assert 0.15 <= base <= 0.30
    assert failure_rate(seed0, "broadcast") <= 0.03
    assert failure_rate(seed0, "broadcast-jitter") <= 0.05
    latency = failure_rate(seed0, "latency")
    assert latency >= base + 0.10
    assert 0.30 <= latency <= 0.55
    assert failure_rate(seed0, "placebo") == base


def test_broadcast_rescues_and_latency_harms_pairwise(seed0: Batch) -> None:
    base = seed0["worlds"]["baseline"]["outcomes"]
    pairs = {w: list(zip(base, seed0["worlds"][w]["outcomes"], strict=True)) for w in WORLDS}
    rescued = sum(1 for b, w in pairs["broadcast"] if not b and w)
    harmed = sum(1 for b, w in pairs["broadcast"] if b and not w)
    assert rescued >= 20 and harmed <= 1
    assert sum(1 for b, w in pairs["latency"] if not b and w) <= 2
    assert sum(1 for b, w in pairs["latency"] if b and not w) >= 15


@pytest.mark.parametrize("seed", [1, 2])
def test_pattern_holds_on_other_seeds(seed: int) -> None:
    batch = run_batch(
        RetryCascade(),
        seed,
        range(EPISODES),
        plans(["baseline", "broadcast", "latency", "broadcast-jitter", "placebo"]),
    )
    base = failure_rate(batch, "baseline")
    assert 0.12 <= base <= 0.33
    assert failure_rate(batch, "broadcast") <= 0.03
    assert failure_rate(batch, "broadcast-jitter") <= 0.05
    assert failure_rate(batch, "latency") >= base + 0.10
    assert batch["worlds"]["placebo"]["outcomes"] == batch["worlds"]["baseline"]["outcomes"]


# --- common random numbers and the placebo ---------------------------------------------
def test_placebo_reproduces_baseline_episode_for_episode(seed0: Batch) -> None:
    placebo = seed0["worlds"]["placebo"]
    assert placebo["outcomes"] == seed0["worlds"]["baseline"]["outcomes"]
    assert all(placebo["intervened"])


def test_placebo_is_randomised_but_inert() -> None:
    wl = RetryCascade()
    tokens = set()
    for episode in range(5):
        cp = run_prefix(wl, 0, episode)
        runs: dict[str, dict[str, Any]] = {}
        for name in (None, "placebo"):
            state = json.loads(cp["state"])
            shocks = Shocks(0, episode)
            if name is not None:
                wl.intervene(state, name, {}, shocks)
                tokens.add(state["placebo_token"])
            while not wl.done(state):
                wl.step(state, shocks)
            runs[str(name)] = state
        placebo = runs["placebo"]
        del placebo["placebo_token"]
        assert placebo == runs["None"]  # the whole final state, not just the outcome
    assert len(tokens) == 5  # a fresh random value per episode


def test_shock_fingerprints_equal_across_worlds(seed0: Batch) -> None:
    for i in range(EPISODES):
        prints = {seed0["worlds"][w]["shocks"][i] for w in WORLDS}
        assert len(prints) == 1, f"episode {i}: worlds saw different shocks"
    # ... and they are per-episode, not one constant.
    assert len(set(seed0["worlds"]["baseline"]["shocks"])) == EPISODES


def test_every_world_inherits_the_same_checkpoint(seed0: Batch) -> None:
    for w in WORLDS:
        assert seed0["worlds"][w]["inherited"] == seed0["checkpoints"]
    assert seed0["requested"] == seed0["resolved"]


# --- the boundary and the features -------------------------------------------------------
def test_boundary_is_the_outage_onset() -> None:
    wl = RetryCascade()
    p = wl.params
    for episode in range(30):
        cp = run_prefix(wl, 0, episode)
        state = json.loads(cp["state"])
        assert cp["resolved"] == cp["requested"] == state["onset"] == state["tick"]
        assert p["onset_min"] <= state["onset"] <= p["onset_max"]
        duration = state["outage_end"] - state["onset"]
        assert p["outage_min"] <= duration <= p["outage_max"]


def test_features_present_and_vary(seed0: Batch) -> None:
    feats = seed0["features"]
    for f in feats:
        assert set(f) == {"queue_depth", "agents_in_retry", "upstream"}
        assert isinstance(f["queue_depth"], int) and f["queue_depth"] >= 0
        assert isinstance(f["agents_in_retry"], int)
        assert 0 <= f["agents_in_retry"] <= min(8, f["queue_depth"])
        assert f["upstream"] in ("healthy", "degraded")
    assert len({f["queue_depth"] for f in feats}) >= 3
    assert len({f["agents_in_retry"] for f in feats}) >= 2
    assert {f["upstream"] for f in feats} == {"healthy", "degraded"}


# --- validation --------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"agents": 0}, "workload.params.agents"),
        ({"agents": True}, "workload.params.agents"),
        ({"horizon": 30}, "workload.params.horizon"),
        ({"arrival_rate": 1.5}, "workload.params.arrival_rate"),
        ({"error_rate": "0.1"}, "workload.params.error_rate"),
        ({"capacity": 0}, "workload.params.capacity"),
        ({"thrash": -1}, "workload.params.thrash"),
        ({"onset_min": 30, "onset_max": 25}, "workload.params.onset_max"),
        ({"outage_min": 5, "outage_max": 2}, "workload.params.outage_max"),
        ({"backoff_base": 4, "backoff_cap": 2}, "workload.params.backoff_cap"),
        ({"slo_lost": -1}, "workload.params.slo_lost"),
        ({"bogus": 1}, "workload.params.bogus"),
    ],
)
def test_bad_params_name_the_field(params: dict[str, Any], field: str) -> None:
    with pytest.raises(WorkloadError) as info:
        RetryCascade(params)
    assert info.value.field == field


@pytest.mark.parametrize(
    ("name", "params", "field"),
    [
        ("teleport", {}, "intervention.name"),
        ("broadcast", {"pace": 0}, "intervention.params.pace"),
        ("broadcast", {"volume": 3}, "intervention.params.volume"),
        ("jitter", {"spread": 2.0}, "intervention.params.spread"),
        ("latency", {"extra": -0.1}, "intervention.params.extra"),
        ("restart", {"downtime": 1.5}, "intervention.params.downtime"),
    ],
)
def test_bad_interventions_name_the_field(name: str, params: dict[str, Any], field: str) -> None:
    wl = RetryCascade()
    state = json.loads(run_prefix(wl, 0, 0)["state"])
    with pytest.raises(WorkloadError) as info:
        wl.intervene(state, name, params, Shocks(0, 0))
    assert info.value.field == field


def test_every_intervention_default_is_valid() -> None:
    wl = RetryCascade()
    for name in wl.interventions:
        assert wl.intervention_params(name, {}) == dict(wl.interventions[name])


# --- mechanics -----------------------------------------------------------------------------
def test_restart_loses_queued_retries_and_holds_traffic() -> None:
    # A world of exactly three ticks after the boundary (a step runs a world to the end).
    wl = RetryCascade({"onset_min": 30, "onset_max": 30, "horizon": 33})
    episode = next(i for i in range(200) if run_prefix(wl, 0, i)["features"]["queue_depth"])
    cp = run_prefix(wl, 0, episode)
    state = json.loads(cp["state"])
    before = state["dropped"]
    wl.intervene(state, "restart", {"downtime": 3}, Shocks(0, episode))
    assert state["dropped"] == before + cp["features"]["queue_depth"]
    assert state["retries"] == [] and state["depth"] == [0] * wl.params["agents"]
    served = state["served"]
    shocks = Shocks(0, episode)
    wl.step(state, shocks)
    assert state["tick"] == 33 and wl.done(state)
    assert state["served"] == served  # nobody called the upstream while restarting
    assert sum(state["depth"]) > 0  # the new work was held, not served


def test_latency_and_queue_memory_change_the_state_they_claim() -> None:
    wl = RetryCascade()
    state = json.loads(run_prefix(wl, 0, 3)["state"])
    wl.intervene(state, "queue-memory", {"factor": 3}, Shocks(0, 3))
    assert state["queue_cap"] == 3 * wl.params["queue_cap"]
    wl.intervene(state, "latency", {}, Shocks(0, 3))
    assert state["latency"] == wl.interventions["latency"]["extra"]


def test_outcome_is_the_slo_on_lost_requests() -> None:
    wl = RetryCascade()
    state = json.loads(run_prefix(wl, 0, 0)["state"])
    state["dropped"] = wl.params["slo_lost"] - 1
    state["retries"] = [[], [], [], [], [[0, 1]]]  # agent 0's call, due in 5 ticks
    state["depth"] = [1] + [0] * (wl.params["agents"] - 1)
    assert wl.lost(state) == wl.params["slo_lost"]
    assert wl.outcome(state)
    state["retries"][4].append([1, 2])
    state["depth"][1] = 1
    assert not wl.outcome(state)


# --- determinism and the runner ----------------------------------------------------------
def test_deterministic_across_runs() -> None:
    a = run_batch(RetryCascade(), 7, range(40), plans())
    b = run_batch(RetryCascade(), 7, range(40), plans())
    assert a == b
    c = run_batch(RetryCascade(), 8, range(40), plans())
    assert c["checkpoints"] != a["checkpoints"]


def test_sandbox_path_matches_local_twin(seed0: Batch) -> None:
    wl = workload_class("retry-cascade")()
    assert isinstance(wl, RetryCascade)
    checkpoints = [run_prefix(wl, 0, e) for e in range(20)]
    assert [cp["sha256"] for cp in checkpoints] == seed0["checkpoints"][:20]
    for world in plans():
        cols = continue_checkpoints(wl, 0, checkpoints, world)
        assert cols["outcomes"] == seed0["worlds"][world.name]["outcomes"][:20]
        assert cols["shocks"] == seed0["worlds"][world.name]["shocks"][:20]


# --- a plain reference of the documented model ------------------------------------------
def reference_lost(params: dict[str, Any], seed: int, episode: int, world: str) -> int:
    """``lost`` at the horizon, computed the plain way from docs/retry-cascade.md: a list
    of [due, attempts] per agent, every draw hashed with ``crn.uniform``, one tick at a
    time, nothing shared or decoded ahead (what the workload's step must equal)."""
    p = {**RetryCascade.default_params, **params}
    knobs = {**RetryCascade.interventions.get(world, {})}

    def draw(entity: int, tick: int, stream: str) -> float:
        return uniform(seed, episode, entity, tick, stream)

    n = p["agents"]
    onset = p["onset_min"] + int(draw(-1, 0, "onset") * (p["onset_max"] - p["onset_min"] + 1))
    span = p["outage_max"] - p["outage_min"] + 1
    outage_end = onset + p["outage_min"] + int(draw(-1, 0, "duration") * span)
    queues: list[list[list[int]]] = [[] for _ in range(n)]
    dropped = 0
    queue_cap = p["queue_cap"]
    spread = latency = None
    pace = cooldown = trip = None
    circuit_until = down_until = 0
    for t in range(p["horizon"]):
        if t == onset:  # the boundary: the world's intervention
            if world in ("jitter", "broadcast-jitter"):
                spread = knobs["spread"]
            if world in ("broadcast", "broadcast-jitter"):
                pace, cooldown, trip = knobs["pace"], knobs["cooldown"], knobs["trip"]
            if world == "queue-memory":
                queue_cap *= knobs["factor"]
            if world == "latency":
                latency = knobs["extra"]
            if world == "restart":
                dropped += sum(len(q) for q in queues)
                queues = [[] for _ in range(n)]
                down_until = t + knobs["downtime"]
        u_cap, u_serve = draw(-1, t, "capacity"), draw(-1, t, "serve")
        work = []
        for agent in range(n):
            if agent % 8 == 0:
                word = int(draw(agent // 8, t, "work") * 2.0**53)
            work.append((word >> 6 * (agent % 8) & 63) < p["arrival_rate"] * 64)
        if onset <= t < outage_end:
            cap = p["capacity"] * p["outage_capacity"]
        elif u_cap < p["dip_prob"]:
            cap = p["capacity"] * p["dip_factor"]
        else:
            v = (u_cap - p["dip_prob"]) / (1.0 - p["dip_prob"])
            cap = p["capacity"] * (1.0 - p["capacity_noise"] * v)
        sends = []
        for agent in range(n):
            sends.append([a for due, a in queues[agent] if due <= t] + ([0] if work[agent] else []))
            queues[agent] = [e for e in queues[agent] if e[0] > t]
        limits = None
        if t < down_until:
            limits = [0] * n
        elif pace is not None and t < circuit_until:
            limits = [0] * n
            probe = next((j for j in [(t + k) % n for k in range(n)] if sends[j]), None)
            if probe is not None:
                limits[probe] = 1
        elif pace is not None:
            limits = [pace] * n
        for agent in range(n):
            if limits is not None:
                for a in sends[agent][limits[agent] :]:
                    if len(queues[agent]) < queue_cap:
                        queues[agent].append([t + 1, a])
                    else:
                        dropped += 1
                sends[agent] = sends[agent][: limits[agent]]
        offered = sum(len(s) for s in sends)
        ratio = 1.0 - p["error_rate"]
        load = offered * (1.0 + (latency or 0.0))
        if offered and load > cap:
            ratio *= max(0.0, cap - p["thrash"] * (load - cap)) / load
        cumulative, below, failures = u_serve, 0, 0
        for agent in range(n):
            if not sends[agent]:
                continue
            cumulative += len(sends[agent]) * ratio
            ok, below = int(cumulative) - below, int(cumulative)
            for j, a in enumerate(sends[agent][ok:]):
                failures += 1
                if a + 1 >= p["max_attempts"]:
                    dropped += 1
                    continue
                wait = min(p["backoff_base"] * 2 ** (a + 1 - 1), p["backoff_cap"])
                if spread is not None:
                    u = uniform(seed, episode, agent, t, f"jitter{j}#r0")
                    wait = max(1, round(wait * (1.0 + spread * (u - 0.5))))
                if len(queues[agent]) < queue_cap:
                    queues[agent].append([t + wait, a + 1])
                else:
                    dropped += 1
        if failures and pace is not None and (t < circuit_until or failures >= trip * offered):
            circuit_until = t + 1 + cooldown
    return dropped + sum(len(q) for q in queues)


@pytest.mark.parametrize(
    "params",
    [{}, {"agents": 19, "backoff_cap": 30, "queue_cap": 3, "max_attempts": 9, "capacity": 20.0}],
)
def test_the_workload_equals_a_plain_reference_of_its_model(params: dict[str, Any]) -> None:
    """Whatever the workload does for speed (the tick's shocks decoded once per episode,
    queues kept by due tick, a short cut for ticks without due retries), every world of
    every episode ends with the requests lost that the documented model gives."""
    wl = RetryCascade(params)
    batch = run_batch(wl, 3, range(60), plans())
    prefixes = [run_prefix(wl, 3, episode)["state"] for episode in range(60)]
    for world in WORLDS:
        lost = []
        for episode, text in enumerate(prefixes):
            state, shocks = json.loads(text), Shocks(3, episode)
            if world != "baseline":
                wl.intervene(state, world, {}, shocks)
            while not wl.done(state):
                wl.step(state, shocks)
            lost.append(wl.lost(state))
        assert lost == [reference_lost(params, 3, e, world) for e in range(60)], world
        expected = [x <= wl.params["slo_lost"] for x in lost]
        assert batch["worlds"][world]["outcomes"] == expected, world
        if world == "baseline":
            assert len(set(lost)) > 10  # storms and calm episodes alike
