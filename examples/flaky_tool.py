"""A third-party workload: an agent working through items with a flaky tool.

Lives outside ForkLab and is loaded by import path (``flaky_tool:FlakyTool``).
Each step calls the tool on the next item; a failed call must be retried, and the
step budget is small. ``switch-to-backup`` moves to a more reliable tool, but the
switch costs one step.
"""

from collections.abc import Mapping
from typing import Any, ClassVar

from forklab.runtime.crn import Shocks
from forklab.runtime.workload import Feature, State, Workload, WorkloadError


class FlakyTool(Workload):
    name = "flaky-tool"
    default_params: ClassVar[Mapping[str, Any]] = {
        "items": 4,
        "budget": 7,
        "fork_at": 2,
        "p_fail": 0.35,
        "p_fail_backup": 0.1,
    }
    interventions: ClassVar[Mapping[str, Mapping[str, Any]]] = {"switch-to-backup": {}}
    feature_types: ClassVar[Mapping[str, Any]] = {"failed_last": bool, "items_done": int}

    def check_params(self) -> None:
        # a spec's values are whatever YAML made of them: `true` is an int to Python and
        # "0.3" is a string, so the types are checked before the values are compared
        for key in ("items", "budget", "fork_at"):
            value = self.params[key]
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise WorkloadError(f"workload.params.{key}", "must be a non-negative integer")
        for key in ("p_fail", "p_fail_backup"):
            value = self.params[key]
            number = isinstance(value, int | float) and not isinstance(value, bool)
            if not number or not 0.0 <= value <= 1.0:
                raise WorkloadError(f"workload.params.{key}", "must be a probability in [0, 1]")
        if self.params["budget"] <= self.params["fork_at"]:
            raise WorkloadError("workload.params.fork_at", "must be smaller than the budget")

    def initial_state(self, episode_seed: int, shocks: Shocks) -> State:
        return {"step": 0, "items_done": 0, "tool": "primary", "failed_last": False}

    def boundary(self, state: State) -> int:
        return int(self.params["fork_at"])

    def cursor(self, state: State) -> int:
        return int(state["step"])

    def step(self, state: State, shocks: Shocks) -> None:
        state["step"] += 1
        # The tool's luck is exogenous: every world sees the same value at the same step.
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
        return {"failed_last": state["failed_last"], "items_done": state["items_done"]}

    def intervene(self, state: State, name: str, params: Mapping[str, Any], shocks: Shocks) -> None:
        state["tool"] = "backup"
        state["step"] += 1  # switching costs one step of the budget
