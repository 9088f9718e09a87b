"""The outcome scorers ForkLab ships for experiments over cohorts, by the name a spec's
``cohort.outcome`` gives them.

A scorer takes the fork's result (None when the fork failed), its final state (the result,
or the details of the failure it ended with) and its steps, and answers a bool or a score
in [0, 1]. These run in the worker's process; a scorer of the user's own package is
untrusted code and runs in a box (``forklab.activities.runfork.cohort_code``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

from forklab.experiments.runfork.steps import Step

Scorer = Callable[[Any, Any, Sequence[Step]], "bool | float"]


def completed(result: Any, final_state: Any, steps: Sequence[Step]) -> bool:
    """The fork's workflow completed (whatever it returned)."""
    return result is not None


def final_score(result: Any, final_state: Any, steps: Sequence[Step]) -> float:
    """The ``score`` the run's final state reports for itself (e.g. the research
    pipeline's scorer), clipped to [0, 1]; 0 when it reports none."""
    state = final_state[0] if isinstance(final_state, list) and final_state else final_state
    if not isinstance(state, dict):
        return 0.0
    score = state.get("score")
    if isinstance(score, bool) or not isinstance(score, int | float) or not math.isfinite(score):
        return 0.0
    return min(1.0, max(0.0, float(score)))


def approved(result: Any, final_state: Any, steps: Sequence[Step]) -> bool:
    """The result says ``approved: true`` (e.g. the example team's reviewer, the result
    member of a cohort of teams: ``cohort.team.result_member: TeamReviewer``)."""
    return isinstance(result, dict) and result.get("approved") is True


SHIPPED: dict[str, Scorer] = {
    "forklab.experiments.cohort.scorers:approved": approved,
    "forklab.experiments.cohort.scorers:completed": completed,
    "forklab.experiments.cohort.scorers:final_score": final_score,
}


def score_value(raw: object, threshold: float) -> tuple[float, bool]:
    """A scorer's answer as (score, success); anything but a bool or a finite number in
    [0, 1] is a ``ValueError``."""
    if isinstance(raw, bool):
        return (1.0 if raw else 0.0), raw
    if isinstance(raw, int | float) and math.isfinite(raw) and 0.0 <= raw <= 1.0:
        return float(raw), raw >= threshold
    raise ValueError(f"the scorer answered {str(raw)[:60]!r}, not a bool or a score in [0, 1]")
