"""Numbers and JSON given on the command line, read totally: whatever the text, the result
is a value in range or one line naming the flag and the range, exit 2 — never a
traceback, a non-finite number, or a value a store cannot hold. Flags are parsed here
rather than by argparse ``type=``, whose error is a usage block, not one line."""

from __future__ import annotations

import math
from typing import Any

from forklab.cli.errors import CliError
from forklab.runtime import strict_json

BAD_INPUT = 2
#: The largest whole number a flag takes: what SQLite's INTEGER (and a Temporal int64) holds.
MAX_WHOLE = 2**63 - 1


def whole_number(text: str, flag: str, low: int = 0, high: int = MAX_WHOLE) -> int:
    """``text`` as an integer from ``low`` to ``high``."""
    try:
        value = int(text)
    except ValueError:
        raise CliError(f"{flag} {text[:40]!r} is not a whole number", code=BAD_INPUT) from None
    if not low <= value <= high:
        raise CliError(f"{flag}: give a number from {low} to {high}", code=BAD_INPUT)
    return value


def finite_number(text: str, flag: str, low: float = -math.inf, high: float = math.inf) -> float:
    """``text`` as a finite number from ``low`` to ``high`` (``nan``, ``inf`` and
    ``1e999`` are refused)."""
    try:
        value = float(text)
    except ValueError:
        raise CliError(f"{flag} {text[:40]!r} is not a number", code=BAD_INPUT) from None
    if not math.isfinite(value):
        raise CliError(f"{flag} must be a finite number", code=BAD_INPUT)
    if not low <= value <= high:
        span = f"of at least {low:g}" if high == math.inf else f"from {low:g} to {high:g}"
        raise CliError(f"{flag}: give a number {span}", code=BAD_INPUT)
    return value


def json_value(text: str, flag: str) -> Any:
    """``text`` as JSON read by the shared strict reader (no ``NaN``, ``Infinity``,
    ``1e999``, no nesting deeper than ``strict_json.MAX_DEPTH``)."""
    try:
        return strict_json.loads(text, flag)
    except strict_json.StrictJsonError as exc:
        raise CliError(str(exc), code=BAD_INPUT) from None


def json_object(text: str, flag: str) -> dict[str, Any]:
    """``text`` as a JSON object (``json_value``)."""
    value = json_value(text, flag)
    if not isinstance(value, dict):
        raise CliError(f"{flag} must be a JSON object", code=BAD_INPUT)
    return value
