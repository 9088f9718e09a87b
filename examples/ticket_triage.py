"""A third-party workload: a support agent working one customer's ticket.

Lives outside ForkLab and is loaded by import path (``ticket_triage:TicketTriage``),
written from docs/workloads.md alone. Every episode is its own customer: the ticket
number, the customer's tier, patience and the ticket's difficulty come from the episode
seed, so no two episodes share a state. Each turn the agent works on the ticket; the
customer may lose patience and leave. The interventions at the fork turn:

- ``escalate``: hand the ticket to a senior agent (solves more per turn; the handoff
  costs a turn and some of the customer's mood);
- ``clarify``: ask the customer to restate the problem (a misunderstood ticket becomes
  understood; costs a turn);
- ``log-note``: write an internal note nobody reads (the placebo);
- ``rush``: skip the checks and close fast (known harmful: a rushed fix often fails).
"""

import random
from collections.abc import Mapping
from typing import Any, ClassVar

from forklab.runtime.crn import Shocks
from forklab.runtime.workload import Feature, State, Workload, WorkloadError

TIERS = ("free", "pro", "enterprise")


class TicketTriage(Workload):
    name = "ticket-triage"
    default_params: ClassVar[Mapping[str, Any]] = {
        "max_turns": 12,
        "fork_turn": 3,
        "p_solve": 0.5,
        "p_solve_senior": 0.75,
        "p_leave": 0.25,
    }
    interventions: ClassVar[Mapping[str, Mapping[str, Any]]] = {
        "escalate": {},
        "clarify": {},
        "log-note": {},
        "rush": {},
    }
    feature_types: ClassVar[Mapping[str, Any]] = {
        "tier": str,
        "misunderstood": bool,
        "mood": float,
        "progress": int,
    }
    max_steps = 100

    def check_params(self) -> None:
        for key in ("max_turns", "fork_turn"):
            value = self.params[key]
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise WorkloadError(f"workload.params.{key}", "must be a non-negative integer")
        for key in ("p_solve", "p_solve_senior", "p_leave"):
            value = self.params[key]
            number = isinstance(value, int | float) and not isinstance(value, bool)
            if not number or not 0.0 <= value <= 1.0:
                raise WorkloadError(f"workload.params.{key}", "must be a probability in [0, 1]")
        if self.params["max_turns"] <= self.params["fork_turn"]:
            raise WorkloadError("workload.params.fork_turn", "must be smaller than max_turns")

    def initial_state(self, episode_seed: int, shocks: Shocks) -> State:
        rng = random.Random(episode_seed)
        return {
            "ticket": rng.randrange(10**9),
            "tier": rng.choice(TIERS),
            "difficulty": round(rng.uniform(3.2, 6.0), 3),
            "patience": round(rng.uniform(0.5, 1.0), 3),
            "misunderstood": rng.random() < 0.3,
            "turn": 0,
            "progress": 0,
            "mood": 1.0,
            "senior": False,
            "rushed": False,
            "left": False,
            "notes": [],
        }

    def boundary(self, state: State) -> int:
        return int(self.params["fork_turn"])

    def cursor(self, state: State) -> int:
        return int(state["turn"])

    def step(self, state: State, shocks: Shocks) -> None:
        state["turn"] += 1
        turn = state["turn"]
        # The customer's reply and the fix's luck are exogenous: every world sees the
        # same values at the same turn.
        work = shocks.exogenous(0, turn, "work")
        reply = shocks.exogenous(0, turn, "reply")
        p_solve = self.params["p_solve_senior" if state["senior"] else "p_solve"]
        if state["misunderstood"]:
            p_solve *= 0.3
        if state["rushed"]:
            p_solve = min(1.0, p_solve * 2.0)
        if work < p_solve:
            state["progress"] += 1
        else:
            state["mood"] = round(state["mood"] - 0.1 * (1.5 - state["patience"]), 6)
        if state["rushed"] and reply < 0.5:
            state["progress"] = 0  # the rushed fix did not hold: back to the start
        # a customer is patient at first: only a mood below 0.7 (three failed turns at
        # the least, so never before the fork turn) makes them think of leaving
        leave = self.params["p_leave"] * (1.0 - state["mood"]) * 2.0 if state["mood"] < 0.7 else 0.0
        if state["tier"] == "enterprise":
            leave /= 2
        state["left"] = reply < leave

    def done(self, state: State) -> bool:
        return bool(
            state["left"]
            or state["progress"] >= state["difficulty"]
            or state["turn"] >= self.params["max_turns"]
        )

    def outcome(self, state: State) -> bool:
        return bool(not state["left"] and state["progress"] >= state["difficulty"])

    def schedule_shocks(self, state: State, shocks: Shocks) -> None:
        # Commit every world to the same luck for every turn there can be (an
        # intervention may cost one turn, so one more than the budget).
        for turn in range(state["turn"] + 1, self.params["max_turns"] + 2):
            shocks.exogenous(0, turn, "work")
            shocks.exogenous(0, turn, "reply")

    def features(self, state: State) -> dict[str, Feature]:
        return {
            "tier": state["tier"],
            "misunderstood": state["misunderstood"],
            "mood": state["mood"],
            "progress": state["progress"],
        }

    def intervene(self, state: State, name: str, params: Mapping[str, Any], shocks: Shocks) -> None:
        if name == "escalate":
            state["senior"] = True
            state["turn"] += 1  # the handoff costs a turn
            state["mood"] = round(state["mood"] - 0.05, 6)
        elif name == "clarify":
            state["misunderstood"] = False
            state["turn"] += 1  # asking costs a turn
        elif name == "log-note":
            state["notes"].append(f"ticket {state['ticket']}: looked at turn {state['turn']}")
        elif name == "rush":
            state["rushed"] = True
