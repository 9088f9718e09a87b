"""Fork points by meaning for ``forklab fork --at``, and which steps of a run can be
forked exactly (``forklab steps``).

``--at`` names the step a fork re-decides — it runs live on the fork, and the fork
inherits every step before it — by what happened there rather than by a number:
``failed`` (the first failed step), ``tool:NAME`` (the last call of a tool or activity
type), ``tool:NAME#k`` (its k-th call), ``last_model_call_before_failure`` and
``step:N`` (fork at step N, as ``--at-step N``). The resolution is the cohort's
(``forklab.experiments.cohort.fork_point``), so a point means the same in a cohort spec
and on the command line; only ``tool:NAME`` without ``#k`` is the command line's own,
the *last* call (a cohort spec's ``tool:NAME`` is its first).
"""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import ValidationError

from forklab.experiments.cohort.fork_point import (
    MODEL_ACTIVITY_TYPES,
    ForkPoint,
    ForkPointKind,
    Unresolved,
    resolve_fork_point,
    tool_calls,
)
from forklab.experiments.runfork.receipt import (
    BoundaryError,
    BoundaryMode,
    PrefixEvent,
    resolve_boundary,
)
from forklab.experiments.runfork.steps import Step

AT_FORMS = "failed, tool:NAME, tool:NAME#k, last_model_call_before_failure or step:N"


class ForkAtError(ValueError):
    """A ``--at`` that is malformed or names no step of the run (one sentence)."""


def parse_at(text: str, steps: Sequence[Step]) -> ForkPoint:
    """``text`` as a fork point; ``tool:NAME`` alone becomes the tool's last call in
    ``steps`` (the run's steps)."""
    point_text = text.strip()
    if point_text.startswith("tool:") and "#" not in point_text:
        name = point_text.removeprefix("tool:")
        calls = tool_calls(steps, name, MODEL_ACTIVITY_TYPES)
        point_text = f"{point_text}#{max(len(calls), 1)}"
    try:
        return ForkPoint.model_validate(point_text)
    except ValidationError:
        raise ForkAtError(f"--at {text[:60]!r} is no fork point; write {AT_FORMS}") from None


def resolve_at(text: str, steps: Sequence[Step]) -> tuple[ForkPoint, int]:
    """The fork point ``text`` names and the step a fork there inherits up to (the step
    before the one it re-decides; ``step:N`` is N)."""
    point = parse_at(text, steps)
    found = resolve_fork_point(steps, point)
    if isinstance(found, Unresolved):
        raise ForkAtError(f"--at {point.text}: {found.reason}")
    if point.kind is ForkPointKind.step and point.step is not None:
        return point, point.step
    return point, found.at_step


def not_forkable(
    steps: Sequence[Step], events: Sequence[PrefixEvent], base_step: int
) -> dict[int, str | None]:
    """For each step N of one run (numbered after ``base_step``), why ``forklab fork
    --at-step N`` would be refused exactly (None: it forks exactly)."""
    out: dict[int, str | None] = {}
    for s in steps:
        try:
            resolve_boundary(list(steps), list(events), s.index, BoundaryMode.exact, base_step)
        except BoundaryError as exc:
            out[s.index] = exc.cause
        else:
            out[s.index] = None
    return out
