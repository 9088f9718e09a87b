"""A cohort world's ``override`` as the run-fork half's starter takes it: the fork of a run
whose decisive step is served another result (``--override-result``), or runs live with
another input (``--override-input``).

- ``part: result``: the fork inherits the steps up to *and including* the decisive step,
  whose recorded result (or failure) is replaced by the value; it continues live after
  it. The receipt's prefix digest covers the replaced result.
- ``part: input``: the fork inherits the steps before the decisive step, as every world
  does, and the decisive step runs live with the value as its first argument (under the
  world's tool policy: a blocked tool stays blocked, whatever its input).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from forklab.activities.runfork.fork_start import ForkError
from forklab.activities.runfork.overrides import make_override
from forklab.experiments.cohort.plan import CohortRun
from forklab.experiments.cohort.spec import ForkWorld, OverridePart
from forklab.experiments.runfork.overrides import ResultOverride


@dataclass(frozen=True)
class ForkOverride:
    """Where a world's fork of a run starts and what it replaces there."""

    at_step: int
    result: ResultOverride | None = None
    input: tuple[int, Any] | None = None


def fork_override(run: CohortRun, world: ForkWorld) -> ForkOverride:
    """The fork of ``run`` in ``world``: at the run's fork point, or (a result override)
    one step later with the decisive step's result replaced. The plan excludes runs with
    no decisive step when a world overrides one (``plan_cohort``)."""
    override = world.override
    if override is None:
        return ForkOverride(at_step=run.at_step)
    if run.decisive_step is None:
        raise ForkError(
            f"run {run.workflow_id} has no decisive step for world {world.name}'s override"
        )
    if override.part is OverridePart.result:
        return ForkOverride(
            at_step=run.decisive_step,
            result=make_override(run.decisive_step, override.value),
        )
    return ForkOverride(at_step=run.at_step, input=(run.decisive_step, override.value))
