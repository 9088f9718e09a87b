"""What an ``approximate`` fork does differently from its parent, one typed record per
departure, each naming its step.

Two moments see departures. Before the fork starts, the parent's history shows what a
fork cannot be handed as it was (a local activity, a child still running at the boundary,
a Nexus operation: each happens again live) and one kind of input drift: an inherited
call whose recorded input holds the parent's own workflow id, which the fork, running
under its own id, cannot ask with (``predicted_id_drift``). Those go into the receipt,
which is written once. Drift of any other origin shows only when the fork makes the call;
the fork then records it in its own history (``forklab.record_drift``, append-only), and
``forklab trail`` lists it beside the receipt, which never changes after the fact.

Pure: the fork starter and the history parser call in.
"""

from __future__ import annotations

import json
from enum import StrEnum

from pydantic import BaseModel, ConfigDict, Field

from forklab.experiments.runfork.steps import Step, payload_digest


class ApproximationKind(StrEnum):
    #: an inherited call whose recorded input differs from the fork's (both digests): the
    #: fork is served the parent's result
    input_drift = "input_drift"
    #: a local activity inside the prefix: its input is not recorded, it runs again live
    local_activity = "local_activity"
    #: a child workflow inside the prefix that had not closed by the boundary, or ended
    #: canceled, timed out or terminated: the fork starts it again live
    child_rerun = "child_rerun"
    #: anything else inside the prefix a fork does not see again (a Nexus operation, a
    #: signal given at a parent fork's fork point)
    not_seen_again = "not_seen_again"
    #: a receipt written before approximations were typed: its sentence, as it was
    noted = "noted"


class Approximation(BaseModel):
    """One departure an approximate boundary accepted."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: ApproximationKind
    #: the step it concerns: the drifted call's, or the step the event came after (None:
    #: a receipt written before approximations named their steps)
    step: int | None = Field(default=None, ge=0)
    #: one sentence
    detail: str
    #: input drift: the sha256 of the parent's recorded input and of the fork's
    parent_input_sha256: str | None = None
    fork_input_sha256: str | None = None

    def line(self) -> str:
        """The approximation in a line, for people."""
        where = f"step {self.step}: " if self.step is not None else ""
        digests = ""
        if self.parent_input_sha256 is not None:
            fork = (self.fork_input_sha256 or "?")[:12]
            digests = f" (input sha256 {self.parent_input_sha256[:12]} → {fork})"
        return f"{where}{self.detail}{digests}"


def legacy(value: object) -> object:
    """An approximation as receipts recorded before they were typed (a sentence) read as
    one of kind ``noted``; anything else as it is (the model validates it)."""
    if isinstance(value, str):
        return {"kind": ApproximationKind.noted.value, "detail": value}
    return value


class DriftRecord(BaseModel):
    """An inherited call a fork was served although it asked with another input than the
    parent's: what ``forklab.record_drift`` puts in the fork's history."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    step: int = Field(ge=1)
    activity_type: str
    parent_input_sha256: str
    fork_input_sha256: str

    def approximation(self) -> Approximation:
        return Approximation(
            kind=ApproximationKind.input_drift,
            step=self.step,
            detail=(
                f"{self.activity_type[:100]} was served the parent's result although the "
                "fork's input differs from the parent's"
            ),
            parent_input_sha256=self.parent_input_sha256,
            fork_input_sha256=self.fork_input_sha256,
        )


#: Shorter ids are not looked for: they appear inside unrelated text.
MIN_ID_LENGTH = 4


def _forms(text: str) -> list[tuple[bytes, str]]:
    """How ``text`` may appear inside a payload's bytes: raw, and escaped as in JSON
    (each with the name of the form, so that another text can be written the same way)."""
    raw = text.encode()
    escaped = json.dumps(text)[1:-1].encode()
    return [(raw, "raw")] if escaped == raw else [(raw, "raw"), (escaped, "json")]


def _written(text: str, form: str) -> bytes:
    return text.encode() if form == "raw" else json.dumps(text)[1:-1].encode()


def holds(data: bytes, text: str) -> bool:
    """Whether ``text`` (a workflow id) appears in ``data``."""
    return len(text) >= MIN_ID_LENGTH and any(form in data for form, _ in _forms(text))


def predicted_id_drift(
    payloads: list[tuple[bytes, bytes]], parent_id: str, fork_id: str
) -> str | None:
    """The sha256 a fork running as ``fork_id`` would ask with, for a call whose recorded
    input (``payloads``: encoding and data each) holds ``parent_id``: each appearance
    replaced by ``fork_id``, written the same way. None when the input does not hold it."""
    if len(parent_id) < MIN_ID_LENGTH:
        return None
    changed = False
    out: list[tuple[bytes, bytes]] = []
    for encoding, data in payloads:
        for old, how in _forms(parent_id):
            if old in data:
                data = data.replace(old, _written(fork_id, how))
                changed = True
        out.append((encoding, data))
    return payload_digest(out) if changed else None


def id_drift(
    prefix: list[Step],
    holding: dict[int, list[tuple[bytes, bytes]]],
    handed: list[tuple[int, bytes]],
    parent_id: str,
    fork_id: str,
) -> list[Approximation]:
    """The inherited calls a fork running as ``fork_id`` is known to ask with another input
    than the parent's: those whose recorded input (``holding``: by step, the inputs that
    hold ``parent_id``) holds the parent's workflow id while nothing the workflow had been
    handed by then did (``handed``: (steps handed over before it, bytes) for the start
    input, each result and each message). Such a value came from ``workflow.info()``,
    which a fork does not share; where the id was handed over too, its origin is unknown
    and the fork finds out when it makes the call."""
    out: list[Approximation] = []
    for step in sorted(prefix, key=lambda s: s.index):
        recorded = holding.get(step.index)
        if recorded is None:
            continue
        if any(before < step.index and holds(data, parent_id) for before, data in handed):
            continue
        predicted = predicted_id_drift(recorded, parent_id, fork_id)
        if predicted is None or predicted == step.input_sha256:
            continue
        out.append(
            Approximation(
                kind=ApproximationKind.input_drift,
                step=step.index,
                detail=(
                    f"{step.activity_type[:100]} asks with the parent's workflow id "
                    f"{parent_id[:100]!r} in its input, which the fork, running as "
                    f"{fork_id[:100]!r}, asks with its own"
                ),
                parent_input_sha256=step.input_sha256,
                fork_input_sha256=predicted,
            )
        )
    return out
