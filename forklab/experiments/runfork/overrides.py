"""Changing the decision at the fork point: "what if step N had returned X", "what if
step N had been asked Y", and "what if this signal had arrived there".

A fork with a result override inherits steps 1..N-1 and is served the operator's JSON
as step N's result (also when step N failed on the parent: "what if the API had not
timed out"); everything after runs as its policies say. The override travels in the
fork marker, is applied where the prefix is fetched (so it is recorded in the fork's
own history, and a fork of the fork inherits it like any step), and is kept in the
receipt, whose prefix digest covers the overridden result.

A fork with an input override is at step N-1 and runs step N live with the operator's
JSON as the call's (first) argument. The call is recognised as the parent's step N by
what it is (``call_match``: type, input digest, k-th such call), so the override finds
it also among calls in parallel.

A fork's signals are delivered to the workflow's own signal handlers at the fork point:
when the last inherited result has been handed over (at the start, when nothing is
inherited), before the workflow goes on from it.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from forklab.experiments.runfork.steps import Step, StepOrigin, StepStatus

#: An override is carried in the fork's memo: it must stay small.
MAX_OVERRIDE_BYTES = 64 * 1024


class ResultOverride(BaseModel):
    """Step ``step``'s result on the fork: ``value`` (JSON), encoded as a ``json/plain``
    payload whose sha256 is ``result_sha256``."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    step: int = Field(ge=1)
    value: Any
    result_sha256: str


def overridden(steps: list[Step], override: ResultOverride | None, result_b64: str) -> list[Step]:
    """``steps`` with the overridden one completed with the override's result."""
    if override is None:
        return steps
    return [
        s.model_copy(
            update={
                "status": StepStatus.completed,
                "result_b64": result_b64,
                "result_sha256": override.result_sha256,
                "origin": StepOrigin.overridden,
            }
        )
        if s.index == override.step
        else s
        for s in steps
    ]


class InputOverride(BaseModel):
    """The call that was the parent's step ``step`` (``activity_type``, ``input_sha256``
    and ``ordinal``, as ``call_match.CallKey``) runs live with ``value`` as its first
    argument."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    step: int = Field(ge=1)
    value: Any
    activity_type: str
    input_sha256: str
    ordinal: int = Field(ge=1)


class ForkSignal(BaseModel):
    """A signal a fork's workflow receives at the fork point: ``name`` with ``args``
    (none, or the one JSON value given)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(min_length=1, max_length=200)
    args: list[Any] = Field(default_factory=list, max_length=1)
