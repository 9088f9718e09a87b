"""``counter-recovery``: an agent counts to a target through a sensor that may stick.

The agent reads an observation, increments a counter and declares done when the
observation says ``target``. Some runs have budget slack; in some the sensor sticks
at a value, so the agent overshoots, which cannot be undone. Success: the agent
declared done with the true value at ``target``. ``refresh`` costs one action,
un-sticks the sensor and re-reads the true value; ``null-refresh`` costs the action
and does nothing else (the mechanism control). With ``noise`` > 0 the agent misreads
the observation by one with that probability (an agent draw of the common random
numbers, so every world shares the same misreads).

Without noise it also has batch methods (``docs/workloads.md``): the local twin then
simulates a chunk of episodes at once over columns — the same fields, ``freeze_at``
split into ``freeze_at`` and ``no_freeze`` (for ``None``) — with the same seeding and
the same arithmetic, step for step.
"""

from __future__ import annotations

import _random
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar

from forklab.runtime.crn import Shocks
from forklab.runtime.workload import Column, Columns, Feature, State, Workload, WorkloadError

#: The fields every episode starts with, before its seeded budget and freeze (one place
#: for the scalar and the batch methods, which must start the same episode).
_START: Mapping[str, Any] = {
    "v": 0,
    "obs": 0,
    "steps": 0,
    "done": False,
    "declared": False,
    "frozen": False,
    "same_obs": False,
}


def _choice(bits: Callable[[int], int], seq: Sequence[Any]) -> Any:
    """``random.Random.choice`` over ``bits`` (its ``getrandbits``): the same rejection
    sampling of ``len(seq).bit_length()`` bits, so the same element for the same words."""
    n = len(seq)
    k = n.bit_length()
    r = bits(k)
    while r >= n:
        r = bits(k)
    return seq[r]


def _is_int(value: Any) -> bool:
    """An integer, and not a bool (``True`` is an ``int`` to Python, not to a spec)."""
    return isinstance(value, int) and not isinstance(value, bool)


