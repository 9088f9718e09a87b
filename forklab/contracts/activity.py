"""A typed reference to an activity: its registered name, its input and its output.

Workflows call activities through these (``forklab.workflows.activity_calls``) rather than
through the implementing classes, so a workflow module imports the wire types and nothing
of the activities' own dependencies (the analysis stack, sandbox backends, clients). The
activity classes register under ``ref.name``; ``tests/test_activity_refs.py`` checks that
every reference names a registered activity whose signature is the reference's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Generic, TypeVar

I = TypeVar("I")  # noqa: E741 (the input type)
O = TypeVar("O")  # noqa: E741 (the output type)


@dataclass(frozen=True)
class ActivityRef(Generic[I, O]):
    name: str
    input: type[I]
    #: the result type as the data converter reads it (a class, or e.g. ``list[X]``)
    output: Any
