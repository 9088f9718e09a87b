"""The agents' inputs, checked where the workflow starts.

The OpenAI Agents plugin's payload converter builds a value that fails validation
leniently: for a model of ours it hands the workflow the raw JSON (a dict, a string)
instead of raising. Used as the model, such a value fails the workflow task, which
Temporal retries for ever, so a raw start with bad input (`temporal workflow start`)
would leave the run open and stuck. Checked here, it fails the run with the reason.
"""

from __future__ import annotations

from typing import TypeVar

from pydantic import BaseModel, ValidationError
from temporalio.exceptions import ApplicationError

from experiments.validation_text import first_error

INVALID_INPUT = "invalid_input"

_M = TypeVar("_M", bound=BaseModel)


def checked_input(model: type[_M], value: object) -> _M:
    """``value`` as a ``model``; a non-retryable ``invalid_input`` error if it is not one."""
    if isinstance(value, model):
        return value
    try:
        return model.model_validate(value)
    except ValidationError as exc:
        raise ApplicationError(
            f"the workflow's input is not a {model.__name__} ({first_error(exc)})",
            type=INVALID_INPUT,
            non_retryable=True,
        ) from None
