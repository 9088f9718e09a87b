"""``retry-cascade``: a fleet of agents shares one upstream that suffers an outage.

Each tick every agent may receive one unit of work and calls the upstream for it. A call
that fails is retried by the same agent after a capped exponential backoff, and nobody
else hears about it. The upstream serves a noisy number of calls per tick (with rare
brown-outs before the outage, so the fleet enters the outage in different shapes); when
the offered load exceeds what it can serve it thrashes, and its goodput falls as the
overload grows. After an outage the synchronised retries can keep it overloaded: the
retry storm sustains itself until requests run out of attempts and are dropped.

The fork boundary is the outage onset. Success: the fleet met its SLO, i.e. no more than
``slo_lost`` requests were lost, where a request is lost when it is dropped (out of
attempts, or its agent's retry queue was full) or is still waiting in a retry queue at
the horizon. See ``docs/retry-cascade.md``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from experiments.runtime.crn import Shocks
from experiments.runtime.workload import Feature, State, Workload, WorkloadError

_INTS = {
    "agents": (1, 64),
    "horizon": (2, 10_000),
    "onset_min": (1, 10_000),
    "onset_max": (1, 10_000),
    "outage_min": (1, 10_000),
    "outage_max": (1, 10_000),
    "max_attempts": (1, 100),
    "backoff_base": (1, 1_000),
    "backoff_cap": (1, 1_000),
    "queue_cap": (0, 10_000),
    "slo_lost": (0, 1_000_000),
}
_FRACTIONS = ("arrival_rate", "capacity_noise", "dip_prob", "dip_factor", "outage_capacity")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


class RetryCascade(Workload):
    name = "retry-cascade"
    default_params: Mapping[str, Any] = {
        "agents": 8,
        "horizon": 90,
        "onset_min": 20,
        "onset_max": 40,
        "outage_min": 3,
        "outage_max": 14,
        "arrival_rate": 0.7,
        "capacity": 9.0,
        "capacity_noise": 0.15,
        "dip_prob": 0.06,
        "dip_factor": 0.4,
        "outage_capacity": 0.0,
        "thrash": 0.3,
        "max_attempts": 5,
        "backoff_base": 1,
        "backoff_cap": 8,
        "queue_cap": 12,
        "slo_lost": 20,
    }
    interventions: Mapping[str, Mapping[str, Any]] = {
        "jitter": {"spread": 1.0},
        "broadcast": {"cooldown": 2, "pace": 1},
        "queue-memory": {"factor": 2},
        "latency": {"extra": 0.3},
        "broadcast-jitter": {"cooldown": 2, "pace": 1, "spread": 1.0},
        "restart": {"downtime": 2},
        "placebo": {},
    }
    max_steps = 20_000

    # --- params ----------------------------------------------------------------------
    def check_params(self) -> None:
        p = self.params
        for key, (lo, hi) in _INTS.items():
            if not _is_int(p[key]) or not lo <= p[key] <= hi:
                raise WorkloadError(f"workload.params.{key}", f"must be an integer in [{lo}, {hi}]")
        for key in _FRACTIONS:
            if not _is_number(p[key]) or not 0.0 <= p[key] <= 1.0:
                raise WorkloadError(f"workload.params.{key}", "must be a number in [0, 1]")
        if not _is_number(p["capacity"]) or not 0.0 < p["capacity"] <= 1e6:
            raise WorkloadError("workload.params.capacity", "must be a number in (0, 1e6]")
        if not _is_number(p["thrash"]) or not 0.0 <= p["thrash"] <= 10.0:
            raise WorkloadError("workload.params.thrash", "must be a number in [0, 10]")
        if p["onset_max"] < p["onset_min"]:
            raise WorkloadError("workload.params.onset_max", "must be ≥ onset_min")
        if p["outage_max"] < p["outage_min"]:
            raise WorkloadError("workload.params.outage_max", "must be ≥ outage_min")
        if p["horizon"] <= p["onset_max"]:
            raise WorkloadError(
                "workload.params.horizon", "must be greater than onset_max (the latest boundary)"
            )
        if p["backoff_cap"] < p["backoff_base"]:
            raise WorkloadError("workload.params.backoff_cap", "must be ≥ backoff_base")
        self._n: int = p["agents"]
        self._horizon: int = p["horizon"]
        self._rate = float(p["arrival_rate"])
        self._capacity = float(p["capacity"])
        self._noise = float(p["capacity_noise"])
        self._dip_prob = float(p["dip_prob"])
        self._dip_factor = float(p["dip_factor"])
        self._outage_capacity = float(p["outage_capacity"])
        self._thrash = float(p["thrash"])
        self._max_attempts: int = p["max_attempts"]
        # backoff after the k-th failed attempt (k = 1..max_attempts-1), in ticks
        self._backoff = [
            min(p["backoff_base"] << min(max(k - 1, 0), 30), p["backoff_cap"])
            for k in range(p["max_attempts"] + 1)
        ]

    def intervention_params(self, name: str, params: Mapping[str, Any]) -> dict[str, Any]:
        merged = super().intervention_params(name, params)
        for key, value in merged.items():
            field = f"intervention.params.{key}"
            if key in ("cooldown", "downtime"):
                if not _is_int(value) or not 0 <= value <= 1_000:
                    raise WorkloadError(field, "must be an integer in [0, 1000]")
            elif key in ("pace", "factor"):
                if not _is_int(value) or not 1 <= value <= 1_000:
                    raise WorkloadError(field, "must be an integer in [1, 1000]")
            elif key == "spread":
                if not _is_number(value) or not 0.0 <= value <= 1.0:
                    raise WorkloadError(field, "must be a number in [0, 1]")
            elif key == "extra" and (not _is_number(value) or not 0.0 <= value <= 100.0):
                raise WorkloadError(field, "must be a number in [0, 100]")
        return merged

    # --- episode -----------------------------------------------------------------------
    def initial_state(self, episode_seed: int, shocks: Shocks) -> State:
        p = self.params
        # The outage is a property of the upstream (entity = agents), drawn at tick 0.
        span = p["onset_max"] - p["onset_min"] + 1
        onset = p["onset_min"] + int(shocks.exogenous(self._n, 0, "onset") * span)
        span = p["outage_max"] - p["outage_min"] + 1
        duration = p["outage_min"] + int(shocks.exogenous(self._n, 0, "duration") * span)
        return {
            "tick": 0,
            "onset": onset,
            "outage_end": onset + duration,
            "queues": [[] for _ in range(self._n)],
            "served": 0,
            "failed_calls": 0,
            "dropped": 0,
            "last_failure": -1,
            "queue_cap": p["queue_cap"],
            "jitter": None,
            "broadcast": None,
            "circuit_until": 0,
            "latency": 0.0,
            "down_until": 0,
        }

    def boundary(self, state: State) -> int:
        return int(state["onset"])

    def cursor(self, state: State) -> int:
        return int(state["tick"])

    def done(self, state: State) -> bool:
        return int(state["tick"]) >= self._horizon

    def lost(self, state: State) -> int:
        """Requests dropped so far plus requests still waiting in a retry queue."""
        return int(state["dropped"]) + sum(len(q) for q in state["queues"])

    def outcome(self, state: State) -> bool:
        return self.lost(state) <= self.params["slo_lost"]

    def features(self, state: State) -> dict[str, Feature]:
        queues = state["queues"]
        recent = state["last_failure"] >= 0 and state["tick"] - state["last_failure"] <= 3
        return {
            "queue_depth": sum(len(q) for q in queues),
            "agents_in_retry": sum(1 for q in queues if q),
            "upstream": "degraded" if recent else "healthy",
        }

    def intervene(self, state: State, name: str, params: Mapping[str, Any], shocks: Shocks) -> None:
        p = self.intervention_params(name, params)
        tick = int(state["tick"])
        if name in ("jitter", "broadcast-jitter"):
            state["jitter"] = {"spread": float(p["spread"])}
        if name in ("broadcast", "broadcast-jitter"):
            state["broadcast"] = {"cooldown": int(p["cooldown"]), "pace": int(p["pace"])}
        if name == "queue-memory":
            state["queue_cap"] = int(state["queue_cap"]) * int(p["factor"])
        elif name == "latency":
            state["latency"] = float(p["extra"])
        elif name == "restart":
            # In-memory retry queues die with the agents: that work is lost.
            state["dropped"] += sum(len(q) for q in state["queues"])
            state["queues"] = [[] for _ in range(self._n)]
            state["down_until"] = tick + int(p["downtime"])
        elif name == "placebo":
            # Randomised but inert: a draw from the placebo's own agent stream (so the
            # exogenous fingerprint is untouched), stored where nothing reads it.
            state["placebo_token"] = shocks.agent(self._n, tick, "placebo")

    def step(self, state: State, shocks: Shocks) -> None:
        t = int(state["tick"])
        if t >= self._horizon:
            return
        n = self._n
        # Exogenous shocks first, for every tick and agent, whatever the fleet does.
        u_cap = shocks.exogenous(n, t, "capacity")
        u_work = [shocks.exogenous(i, t, "work") for i in range(n)]

        if state["onset"] <= t < state["outage_end"]:
            cap = self._capacity * self._outage_capacity
        elif u_cap < self._dip_prob:
            cap = self._capacity * self._dip_factor  # a background brown-out
        else:
            rescaled = (u_cap - self._dip_prob) / (1.0 - self._dip_prob)
            cap = self._capacity * (1.0 - self._noise * rescaled)

        queues: list[list[list[int]]] = state["queues"]
        queue_cap = int(state["queue_cap"])
        bc = state["broadcast"]
        down = t < state["down_until"]
        circuit_open = bc is not None and t < state["circuit_until"]
        probe = t % n
        dropped = 0

        # What each agent sends this tick: a list of attempt counts; held work waits.
        sends: list[list[int]] = []
        serve_u: list[float] = []
        for i in range(n):
            u = u_work[i]
            # One draw decides both arrival and the serving tie-break, independently.
            if u < self._rate:
                arrived = True
                serve_u.append(u / self._rate)
            else:
                arrived = False
                serve_u.append((u - self._rate) / (1.0 - self._rate))
            queue = queues[i]
            due = [e for e in queue if e[0] <= t]
            if due:
                queue = [e for e in queue if e[0] > t]
            calls = [e[1] for e in due]
            if arrived:
                calls.append(0)
            if down:
                limit = 0
            elif circuit_open:
                limit = 1 if i == probe else 0
            elif bc is not None:
                limit = bc["pace"]
            else:
                limit = len(calls)
            if limit < len(calls):
                for attempts in calls[limit:]:
                    if len(queue) < queue_cap:
                        queue.append([t + 1, attempts])
                    else:
                        dropped += 1
                calls = calls[:limit]
            queues[i] = queue
            sends.append(calls)

        offered = sum(len(c) for c in sends)
        if offered:
            cost = 1.0 + state["latency"]
            load = offered * cost
            if load <= cap:
                ratio = 1.0
            else:
                goodput = max(0.0, cap - self._thrash * (load - cap))
                ratio = goodput / load
        else:
            ratio = 1.0

        jitter = state["jitter"]
        failures = 0
        served = 0
        for i in range(n):
            calls = sends[i]
            if not calls:
                continue
            share = len(calls) * ratio
            ok = int(share)
            if serve_u[i] < share - ok:
                ok += 1
            served += ok
            if ok >= len(calls):
                continue
            queue = queues[i]
            for j, attempts in enumerate(calls[ok:]):
                failures += 1
                made = attempts + 1
                if made >= self._max_attempts:
                    dropped += 1
                    continue
                wait = self._backoff[made]
                if jitter is not None:
                    u = shocks.agent(i, t, f"jitter{j}")
                    wait = max(1, round(wait * (1.0 - jitter["spread"] * u)))
                if len(queue) < queue_cap:
                    queue.append([t + wait, made])
                else:
                    dropped += 1

        state["served"] += served
        state["failed_calls"] += failures
        state["dropped"] += dropped
        if failures:
            state["last_failure"] = t
            if bc is not None:
                state["circuit_until"] = t + 1 + bc["cooldown"]
        state["tick"] = t + 1
