"""The sequential design of an experiment over a cohort, where it needs numpy and scipy:
the look after each wave (``cohort_look``) and the design the rehearsal shows the approver
(``planned_design``). The rules are pure (``forklab.experiments.cohort.sequential``); the
workflow sends the worlds' counts, so only decisions travel back."""

from __future__ import annotations

from temporalio import activity
from temporalio.exceptions import ApplicationError

from forklab.contracts.cohort import LOOK, CohortLookInput, PlannedDesign
from forklab.contracts.errors import ExperimentErrorType
from forklab.contracts.experiment import LookResult
from forklab.experiments.cohort.sequential import cohort_design, planned_saving, world_paths_at
from forklab.experiments.cohort.spec import CohortExperimentSpec


def _bad_spec(message: str) -> ApplicationError:
    return ApplicationError(message, type=ExperimentErrorType.bad_spec, non_retryable=True)


def decide_look(inp: CohortLookInput) -> LookResult:
    """The decisions after look ``inp.look``: each world's path through its counts, and
    the decision of its last look for the worlds that ran into this one."""
    try:
        design = cohort_design(inp.spec, inp.runs)
    except ValueError as exc:
        raise _bad_spec(str(exc)) from None
    if design is None:
        raise _bad_spec(f"spec {inp.spec.id!r} has no analysis.sequential: it has no looks")
    counts = {}
    for world, c in inp.counts.items():
        if len(c.rescue) != inp.look + 1 or len(c.harm) != inp.look + 1:
            raise _bad_spec(f"look {inp.look + 1}: world {world!r} has counts for another look")
        counts[world] = (c.rescue, c.harm)
    return LookResult.of_paths(inp.look + 1, world_paths_at(inp.spec, design, counts))


@activity.defn(name=LOOK.name)
async def cohort_look(inp: CohortLookInput) -> LookResult:
    return decide_look(inp)


def planned_design(spec: CohortExperimentSpec, runs: int) -> PlannedDesign | str | None:
    """The design over the plan's ``runs`` as the approver sees it, the reason the plan
    cannot follow it (fewer runs than looks), or None without a design."""
    try:
        design = cohort_design(spec, runs)
    except ValueError as exc:
        return str(exc)
    if design is None:
        return None
    inert = planned_saving(spec, design, effect=False)
    effect = planned_saving(spec, design, effect=True)
    return PlannedDesign(
        spending=design.spending,
        wave_ends=design.wave_ends,
        bounds=design.bounds,
        saved_if_inert=inert[0],
        saved_if_inert_low=inert[1],
        saved_if_inert_high=inert[2],
        saved_if_effect=effect[0],
        saved_if_effect_low=effect[1],
        saved_if_effect_high=effect[2],
    )
