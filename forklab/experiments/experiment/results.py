"""The small records of a result that travel between workflows and activities: a world's
status, what the infrastructure spent, a validity check. Numpy-free, so the wire types
(``forklab.contracts``) and the workflows that hold them import no analysis stack."""

from __future__ import annotations

from enum import StrEnum

from pydantic import BaseModel, ConfigDict


class WorldStatus(StrEnum):
    completed = "completed"
    failed = "failed"
    skipped = "skipped"
    #: Ran the first waves of its episodes, then its sequential design stopped it.
    stopped = "stopped"


class InfraUsage(BaseModel):
    """What the infrastructure actually spent, for the infrastructure-fit check.

    The durable path fills it in from its batches; the twin has none (``None``).
    """

    model_config = ConfigDict(extra="forbid")

    world_seconds_budget: float
    world_seconds_spent: float
    max_concurrent_sandboxes: int
    peak_concurrent_sandboxes: int
    skipped_batches: int = 0
    sandboxes_left: int = 0


class CheckKind(StrEnum):
    """``validity`` checks decide whether the experiment counts at all; an ``effect``
    check reports how the effects compare with the hypothesis (a verdict input)."""

    validity = "validity"
    effect = "effect"


class Check(BaseModel):
    name: str
    passed: bool
    reason: str
    kind: CheckKind = CheckKind.validity
