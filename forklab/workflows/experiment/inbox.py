"""Reading untrusted messages: any payload, any shape, any size, never an exception.

The workflow's update and signal handlers are dynamic and take raw payloads, so the SDK
never decodes (and never fails on) what a sender wrote. ``deliver`` reads them here: one
JSON object of at most ``MAX_PAYLOAD_BYTES``, validated against the request model. What
cannot be read is refused with a one-line reason naming the field, and recorded by the
gate like any other attempt; nothing raises.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from forklab.workflows.experiment.approval_gate import ApprovalGate, Moment, clip
from forklab.workflows.experiment.messages import ApprovalAttempt, ApproveRequest, RejectRequest

#: A payload larger than this is refused unread (a request is a few hundred bytes).
MAX_PAYLOAD_BYTES = 16 * 1024
_JSON = b"json/plain"
_Req = TypeVar("_Req", bound=BaseModel)


@dataclass(frozen=True)
class Payload:
    """One raw argument: its ``encoding`` metadata and its bytes."""

    encoding: bytes
    data: bytes


def read(model: type[_Req], args: Sequence[Payload], name_field: str) -> tuple[_Req | str, str]:
    """The request in ``args``, or why not; and the sender's claimed name (for the log)."""
    if len(args) != 1:
        return f"expects exactly one JSON object argument, got {len(args)} arguments", ""
    arg = args[0]
    if arg.encoding != _JSON:
        shown = clip(arg.encoding.decode("utf-8", "replace"), 40) or "(none)"
        return f"payload encoding {shown} is not json/plain", ""
    if len(arg.data) > MAX_PAYLOAD_BYTES:
        return f"payload of {len(arg.data)} bytes exceeds {MAX_PAYLOAD_BYTES} bytes", ""
    try:
        raw: Any = json.loads(arg.data)
    except (ValueError, RecursionError):
        return "payload is not valid JSON", ""
    if not isinstance(raw, dict):
        return f"payload is a JSON {type(raw).__name__}, not an object", ""
    claimed = raw.get(name_field)
    who = claimed if isinstance(claimed, str) else ""
    try:
        return model.model_validate(raw), who
    except ValidationError as exc:
        err = exc.errors()[0]
        field = ".".join(str(p) for p in err["loc"]) or "(top level)"
        return f"field {clip(field, 40)}: {err['msg']}", who


def deliver(gate: ApprovalGate, name: str, args: Sequence[Payload], at: Moment) -> ApprovalAttempt:
    """Hand an update named ``name`` to the gate; whatever it holds, record one attempt."""
    if name == "approve":
        req, who = read(ApproveRequest, args, "approver")
        if isinstance(req, ApproveRequest):
            return gate.approve(req, at)
        return gate.refuse("approve", who, f"refused: {req}", at)
    if name == "reject":
        rej, who = read(RejectRequest, args, "by")
        if isinstance(rej, RejectRequest):
            return gate.reject(rej, at)
        return gate.refuse("reject", who, f"refused: {rej}", at)
    return gate.refuse(
        name, "", "refused: unknown update; this workflow takes approve and reject", at
    )


def refuse_signal(gate: ApprovalGate, name: str, at: Moment) -> ApprovalAttempt:
    """Signals carry no decisions here: approve and reject are updates (they answer)."""
    return gate.refuse(
        name, "", "refused: signals are not accepted; approve and reject are updates", at
    )
