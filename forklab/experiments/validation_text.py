"""One line for a pydantic validation error, for refusals that travel as failure messages
(a run's failure in the Web UI and `temporal workflow show`): the count and the first
error, without pydantic's multi-line layout and links."""

from __future__ import annotations

from pydantic import ValidationError


def first_error(exc: ValidationError) -> str:
    """``"<n> error(s), first: field a.b: <message>"``."""
    errors = exc.errors(include_url=False)
    first = errors[0]
    where = ".".join(str(part) for part in first["loc"]) or "(top level)"
    count = f"{len(errors)} error" + ("s" if len(errors) != 1 else "")
    return f"{count}, first: field {where[:80]}: {first['msg']}"
