"""The payload of a result override (``experiments/runfork/overrides.py``): the same
bytes wherever it is built — the CLI that writes the receipt, the activity that serves
the fork its prefix."""

from __future__ import annotations

import base64
import json
from typing import Any

from temporalio.api.common.v1 import Payload

from forklab.experiments.runfork.overrides import MAX_OVERRIDE_BYTES, ResultOverride
from forklab.experiments.runfork.steps import payload_digest

_ENCODING = b"json/plain"


def _payload(value: Any) -> Payload:
    data = json.dumps(value, separators=(",", ":"), sort_keys=True, allow_nan=False).encode()
    return Payload(metadata={"encoding": _ENCODING}, data=data)


def make_override(step: int, value: Any) -> ResultOverride:
    """An override of step ``step``'s result with the JSON ``value``; ValueError when it
    is too large to carry in a memo."""
    payload = _payload(value)
    if len(payload.data) > MAX_OVERRIDE_BYTES:
        raise ValueError(
            f"the result override of step {step} is {len(payload.data)} bytes; "
            f"keep it under {MAX_OVERRIDE_BYTES}"
        )
    return ResultOverride(
        step=step, value=value, result_sha256=payload_digest([(_ENCODING, payload.data)])
    )


def override_b64(override: ResultOverride) -> str:
    """The override's result as a step keeps it (base64 of the encoded payload)."""
    return base64.b64encode(_payload(override.value).SerializeToString()).decode()
