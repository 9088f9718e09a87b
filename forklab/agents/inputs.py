"""The agents' inputs, checked where the workflow starts.

The OpenAI Agents plugin's payload converter builds a value that fails validation
leniently: for a model of ours it hands the workflow the raw JSON (a dict, a string)
instead of raising. Used as the model, such a value fails the workflow task, which
Temporal retries for ever, so a raw start with bad input (`temporal workflow start`)
would leave the run open and stuck. Checked here, it fails the run with the reason.
ForkLab's own agent workers refuse such an input earlier, in their converter
(``forklab.workers.runfork.agent_converter``); this check holds wherever the agents run on
the plugin's converter alone.
"""

from __future__ import annotations

from enum import StrEnum
from typing import TypeVar

from pydantic import BaseModel, ValidationError
from temporalio.exceptions import ApplicationError

from forklab.experiments.validation_text import first_error

_M = TypeVar("_M", bound=BaseModel)


class AgentErrorType(StrEnum):
    """The failure types of the shipped agents' own workflows (not ForkLab's)."""

    #: the workflow's input does not validate
    invalid_input = "invalid_input"
    #: the research pipeline's scorer failed the report
    low_quality_report = "low_quality_report"
    #: a team member could not message another (not running, or not found)
    team_member_unreachable = "team_member_unreachable"


def checked_input(model: type[_M], value: object) -> _M:
    """``value`` as a ``model``; a non-retryable ``invalid_input`` error if it is not one."""
    if isinstance(value, model):
        return value
    try:
        return model.model_validate(value)
    except ValidationError as exc:
        raise ApplicationError(
            f"the workflow's input is not a {model.__name__} ({first_error(exc)})",
            type=AgentErrorType.invalid_input,
            non_retryable=True,
        ) from None
