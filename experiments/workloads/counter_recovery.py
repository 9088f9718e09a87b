"""``counter-recovery``: an agent counts to a target through a sensor that may stick.

The agent reads an observation, increments a counter and declares done when the
observation says ``target``. Some runs have budget slack; in some the sensor sticks
at a value, so the agent overshoots, which cannot be undone. Success: the agent
declared done with the true value at ``target``. ``refresh`` costs one action,
un-sticks the sensor and re-reads the true value; ``null-refresh`` costs the action
and does nothing else (the mechanism control). With ``noise`` > 0 the agent misreads
the observation by one with that probability (an agent draw of the common random
numbers, so every world shares the same misreads).
"""

from __future__ import annotations

import _random
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar

from experiments.runtime.crn import Shocks
from experiments.runtime.workload import Feature, State, Workload, WorkloadError


def _choice(bits: Callable[[int], int], seq: Sequence[Any]) -> Any:
    """``random.Random.choice`` over ``bits`` (its ``getrandbits``): the same rejection
    sampling of ``len(seq).bit_length()`` bits, so the same element for the same words."""
    n = len(seq)
    k = n.bit_length()
    r = bits(k)
    while r >= n:
        r = bits(k)
    return seq[r]


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
            if not isinstance(p[key], int) or isinstance(p[key], bool) or p[key] < 0:
                raise WorkloadError(f"workload.params.{key}", "must be a non-negative integer")
        for key in ("slack_choices", "freeze_choices"):
            if not isinstance(p[key], list) or not p[key]:
                raise WorkloadError(f"workload.params.{key}", "must be a non-empty list")
        if not all(isinstance(s, int) and s >= 0 for s in p["slack_choices"]):
            raise WorkloadError("workload.params.slack_choices", "entries must be integers ≥ 0")
        if not all(f is None or isinstance(f, int) for f in p["freeze_choices"]):
            raise WorkloadError(
                "workload.params.freeze_choices", "entries must be integers or null"
            )
        noise = p["noise"]
        if not isinstance(noise, int | float) or not 0.0 <= noise < 0.5:
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
            "v": 0,
            "obs": 0,
            "steps": 0,
            "done": False,
            "declared": False,
            "frozen": False,
            "same_obs": False,
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
