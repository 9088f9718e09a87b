"""The memo values the fork interceptor reads, read one by one.

The memo is whatever the starter wrote, under any key, and the interceptor runs in every
run on a worker with ``ForkLabPlugin``, forks or not. ``workflow.memo()`` decodes every
value with the worker's converter: one nested past Python's recursion limit (anyone who
may start a workflow can write one, ``temporal workflow start --memo``) would fail each
workflow task, which Temporal retries for ever, in runs whose own code never reads the
memo. So only ForkLab's own keys are decoded, each alone, and one that does not decode
fails the run (non-retryable); other keys travel on as the payloads they are.
"""

from __future__ import annotations

from typing import Any

from temporalio import workflow
from temporalio.common import RawValue
from temporalio.exceptions import ApplicationError

from forklab.contracts.errors import ForkErrorType


def memo_value(key: str) -> Any:
    """The memo's value under ``key`` (None when it has none), decoded alone; one that
    does not decode fails the run with a non-retryable ``marker_invalid`` error."""
    if key not in workflow.info().raw_memo:
        return None
    try:
        return workflow.memo_value(key, None)
    except Exception as exc:
        reason = (str(exc).splitlines() or [""])[0][:300]
        raise ApplicationError(
            f"memo {key!r} cannot be read ({type(exc).__name__}: {reason}); "
            "start forks with `forklab fork`",
            type=ForkErrorType.marker_invalid,
            non_retryable=True,
        ) from None


def raw_memo() -> dict[str, Any]:
    """The memo as it arrived, every value its payload undecoded, to carry on."""
    return {key: RawValue(payload) for key, payload in workflow.info().raw_memo.items()}
