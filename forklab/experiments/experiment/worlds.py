"""A spec's worlds as the runner sees them (``WorldPlan``): what a sandbox or the twin is
asked to continue. Light on purpose: the experiment workflow builds these."""

from __future__ import annotations

from typing import Any

from forklab.experiments.experiment.spec import ExperimentSpec, World
from forklab.runtime.file_format import WorldPlan


def world_plan(
    world: World, forks: int = 1, guard: dict[str, Any] | None = None, name: str | None = None
) -> WorldPlan:
    iv = world.intervention
    return WorldPlan(
        name=name or world.name,
        intervention=iv.name if iv else None,
        params=dict(iv.params) if iv else {},
        guard=guard,
        forks=forks,
    )


def spec_world_plans(spec: ExperimentSpec) -> list[WorldPlan]:
    forks = spec.analysis.forks_per_checkpoint
    return [world_plan(w, forks) for w in spec.worlds]
