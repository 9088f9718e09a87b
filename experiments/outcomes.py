"""Per-episode outcomes of an experiment, wherever they were produced.

The local twin and the durable path (sandboxes) both reduce to these models, so the
analysis and the report cannot tell — and need not care — where the worlds ran.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from enum import StrEnum

from pydantic import BaseModel, ConfigDict

from experiments.runtime.canon import canonical_json
from experiments.runtime.file_format import Batch
from experiments.runtime.workload import Feature


class WorldStatus(StrEnum):
    completed = "completed"
    failed = "failed"
    skipped = "skipped"


class WorldOutcomes(BaseModel):
    """One world's columns, in episode order (empty when the world did not complete)."""

    model_config = ConfigDict(extra="forbid")

    name: str
    status: WorldStatus = WorldStatus.completed
    error: str | None = None
    outcomes: list[bool] = []
    intervened: list[bool] = []
    shocks: list[str] = []
    inherited: list[str] = []
    code_digest: str = ""
    snapshot: str = ""
    world_seconds: float = 0.0


class ExperimentOutcomes(BaseModel):
    model_config = ConfigDict(extra="forbid")

    episodes: list[int]
    requested: list[int]
    resolved: list[int]
    checkpoints: list[str]
    features: list[dict[str, Feature]]
    worlds: list[WorldOutcomes]

    def world(self, name: str) -> WorldOutcomes:
        for w in self.worlds:
            if w.name == name:
                return w
        raise KeyError(name)


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


def from_batch(batch: Batch, code_digest: str, snapshot: str, seconds: float) -> ExperimentOutcomes:
    """Wrap a local-twin batch; compute time is shared out by world count.

    Not validated again: the runner built every column itself (``model_construct``), and
    checking each of millions of entries would cost more than the analysis."""
    per_world = seconds / max(1, len(batch["worlds"]))
    return ExperimentOutcomes.model_construct(
        episodes=batch["episodes"],
        requested=batch["requested"],
        resolved=batch["resolved"],
        checkpoints=batch["checkpoints"],
        features=batch["features"],
        worlds=[
            WorldOutcomes.model_construct(
                name=name,
                status=WorldStatus.completed,
                error=None,
                **cols,
                code_digest=code_digest,
                snapshot=snapshot,
                world_seconds=per_world,
            )
            for name, cols in batch["worlds"].items()
        ],
    )


_DIGITS = bytes.maketrans(b"\x00\x01", b"01")


def _outcome_digits(outcomes: Sequence[bool]) -> bytes:
    """``0,1,1,…``: the inside of the canonical JSON list of the outcomes as integers.

    Byte operations in C (``bytes``, ``translate``, a strided slice assignment); no numpy,
    because workflows import this module inside Temporal's sandbox."""
    if not outcomes:
        return b""
    digits = bytes(outcomes).translate(_DIGITS)
    text = bytearray(b"," * (2 * len(digits) - 1))
    text[::2] = digits
    return bytes(text)


def outcomes_digest(outcomes: ExperimentOutcomes, world_names: list[str]) -> str:
    """sha256 over the ordered per-episode outcomes of the named worlds, in that order.

    The digest of ``canonical_json([[name, [0, 1, …]], …])``, written out column by column
    (a JSON list of millions of Python ints would cost more than the whole analysis).
    """
    h = hashlib.sha256(b"[")
    for i, name in enumerate(world_names):
        h.update(b"," if i else b"")
        h.update(b"[" + canonical_json(name).encode() + b",[")
        h.update(_outcome_digits(outcomes.world(name).outcomes))
        h.update(b"]]")
    h.update(b"]")
    return h.hexdigest()
