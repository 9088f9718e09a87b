"""Calling an activity from a workflow by its typed reference (``forklab.contracts``).

``execute`` is ``workflow.execute_activity`` by name with the reference's result type, so
the call is checked by mypy against the reference and the workflow imports no activity
implementation."""

from __future__ import annotations

from typing import Any, TypeVar, cast

from temporalio import workflow

from forklab.contracts.activity import ActivityRef

I = TypeVar("I")  # noqa: E741
O = TypeVar("O")  # noqa: E741


async def execute(ref: ActivityRef[I, O], arg: I, **options: Any) -> O:
    result = await workflow.execute_activity(ref.name, arg, result_type=ref.output, **options)
    return cast(O, result)
