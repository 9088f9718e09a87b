"""The steps of an agent run as ForkLab sees them, and the digest of an inherited prefix.

A step is one activity call of a run (a model call or a tool call). Steps are numbered
in the order the calls **completed** (their result, failure or timeout reached the
workflow), which is the order the workflow saw them: for sequential calls it is also the
order they were scheduled; for calls in parallel it is not, and each step keeps its
place in the scheduling order too (``call``), by which a fork recognises it
(``call_match.py``). Calls that have not completed come last, in scheduling order. Only
digests of inputs travel here: the inputs themselves stay in Temporal's history (they
may be large or sensitive).
"""

from __future__ import annotations

import hashlib
import json
from enum import StrEnum

from pydantic import BaseModel, ConfigDict, Field


class StepStatus(StrEnum):
    completed = "completed"
    failed = "failed"
    #: scheduled (or started) but no result recorded: the run is still on it, or it died
    pending = "pending"
    #: refused on a fork by a ``block`` policy (or a ``replay`` miss)
    blocked = "blocked"


class StepOrigin(StrEnum):
    """Where a fork's step came from."""

    #: executed by this run
    own = "own"
    #: served from the parent's recorded history (the prefix)
    inherited = "inherited"
    #: a live call of the fork that its policy served from the record (an exact inherited
    #: call)
    replayed = "replayed"
    #: a live call of the fork that its policy refused
    blocked = "blocked"
    #: the boundary step, served with the result the operator gave
    #: (``forklab fork --override-result N=JSON``)
    overridden = "overridden"


class Step(BaseModel):
    """One model or tool call of a run. ``index`` counts from 1 across continue-as-new."""

    model_config = ConfigDict(frozen=True)

    index: int = Field(ge=1)
    activity_type: str
    input_sha256: str
    result_sha256: str | None = None
    status: StepStatus
    #: the run (of a continue-as-new chain) whose history holds this step
    run_id: str
    origin: StepOrigin = StepOrigin.own
    duration_ms: float | None = None
    #: the model asked for (model calls) or the tool's name, for people choosing a step
    label: str = ""
    #: the call's place in its run's scheduling order, numbered like ``index`` across
    #: continue-as-new (None in records made before it was kept: then equal to ``index``)
    call: int | None = None
    #: how many steps of the chain had completed when the call was scheduled
    scheduled_after: int | None = None
    #: the encoded result payload (base64 of the Temporal ``Payload``), kept for serving
    result_b64: str | None = Field(default=None, repr=False)


def step_numbers(steps: list[Step]) -> dict[int, int]:
    """Each settled call of this run's own (by its place in the scheduling order, as the
    run log records it) to its step number: calls in parallel are numbered in the order
    they completed. A call still pending has no number yet (pending calls come after
    every settled one, so theirs can change), nor has a step served from the parent."""
    return {
        s.call: s.index
        for s in steps
        if s.call is not None
        and s.status is not StepStatus.pending
        and s.origin not in (StepOrigin.inherited, StepOrigin.overridden)
    }


def payload_digest(parts: list[tuple[bytes, bytes]]) -> str:
    """sha256 over a list of payloads given as (encoding, data); codec-decoded bytes."""
    h = hashlib.sha256()
    for encoding, data in parts:
        h.update(len(encoding).to_bytes(4, "big") + encoding)
        h.update(len(data).to_bytes(8, "big") + data)
    return h.hexdigest()


def prefix_sha256(steps: list[Step]) -> str:
    """sha256 over the inherited prefix: each step's index, type, input and result digest.

    Two forks with the same prefix digest inherited the same calls with the same results.
    """
    rows = [
        [s.index, s.activity_type, s.input_sha256, s.result_sha256, s.status.value] for s in steps
    ]
    return hashlib.sha256(json.dumps(rows, separators=(",", ":")).encode()).hexdigest()
