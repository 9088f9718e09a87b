"""A workload whose worlds cost time per step, as a forked agent run's model and tool calls do.

``examples/flaky_tool.py``'s agent (items, a flaky tool, a backup that costs a step) with a
pause of ``call_ms`` milliseconds at every step after the fork: the prefix runs once and
fast, every world pays per step. ``bench/sequential_durable.py`` uses it to show where a
sequential design saves world-seconds on the durable path: when an episode costs more than
the design's fixed costs (a sandbox per chunk of a wave, a look per wave).
"""

import time
from collections.abc import Mapping
from typing import Any, ClassVar

from forklab.runtime.crn import Shocks
from forklab.runtime.workload import Feature, State, Workload, WorkloadError


class SlowTool(Workload):
    name = "slow-tool"
    default_params: ClassVar[Mapping[str, Any]] = {
        "items": 4,
        "budget": 7,
        "fork_at": 2,
        "p_fail": 0.35,
        "p_fail_backup": 0.1,
        "call_ms": 2.0,
    }
    interventions: ClassVar[Mapping[str, Mapping[str, Any]]] = {"switch-to-backup": {}}
    feature_types: ClassVar[Mapping[str, Any]] = {"failed_last": bool}

    def check_params(self) -> None:
        value = self.params["call_ms"]
        if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= 1000:
            raise WorkloadError("workload.params.call_ms", "must be a number in [0, 1000]")

    def initial_state(self, episode_seed: int, shocks: Shocks) -> State:
        return {"step": 0, "items_done": 0, "tool": "primary", "failed_last": False}

    def boundary(self, state: State) -> int:
        return int(self.params["fork_at"])

    def cursor(self, state: State) -> int:
        return int(state["step"])

    def step(self, state: State, shocks: Shocks) -> None:
        state["step"] += 1
        if state["step"] > self.params["fork_at"]:
            time.sleep(self.params["call_ms"] / 1000)  # the world's model and tool call
        luck = shocks.exogenous(0, state["step"], "tool-luck")
        p_fail = self.params["p_fail" if state["tool"] == "primary" else "p_fail_backup"]
        state["failed_last"] = luck < p_fail
        if not state["failed_last"]:
            state["items_done"] += 1

    def done(self, state: State) -> bool:
        return bool(
            state["items_done"] >= self.params["items"] or state["step"] >= self.params["budget"]
        )

    def outcome(self, state: State) -> bool:
        return bool(state["items_done"] >= self.params["items"])

    def schedule_shocks(self, state: State, shocks: Shocks) -> None:
        # Commit every world to the same luck for every step the budget allows.
        for step in range(state["step"] + 1, self.params["budget"] + 1):
            shocks.exogenous(0, step, "tool-luck")

    def features(self, state: State) -> dict[str, Feature]:
        return {"failed_last": state["failed_last"]}

    def intervene(self, state: State, name: str, params: Mapping[str, Any], shocks: Shocks) -> None:
        state["tool"] = "backup"
        state["step"] += 1  # switching costs one step of the budget
