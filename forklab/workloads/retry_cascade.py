"""``retry-cascade``: a fleet of agents shares one upstream that suffers an outage.

Each tick every agent may receive one unit of work and calls the upstream for it. A call
that fails is retried by the same agent after a capped exponential backoff, and nobody
else hears about it. The upstream serves a noisy number of calls per tick, loses a few
calls to background errors and has the odd one-tick brown-out, so the fleet reaches the
outage in different shapes. When the offered load exceeds what it can serve it thrashes:
its goodput falls as the overload grows. After the outage the synchronised backlog of
retries can keep it overloaded, and the storm sustains itself until requests run out of
attempts or retry-queue room and are dropped.

The fork boundary is the outage onset. Success: the fleet met its SLO, i.e. at most
``slo_lost`` requests were lost over the episode, where a request is lost when it is
dropped or is still waiting in a retry queue at the horizon. The model, every
intervention and the exact failure definition are in ``docs/retry-cascade.md``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from math import floor
from typing import Any, ClassVar

from forklab.runtime.crn import Block, Shocks
from forklab.runtime.workload import Feature, State, Workload, WorkloadError

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
_UPSTREAM = -1  # the entity of the shared upstream's shocks; agents are 0..agents-1
_LANE_BITS = 6
_LANE_MASK = (1 << _LANE_BITS) - 1
_LANES = 8  # 8 lanes x 6 bits fit in the 53 bits of one uniform draw
_WORD = float(1 << 53)
_BROADCAST = ("pace", "trip", "cooldown")
#: While ``step`` runs, a queued call is one int, ``attempts << _AGENT_BITS | agent``
#: (the state's ``[agent, attempts]`` pair; a new call is its agent's number), so that a
#: failed call is requeued as ``call + _ATTEMPT``, with no list made per call.
_AGENT_BITS = 6  # agents are 0..63
_AGENT = (1 << _AGENT_BITS) - 1
_ATTEMPT = 1 << _AGENT_BITS
_NONE: tuple[int, ...] = ()
#: A tick's shocks, decoded: serve offset, capacity unless in the outage, each agent's
#: new work (``(i,)``, its new call, or ``_NONE``: its calls if it has no due retry), how
#: many got work, and the calls the upstream fails when those are all it is offered and
#: it copes (as ``step`` lists failed calls: agent, its calls, how many were served).
_Failed = tuple[int, Sequence[int], int]
_Tick = tuple[float, float, tuple[tuple[int, ...], ...], int, tuple[_Failed, ...]]
#: How many distinct tick parts ``_tick_shocks`` keeps to share (8 agents have 2**8
#: patterns of arrivals; a fleet of 64 agents shares only the first ones it meets).
_SHARED = 4096
_FRACTIONS = (
    "arrival_rate",
    "error_rate",
    "capacity_noise",
    "dip_prob",
    "dip_factor",
    "outage_capacity",
)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _coded(retries: list[list[list[int]]]) -> list[list[int]]:
    """The state's retry queues as ``step`` keeps them (see ``_ATTEMPT``)."""
    return [[attempts << _AGENT_BITS | agent for agent, attempts in due] for due in retries]


def _decoded(retries: list[list[int]]) -> list[list[list[int]]]:
    """``step``'s retry queues as the state keeps them: ``[agent, attempts]`` pairs."""
    return [[[call & _AGENT, call >> _AGENT_BITS] for call in due] for due in retries]


