"""A support-ticket workload, and one subclass per mistake a newcomer makes with it.

Standard library + the runtime only (it also runs inside sandboxes). The line of each
mistake carries a ``MISTAKE:`` marker, so the tests can name its ``file:line``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from forklab.runtime.crn import Shocks
from forklab.runtime.workload import Feature, State, Workload


class SupportTicket(Workload):
    """An agent works a ticket in up to ``budget`` tries; a try fails with ``p_fail``. The
    tries up to the fork only triage; a later one that does not fail solves the ticket.
    ``escalate`` at the fork multiplies the failure chance of later tries by ``factor``."""

    name = "support-ticket"
    default_params: ClassVar[Mapping[str, Any]] = {"budget": 5, "fork_at": 2, "p_fail": 0.5}
    interventions: ClassVar[Mapping[str, Mapping[str, Any]]] = {"escalate": {"factor": 0.5}}
    feature_types: ClassVar[Mapping[str, Any]] = {"consec_fails": int, "last_error": str | None}

    def initial_state(self, episode_seed: int, shocks: Shocks) -> State:
        return {"tries": 0, "solved": False, "consec_fails": 0, "p": self.params["p_fail"]}

    def boundary(self, state: State) -> int:
        return int(self.params["fork_at"])

    def cursor(self, state: State) -> int:
        return int(state["tries"])

    def step(self, state: State, shocks: Shocks) -> None:
        state["tries"] += 1
        if shocks.exogenous(0, state["tries"], "answer") < state["p"]:
            state["consec_fails"] += 1
        elif state["tries"] > self.params["fork_at"]:  # before the fork, tries only triage
            state["solved"] = True
        else:
            state["consec_fails"] = 0

    def done(self, state: State) -> bool:
        return bool(state["solved"] or state["tries"] >= self.params["budget"])

    def outcome(self, state: State) -> bool:
        return bool(state["solved"])

    def features(self, state: State) -> dict[str, Feature]:
        failing = state["consec_fails"] > 0
        return {"consec_fails": state["consec_fails"], "last_error": "timeout" if failing else None}

    def intervene(self, state: State, name: str, params: Mapping[str, Any], shocks: Shocks) -> None:
        state["p"] = state["p"] * params["factor"]


class OutcomeCount(SupportTicket):
    def outcome(self, state: State) -> bool:
        return state["tries"]  # type: ignore[no-any-return]  # MISTAKE: a count, not a bool


class OutcomeMaybe(SupportTicket):
    def outcome(self, state: State) -> bool:
        return True if state["solved"] else None  # type: ignore[return-value]  # MISTAKE


class OutcomeLabel(SupportTicket):
    def outcome(self, state: State) -> bool:
        return "solved" if state["solved"] else "open"  # type: ignore[return-value]  # MISTAKE


class SetInState(SupportTicket):
    def step(self, state: State, shocks: Shocks) -> None:
        super().step(state, shocks)
        state["seen"] = {state["tries"]}  # MISTAKE: a set is not JSON


class StepRaises(SupportTicket):
    def step(self, state: State, shocks: Shocks) -> None:
        state["tries"] += 1
        if state["tries"] == 2:
            del state["consec_fails"]
        state["consec_fails"] += 1  # MISTAKE: the key is gone in try 2


class FeatureSometimes(SupportTicket):
    def features(self, state: State) -> dict[str, Feature]:
        feats: dict[str, Feature] = {"consec_fails": state["consec_fails"]}
        if state["consec_fails"]:
            feats["last_error"] = "timeout"  # MISTAKE: only when failing
        return feats


class FeatureNone(SupportTicket):
    """Returns ``None`` for ``last_error`` while declaring it ``str`` (not ``str | None``)."""

    feature_types: ClassVar[Mapping[str, Any]] = {"consec_fails": int, "last_error": str}


class RecordsParams(SupportTicket):
    """Keeps the params ``intervene`` received in the state, for the defaults test."""

    def intervene(self, state: State, name: str, params: Mapping[str, Any], shocks: Shocks) -> None:
        state["got"] = dict(params)
