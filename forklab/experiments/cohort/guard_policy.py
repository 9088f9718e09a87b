"""The guard policy of an experiment over a cohort as the report carries it: kept apart
from ``slices`` (which needs numpy and the workload analysis), so that the workflow's
wire types can name it without loading the analysis stack."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel


class RunCounts(BaseModel):
    """Runs paired against the baseline under one policy: how many, on how many the world
    was applied, and the rescues, harms and net (rescues − harms) by majority."""

    runs: int
    intervened: int
    rescue: int
    harm: int
    net: int


class CohortGuard(BaseModel):
    """The guard of one world: the rule (the runner's JSON rule, as for workloads), its
    counts on the training and held-out runs (``before``: the world always applied;
    ``after``: only where the rule fires), and whether it validated."""

    world: str
    harm_cap: int | None
    basis: str
    rule: dict[str, list[dict[str, dict[str, Any]]]]
    words: str
    training_before: RunCounts
    training_after: RunCounts
    held_out_before: RunCounts
    held_out_after: RunCounts
    validated: bool
    validation: str
