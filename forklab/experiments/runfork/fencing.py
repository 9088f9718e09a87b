"""Fenced appends to an offset-addressed log (one producer's rules).

A producer sends (producer, epoch, seq) with each append:
- the same (epoch, seq) as the last accepted one: a duplicate, accepted as a no-op;
- the next seq of the current epoch: appended;
- a higher epoch starting at seq 0: the new owner; the old epoch is fenced from now on;
- a gap: rejected with the seq expected; a lower epoch: rejected as a zombie.
"""

from __future__ import annotations

from enum import StrEnum

from pydantic import BaseModel, ConfigDict


class Verdict(StrEnum):
    append = "append"
    duplicate = "duplicate"
    gap = "gap"
    stale_epoch = "stale_epoch"


class ProducerState(BaseModel):
    model_config = ConfigDict(frozen=True)

    epoch: int
    last_seq: int


class FenceDecision(BaseModel):
    model_config = ConfigDict(frozen=True)

    verdict: Verdict
    expected_seq: int
    message: str = ""


def check_append(state: ProducerState | None, epoch: int, seq: int) -> FenceDecision:
    """The verdict on one append; ``state`` is the producer's last accepted append."""
    if state is None or epoch > state.epoch:
        if seq == 0:
            return FenceDecision(verdict=Verdict.append, expected_seq=0)
        return FenceDecision(
            verdict=Verdict.gap,
            expected_seq=0,
            message=f"epoch {epoch} must start at seq 0, got {seq}",
        )
    if epoch < state.epoch:
        return FenceDecision(
            verdict=Verdict.stale_epoch,
            expected_seq=state.last_seq + 1,
            message=f"epoch {epoch} is fenced: epoch {state.epoch} owns this producer",
        )
    if seq == state.last_seq:
        return FenceDecision(verdict=Verdict.duplicate, expected_seq=state.last_seq + 1)
    if seq == state.last_seq + 1:
        return FenceDecision(verdict=Verdict.append, expected_seq=seq)
    if seq < state.last_seq:
        # already accepted earlier in this epoch: idempotent
        return FenceDecision(verdict=Verdict.duplicate, expected_seq=state.last_seq + 1)
    return FenceDecision(
        verdict=Verdict.gap,
        expected_seq=state.last_seq + 1,
        message=f"gap: expected seq {state.last_seq + 1}, got {seq}",
    )