class RetryCascade(Workload):
    name = "retry-cascade"
    default_params: ClassVar[Mapping[str, Any]] = {
        "agents": 8,
        "horizon": 90,
        "onset_min": 20,
        "onset_max": 40,
        "outage_min": 1,
        "outage_max": 6,
        "arrival_rate": 0.5,
        "capacity": 9.0,
        "capacity_noise": 0.15,
        "error_rate": 0.05,
        "dip_prob": 0.06,
        "dip_factor": 0.4,
        "outage_capacity": 0.0,
        "thrash": 1.0,
        "max_attempts": 5,
        "backoff_base": 1,
        "backoff_cap": 8,
        "queue_cap": 6,
        "slo_lost": 40,
    }
    interventions: ClassVar[Mapping[str, Mapping[str, Any]]] = {
        "jitter": {"spread": 1.0},
        "broadcast": {"cooldown": 2, "pace": 1, "trip": 0.5},
        "queue-memory": {"factor": 2},
        "latency": {"extra": 0.06},
        "broadcast-jitter": {"cooldown": 2, "pace": 1, "trip": 0.5, "spread": 1.0},
        "restart": {"downtime": 2},
        "placebo": {},
    }
    feature_types: ClassVar[Mapping[str, Any]] = {
        "queue_depth": int,
        "agents_in_retry": int,
        "upstream": str,
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
        # An agent gets work when its 6-bit lane is below this, so P = ceil(64 rate) / 64.
        self._arrival_lane = float(p["arrival_rate"]) * (1 << _LANE_BITS)
        # Agents per group of arrivals, and each pair of 6-bit lanes -> whether the two
        # agents get new work (bit 0 or 1 set when that lane is below the threshold), low
        # lane first.
        self._lanes = [min(_LANES, self._n - g * _LANES) for g in range(-(-self._n // _LANES))]
        work = [int(k < self._arrival_lane) for k in range(1 << _LANE_BITS)]
        self._two_lanes = [
            work[k & _LANE_MASK] | work[k >> _LANE_BITS] << 1 for k in range(1 << 2 * _LANE_BITS)
        ]
        # Who got work (bit i: agent i) -> (``fresh``, how many): one object per pattern,
        # so equal ticks share it (a run kept for a group's worlds holds each once), as do
        # an agent's unserved new call and the unserved calls of a tick.
        self._fresh: dict[int, tuple[tuple[tuple[int, ...], ...], int]] = {}
        self._new: list[tuple[int, ...]] = [(i,) for i in range(self._n)]
        self._unserved_call: list[_Failed] = [(i, self._new[i], 0) for i in range(self._n)]
        self._unserved: dict[tuple[_Failed, ...], tuple[_Failed, ...]] = {}
        # The draws of every tick, as one block: the worlds of an episode share its decoding.
        self._shocks = Block(
            [(_UPSTREAM, "capacity"), (_UPSTREAM, "serve")]
            + [(group, "work") for group in range(len(self._lanes))],
            self._tick_shocks,
        )
        self._capacity = float(p["capacity"])
        self._noise = float(p["capacity_noise"])
        self._dip_prob = float(p["dip_prob"])
        self._dip_factor = float(p["dip_factor"])
        self._outage_capacity = float(p["outage_capacity"])
        self._outage_cap = self._capacity * self._outage_capacity
        self._jitter_streams: list[str] = []  # "jitter<j>": the agent stream of a j-th retry
        self._thrash = float(p["thrash"])
        self._healthy = 1.0 - float(p["error_rate"])
        # backoff after the k-th failed attempt (k = 1..max_attempts-1), in ticks; 0 after
        # the last one (the call is dropped)
        self._backoff = [
            min(p["backoff_base"] << min(max(k - 1, 0), 30), p["backoff_cap"])
            for k in range(p["max_attempts"])
        ] + [0]
        self._backoff_cap: int = p["backoff_cap"]
        # For a call (as ``step`` codes it, see ``_ATTEMPT``) that fails once more: its
        # backoff (0 when that attempt was its last: it is dropped), and without jitter
        # the index of its slot in ``step``'s queues (the backoff minus one; -1: dropped).
        self._wait = [
            self._backoff[(c >> _AGENT_BITS) + 1] for c in range(p["max_attempts"] << _AGENT_BITS)
        ]
        self._requeue = [wait - 1 for wait in self._wait]

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
            elif key in ("spread", "trip"):
                if not _is_number(value) or not 0.0 <= value <= 1.0:
                    raise WorkloadError(field, "must be a number in [0, 1]")
            elif key == "extra" and (not _is_number(value) or not 0.0 <= value <= 100.0):
                raise WorkloadError(field, "must be a number in [0, 100]")
        return merged

    # --- episode -----------------------------------------------------------------------
    def initial_state(self, episode_seed: int, shocks: Shocks) -> State:
        p = self.params
        # The outage belongs to the upstream (entity _UPSTREAM); both draws are at tick 0.
        span = p["onset_max"] - p["onset_min"] + 1
        onset = p["onset_min"] + int(shocks.exogenous(_UPSTREAM, 0, "onset") * span)
        span = p["outage_max"] - p["outage_min"] + 1
        duration = p["outage_min"] + int(shocks.exogenous(_UPSTREAM, 0, "duration") * span)
        return {
            "tick": 0,
            "onset": onset,
            "outage_end": onset + duration,
            "retries": [],
            "depth": [0] * self._n,
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
        return int(state["dropped"]) + sum(state["depth"])

    def outcome(self, state: State) -> bool:
        return self.lost(state) <= int(self.params["slo_lost"])

    def features(self, state: State) -> dict[str, Feature]:
        depth = state["depth"]
        recent = state["last_failure"] >= 0 and state["tick"] - state["last_failure"] <= 3
        return {
            "queue_depth": sum(depth),
            "agents_in_retry": len(depth) - depth.count(0),
            "upstream": "degraded" if recent else "healthy",
        }

    def intervene(self, state: State, name: str, params: Mapping[str, Any], shocks: Shocks) -> None:
        p = self.intervention_params(name, params)
        tick = int(state["tick"])
        if name in ("jitter", "broadcast-jitter"):
            state["jitter"] = {"spread": float(p["spread"])}
        if name in ("broadcast", "broadcast-jitter"):
            state["broadcast"] = {
                "cooldown": int(p["cooldown"]),
                "pace": int(p["pace"]),
                "trip": float(p["trip"]),
            }
        if name == "queue-memory":
            state["queue_cap"] = int(state["queue_cap"]) * int(p["factor"])
        elif name == "latency":
            state["latency"] = float(p["extra"])
        elif name == "restart":
            # In-memory retry queues die with the agents: that work is lost.
            state["dropped"] += sum(state["depth"])
            state["retries"] = []
            state["depth"] = [0] * self._n
            state["down_until"] = tick + int(p["downtime"])
        elif name == "placebo":
            # Randomised but inert: a draw from the placebo's own agent stream (so the
            # exogenous fingerprint is untouched), stored where nothing reads it.
            state["placebo_token"] = shocks.agent(_UPSTREAM, tick, "placebo")

    def world_blocks(self, state: State) -> Sequence[tuple[Block[_Tick], int, int]]:
        """A world's one ``step`` draws the block at every tick from the checkpoint's
        tick to the horizon (as ``step`` works out its ``start`` and ``stop``)."""
        start: int = state["tick"]
        stop = state["onset"] if start < state["onset"] else self._horizon
        return [(self._shocks, start, stop)] if start < stop else []

    def _tick_shocks(self, values: tuple[float, ...]) -> _Tick:
        """What a tick's exogenous draws (``capacity``, ``serve``, then ``work`` of each
        group) decide, worked out once per episode and tick for all its worlds: see
        :data:`_Tick`."""
        u_cap, u_serve = values[0], values[1]
        if u_cap < self._dip_prob:
            cap = self._capacity * self._dip_factor  # a background brown-out
        else:
            cap = self._capacity * (
                1.0 - self._noise * (u_cap - self._dip_prob) / (1.0 - self._dip_prob)
            )
        # Arrivals: one draw per group of eight agents, split into 6-bit lanes (read two
        # lanes at a time from a table).
        mask = 0
        shift = 0
        two = self._two_lanes
        for lanes, u_work in zip(self._lanes, values[2:], strict=True):
            word = int(u_work * _WORD)
            group = (
                two[word & 0xFFF]
                | two[word >> 12 & 0xFFF] << 2
                | two[word >> 24 & 0xFFF] << 4
                | two[word >> 36 & 0xFFF] << 6
            )
            mask |= (group & ((1 << lanes) - 1)) << shift
            shift += _LANES
        known = self._fresh.get(mask)
        if known is None:
            new = self._new
            fresh = tuple([new[i] if mask >> i & 1 else _NONE for i in range(self._n)])
            known = (fresh, len(fresh) - fresh.count(_NONE))
            if len(self._fresh) < _SHARED:
                self._fresh[mask] = known
        fresh, arrived = known
        # The serving step of ``step`` for a fleet whose only calls are this new work and
        # whose upstream copes (the share served is then ``1 - error_rate``).
        unserved: list[_Failed] = []
        healthy = self._healthy
        cumulative = u_serve
        below = 0
        for i, calls in enumerate(fresh):
            if calls:
                cumulative += 1 * healthy
                upto = int(cumulative)
                if upto == below:
                    unserved.append(self._unserved_call[i])
                below = upto
        failed: tuple[_Failed, ...] = ()
        if unserved:
            failed = tuple(unserved)
            failed = self._unserved.get(failed, failed)
            if len(self._unserved) < _SHARED:
                self._unserved.setdefault(failed, failed)
        return u_serve, cap, fresh, arrived, failed

    def step(self, state: State, shocks: Shocks) -> None:
        """Run the ticks up to the boundary (in the prefix) or the horizon (in a world),
        one by one: a tick is docs/retry-cascade.md, *One tick*. Between two ticks
        nothing but ``step`` reads or changes the state, so one call runs them all."""
        # The hot loop of every world, written for CPython: the state's fields in locals
        # for the run, the ticks' shocks decoded once per episode for all worlds, the
        # retry queues kept by due tick with each call one int, a short cut for a tick in
        # which no retry is due, each failed call handled as its agent's share is worked
        # out (no second pass).
        start: int = state["tick"]
        onset: int = state["onset"]
        stop = onset if start < onset else self._horizon
        if start >= stop:
            return
        # Exogenous shocks first: every tick and every agent, whatever the fleet does.
        ticks = shocks.exogenous_blocks(self._shocks, start, stop)
        # The outage, if any of it is left, takes the first ticks of a world (the prefix
        # stops at the onset): ``outage`` of them.
        outage = max(state["outage_end"] - start, 0) if start >= onset else 0
        outage_cap = self._outage_cap
        # The retry queues: ``retries[k]`` holds the calls due at tick t + k in the order
        # they were queued, as the state's ``[agent, attempts so far]`` but coded (see
        # ``_ATTEMPT``); ``depth[i]`` counts agent i's queued calls.
        retries = _coded(state["retries"])
        depth: list[int] = state["depth"]
        n = self._n
        healthy = self._healthy
        thrash = self._thrash
        wait_after = self._wait
        requeue = self._requeue
        first = requeue[0]  # a new call's slot when it fails (-1: dropped, one attempt)
        streams = self._jitter_streams
        cost = 1.0 + state["latency"]
        queue_cap: int = state["queue_cap"]
        down_until: int = state["down_until"]
        jitter = state["jitter"]
        spread = 0.0 if jitter is None else jitter["spread"]
        bc = state["broadcast"]
        pace, trip, cooldown = (0, 0.0, 0) if bc is None else (bc[k] for k in _BROADCAST)
        circuit_until: int = state["circuit_until"]
        last_failure: int = state["last_failure"]
        all_served = all_failed = all_dropped = 0
        draw = shocks.agent
        rounded = float.__round__  # round() of a float, without the builtin's dispatch
        attempt, agent_mask, floor_of = _ATTEMPT, _AGENT, floor  # (locals cost less)
        # The queues padded with empty slots to the longest wait a call can get (jitter
        # scales a backoff by less than 1 + spread / 2 <= 1.5), so a held or failed call
        # goes straight to its slot; the padding is trimmed again at the end (the state's
        # last slot is never empty).
        longest = self._backoff_cap if jitter is None else int(self._backoff_cap * 1.5) + 1
        if len(retries) < longest:
            retries += [[] for _ in range(longest - len(retries))]
        if jitter is not None:
            # The names of the streams an agent's failed calls of one tick draw from: as
            # many as it can send (its queue never grows past the larger of the cap and
            # where it starts, plus one new call).
            most = max(queue_cap, *depth) + 1
            if len(streams) < most:
                streams.extend(f"jitter{j}" for j in range(len(streams), most))
        t = start
        for u_serve, cap, fresh, arrived, unserved in ticks:
            if outage:
                cap = outage_cap
                outage -= 1
            due = retries.pop(0)
            retries.append([])
            if (
                not due
                and arrived * cost <= cap
                and t >= down_until
                and (bc is None or t >= circuit_until)
            ):
                # No retry due and the upstream copes: each call is new work, nothing
                # holds it back (a pace is at least one call), and which calls fail is the
                # same in every world, so it was worked out with the tick's shocks.
                all_served += arrived - len(unserved)
                if not unserved:
                    t += 1
                    continue
                offered = arrived
                failures = len(unserved)
                # Each a new call that failed its first attempt (the failure handling of
                # the slow path below, for that one call).
                if jitter is None:
                    if first < 0:
                        all_dropped += failures
                    else:
                        slot = retries[first]
                        for i, _, _ in unserved:
                            if depth[i] < queue_cap:
                                slot.append(i + attempt)  # due at t + backoff[1]
                                depth[i] += 1
                            else:
                                all_dropped += 1
                elif first < 0:
                    all_dropped += failures
                else:
                    for i, _, _ in unserved:
                        if depth[i] < queue_cap:
                            u = draw(i, t, streams[0])
                            wait = rounded((first + 1) * (1.0 + spread * (u - 0.5)))
                            retries[wait - 1 if wait > 1 else 0].append(i + attempt)
                            depth[i] += 1
                        else:
                            all_dropped += 1
            else:
                # What each agent would send now: its due retries (oldest first), then
                # new work (``fresh``: never changed).
                demand: list[Sequence[int]] = list(fresh)
                calls: Sequence[int]
                offered = arrived
                if due:
                    offered += len(due)
                    retrying: dict[int, list[int]] = {}
                    for call in due:
                        i = call & agent_mask
                        if i in retrying:
                            retrying[i].append(call)
                        else:
                            retrying[i] = [call]
                    for i, mine in retrying.items():
                        depth[i] -= len(mine)
                        mine += fresh[i]
                        demand[i] = mine

                # Who may send: everyone, unless restarting or held back by the circuit;
                # then each agent sends at most ``gate`` calls (the ``probe`` agent one).
                gate = probe = -1
                if t < down_until:
                    gate = 0
                elif bc is not None:
                    if t < circuit_until:
                        # Open circuit: one agent with work (round robin) probes.
                        gate = 0
                        for k in range(n):
                            j = (t + k) % n
                            if demand[j]:
                                probe = j
                                break
                    elif offered > pace and max(map(len, demand)) > pace:
                        gate = pace  # (a pace nobody exceeds holds nothing back)
                if gate >= 0 and offered:
                    held = retries[0]
                    for i, calls in enumerate(demand):
                        limit = 1 if i == probe else gate
                        if len(calls) > limit:
                            # Held: due next tick with the same attempts, as many as the
                            # queue has room for (in order); the rest is dropped.
                            hold = calls[limit:]
                            room = queue_cap - depth[i]
                            if len(hold) > room:
                                all_dropped += len(hold) - max(room, 0)
                                hold = hold[:room] if room > 0 else _NONE
                            held += hold
                            depth[i] += len(hold)
                            demand[i] = calls[:limit]
                            offered -= len(calls) - limit

                ratio = healthy  # background errors: a small share of calls fails anyway
                if offered:
                    load = offered * cost
                    if load > cap:
                        # Thrashing: every unit of excess load costs the upstream goodput.
                        good = cap - thrash * (load - cap)
                        ratio *= (good if good > 0.0 else 0.0) / load

                failures = 0
                # Systematic rounding: agent i is served floor(C_i + u) - floor(C_{i-1} + u)
                # calls, where C_i is the running sum of the fair shares, len(calls) * ratio.
                cumulative = u_serve
                below = 0
                for i, calls in enumerate(demand):
                    if not calls:
                        continue
                    sent = len(calls)
                    if ratio:
                        cumulative += sent * ratio
                        if cumulative >= below + sent:  # floor(C_i + u) - below is all sent
                            below += sent
                            continue
                        upto = floor_of(cumulative)  # = int(), as it is never negative
                        ok = upto - below
                        below = upto
                    else:  # (u + 0 is below 1: the running sum never reaches a call)
                        ok = 0
                    failures += sent - ok
                    # Each failed call counts one more attempt and waits its backoff in
                    # the agent's queue, or is dropped (out of attempts, or queue full).
                    queued = depth[i]
                    if jitter is None:
                        for call in calls[ok:] if ok else calls:
                            slot = requeue[call]  # due at t + 1 + slot
                            if slot < 0 or queued >= queue_cap:
                                all_dropped += 1
                            else:
                                retries[slot].append(call + attempt)
                                queued += 1
                        depth[i] = queued
                        continue
                    # The agent's j-th failed call this tick draws from its own stream, and
                    # only if it is queued again: a dropped call's wait is never used (an
                    # agent draw is a pure function of its coordinates, outside the
                    # fingerprint, so skipping it changes nothing else).
                    j = 0
                    for call in calls[ok:]:
                        wait = wait_after[call]
                        if not wait or queued >= queue_cap:  # out of attempts, or no room
                            all_dropped += 1
                        else:
                            u = draw(i, t, streams[j])
                            wait = rounded(wait * (1.0 + spread * (u - 0.5)))
                            retries[wait - 1 if wait > 1 else 0].append(call + attempt)
                            queued += 1
                        j += 1  # noqa: SIM113 (enumerate costs more per call here, measured)
                    depth[i] = queued
                all_served += offered - failures  # (what was offered is served or failed)
                if not failures:
                    t += 1
                    continue
            all_failed += failures
            last_failure = t
            # The fleet shares what it sees: a failed probe, or a tick in which at least a
            # ``trip`` share of the calls failed (more than background noise), opens the
            # circuit for everyone.
            if bc is not None and (t < circuit_until or failures >= trip * offered):
                circuit_until = t + 1 + cooldown
            t += 1
        while retries and not retries[-1]:
            retries.pop()
        state["retries"] = _decoded(retries)
        state["tick"] = stop
        state["served"] += all_served
        state["failed_calls"] += all_failed
        state["dropped"] += all_dropped
        state["last_failure"] = last_failure
        state["circuit_until"] = circuit_until