class CounterRecovery(Workload):
    name = "counter-recovery"
    default_params: ClassVar[Mapping[str, Any]] = {
        "target": 6,
        "fork_step": 3,
        "budget_base": 7,
        "slack_choices": [0, 0, 1, 2],
        "freeze_choices": [None, None, 1, 2],
        "noise": 0.0,
    }
    interventions: ClassVar[Mapping[str, Mapping[str, Any]]] = {"refresh": {}, "null-refresh": {}}
    feature_types: ClassVar[Mapping[str, Any]] = {"obs_repeated": bool}
    max_steps = 10_000

    def check_params(self) -> None:
        p = self.params
        for key in ("target", "fork_step", "budget_base"):
            if not _is_int(p[key]) or p[key] < 0:
                raise WorkloadError(f"workload.params.{key}", "must be a non-negative integer")
        for key in ("slack_choices", "freeze_choices"):
            if not isinstance(p[key], list) or not p[key]:
                raise WorkloadError(f"workload.params.{key}", "must be a non-empty list")
        if not all(_is_int(s) and s >= 0 for s in p["slack_choices"]):
            raise WorkloadError("workload.params.slack_choices", "entries must be integers ≥ 0")
        if not all(f is None or _is_int(f) for f in p["freeze_choices"]):
            raise WorkloadError(
                "workload.params.freeze_choices", "entries must be integers or null"
            )
        noise = p["noise"]
        if isinstance(noise, bool) or not isinstance(noise, int | float) or not 0.0 <= noise < 0.5:
            raise WorkloadError("workload.params.noise", "must be a probability in [0, 0.5)")
        self._target: int = p["target"]
        self._noise = float(noise)

    def initial_state(self, episode_seed: int, shocks: Shocks) -> State:
        # The draw order (slack, then freeze) matches the seed's reference world exactly:
        # random.Random(episode_seed).choice, twice, spelled out on the C generator (the
        # same seeding and words, without the Python layers around them).
        bits = _random.Random(episode_seed).getrandbits
        budget = self.params["budget_base"] + _choice(bits, self.params["slack_choices"])
        freeze_at = _choice(bits, self.params["freeze_choices"])
        return {
            **_START,
            "budget": budget,
            "freeze_at": freeze_at,
        }

    def boundary(self, state: State) -> int:
        return int(self.params["fork_step"])

    def cursor(self, state: State) -> int:
        return int(state["steps"])

    def step(self, state: State, shocks: Shocks) -> None:
        if state["done"] or state["steps"] >= state["budget"]:
            state["done"] = True
            return
        state["steps"] += 1
        seen = state["obs"]
        if self._noise and shocks.agent(0, state["steps"], "misread") < self._noise:
            # The noisy agent misreads the observation by one, either way.
            seen += 1 if shocks.agent(0, state["steps"], "misread-sign") < 0.5 else -1
        if seen >= self._target:
            state["done"] = state["declared"] = True
            return
        state["v"] += 1
        if state["freeze_at"] == state["v"]:
            state["frozen"] = True
        prev = state["obs"]
        if not state["frozen"]:
            state["obs"] = state["v"]
        state["same_obs"] = state["obs"] == prev

    def done(self, state: State) -> bool:
        return bool(state["done"])

    def outcome(self, state: State) -> bool:
        return bool(state["declared"] and state["v"] == self._target)

    def features(self, state: State) -> dict[str, Feature]:
        return {"obs_repeated": bool(state["same_obs"])}

    def intervene(self, state: State, name: str, params: Mapping[str, Any], shocks: Shocks) -> None:
        state["steps"] += 1  # both variants burn an action from the budget
        if name == "refresh":
            state["frozen"] = False
            state["obs"] = state["v"]

    # --- batch methods (noise 0: nothing random after the seeding) --------------------
    def batch_ok(self) -> bool:
        # Columns hold int64: a huge int would not fit (check_params refuses booleans,
        # which a column would give back as 0 or 1)
        p = self.params
        numbers = [p["target"], p["fork_step"], p["budget_base"], *p["slack_choices"]]
        numbers += [f for f in p["freeze_choices"] if f is not None]
        return not self._noise and all(abs(x) < 2**40 for x in numbers)

    def batch_initial(self, episode_seeds: Sequence[int]) -> Mapping[str, Sequence[Any] | Any]:
        # initial_state's two choices (``_choice`` of an index) on one C generator
        # reseeded per episode: ``seed(s)`` is ``_random.Random(s)``'s own seeding, so the
        # words are the same.
        base = self.params["budget_base"]
        slacks, freezes = self.params["slack_choices"], self.params["freeze_choices"]
        slack_at: list[int] = []
        freeze_at: list[int] = []
        rng = _random.Random()
        reseed, bits = rng.seed, rng.getrandbits
        slack_range, freeze_range = range(len(slacks)), range(len(freezes))
        for episode_seed in episode_seeds:
            reseed(episode_seed)
            slack_at.append(_choice(bits, slack_range))
            freeze_at.append(_choice(bits, freeze_range))
        freeze_of = [0 if f is None else f for f in freezes]
        return {
            **_START,
            "budget": [base + slacks[i] for i in slack_at],
            "freeze_at": [freeze_of[i] for i in freeze_at],
            "no_freeze": [freezes[i] is None for i in freeze_at],
        }

    def batch_boundary(self, cols: Columns) -> int:
        return int(self.params["fork_step"])

    def batch_cursor(self, cols: Columns) -> Column:
        return cols["steps"]

    def batch_done(self, cols: Columns) -> Column:
        return cols["done"]

    def batch_step(self, cols: Columns, active: Column) -> None:
        # ``step`` over columns: each ``if`` of the scalar method becomes a mask.
        steps, obs, v = cols["steps"], cols["obs"], cols["v"]
        ending = active & (cols["done"] | (steps >= cols["budget"]))
        cols["done"] |= ending
        going = active & ~ending
        steps += going
        declaring = going & (obs >= self._target)
        cols["done"] |= declaring
        cols["declared"] |= declaring
        moving = going & ~declaring
        v += moving
        frozen = cols["frozen"]
        frozen |= moving & ~cols["no_freeze"] & (cols["freeze_at"] == v)
        reading = moving & ~frozen
        same = cols["same_obs"]
        same[moving] = True  # a frozen sensor repeats its reading
        same[reading] = (v == obs)[reading]
        obs[reading] = v[reading]

    def batch_intervene(
        self, cols: Columns, name: str, params: Mapping[str, Any], where: Column
    ) -> None:
        cols["steps"] += where
        if name == "refresh":
            cols["frozen"] &= ~where
            cols["obs"][where] = cols["v"][where]

    def batch_outcome(self, cols: Columns) -> Column:
        return cols["declared"] & (cols["v"] == self._target)

    def batch_state(self, cols: Columns, index: int) -> State:
        no_freeze = bool(cols["no_freeze"][index])
        return {
            "v": int(cols["v"][index]),
            "obs": int(cols["obs"][index]),
            "steps": int(cols["steps"][index]),
            "done": bool(cols["done"][index]),
            "declared": bool(cols["declared"][index]),
            "frozen": bool(cols["frozen"][index]),
            "same_obs": bool(cols["same_obs"][index]),
            "budget": int(cols["budget"][index]),
            "freeze_at": None if no_freeze else int(cols["freeze_at"][index]),
        }
