"""Which held-out episodes and worlds the guard's validation runs: known from the spec
alone, before any outcome is read.

Kept apart from ``guard`` (which needs numpy and scipy) so that whoever runs the held-out
batch ahead — the durable path's box, the twin's pool — can plan it without importing
the analysis.
"""

from __future__ import annotations

from forklab.experiments.experiment.spec import ExperimentSpec, Role, World
from forklab.experiments.experiment.worlds import world_plan
from forklab.runtime.file_format import WorldPlan

#: Held-out episodes when the spec does not say: enough to read the held-out rescue and
#: harm rates to about half a percentage point (one standard error ≤ 0.5 / sqrt(10,000)),
#: while a large experiment does not pay for a second full simulation.
DEFAULT_HOLDOUT_CAP = 10_000


def guard_world(spec: ExperimentSpec) -> World | None:
    """The treatment the guard gates: the spec's choice, else the first treatment."""
    name = spec.analysis.guard.world
    if name is not None:
        return next(w for w in spec.worlds if w.name == name)
    return next((w for w in spec.worlds if w.role is Role.treatment), None)


def holdout_size(spec: ExperimentSpec) -> int:
    """``analysis.guard.holdout_episodes``, else as many as the spec has, capped."""
    return spec.analysis.guard.holdout_episodes or min(spec.episodes, DEFAULT_HOLDOUT_CAP)


def held_out_request(
    spec: ExperimentSpec, treatment: World, holdout: int
) -> tuple[range, list[WorldPlan]]:
    """The held-out episodes and the two worlds ``validate_guard`` runs on them: known from
    the spec alone, so the durable path can start them before the training outcomes are
    read."""
    forks = spec.analysis.forks_per_checkpoint
    plans = [world_plan(spec.baseline, forks), world_plan(treatment, forks)]
    return range(spec.episodes, spec.episodes + holdout), plans


def held_out_plan(spec: ExperimentSpec) -> tuple[range, list[WorldPlan]] | None:
    """The request the guard will make, or None when the spec has no guard to validate
    (no treatment, or one without an intervention: ``guard_policy`` learns nothing)."""
    world = guard_world(spec)
    if world is None or world.intervention is None:
        return None
    return held_out_request(spec, world, holdout_size(spec))
