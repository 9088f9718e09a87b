"""The compact outcome matrix of an experiment over a cohort (per world, per run, one
character per fork) and the costs per world: what the workflow carries and the analysis
reads. Kept apart from the statistics, so the workflow never imports them."""

from __future__ import annotations

from pydantic import BaseModel

SUCCESS, FAILURE, MISSING = "1", "0", "-"
#: a fork not run because its run's majority in that world was already decided
#: (``cohort.stop_when_decided``, ``forklab.experiments.cohort.votes``)
SAVED = "~"
#: a fork not run because a sequential design stopped its world (or, once every other world
#: stopped, the baseline) before its run's wave (``forklab.experiments.cohort.waves``)
UNSPENT = "/"


class WorldCosts(BaseModel):
    forks: int = 0
    tokens: int = 0
    seconds: float = 0.0
