"""The DSL interpreter of Temporal's samples-python (``dsl/workflow.py`` and
``dsl/activities.py``, MIT licence), as a third-party workflow ForkLab knows nothing of:
copied as it is there, except that each activity sleeps ``DELAY`` seconds (50 ms), so a
run of N activities does N calls' worth of work, a result keeps the last 40 characters of
its input (a chain of 500 would otherwise grow each result by the last), and the class is
named for this bench.
``sequence(n)`` builds a DSL input of n activities, each fed the previous result."""

from __future__ import annotations

import asyncio
import dataclasses
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Union

from temporalio import activity, workflow

DELAY = 0.05


@dataclass
class DSLInput:
    root: Statement
    variables: dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclass
class ActivityStatement:
    activity: ActivityInvocation


@dataclass
class ActivityInvocation:
    name: str
    arguments: list[str] = dataclasses.field(default_factory=list)
    result: str | None = None


@dataclass
class SequenceStatement:
    sequence: Sequence


@dataclass
class Sequence:
    elements: list[Statement]


@dataclass
class ParallelStatement:
    parallel: Parallel


@dataclass
class Parallel:
    branches: list[Statement]


Statement = Union[ActivityStatement, SequenceStatement, ParallelStatement]  # noqa: UP007


@workflow.defn(name="DSLWorkflow")
class BenchDSLWorkflow:
    @workflow.run
    async def run(self, input: DSLInput) -> dict[str, Any]:
        self.variables = dict(input.variables)
        await self.execute_statement(input.root)
        return self.variables

    async def execute_statement(self, stmt: Statement) -> None:
        if isinstance(stmt, ActivityStatement):
            result = await workflow.execute_activity(
                stmt.activity.name,
                args=[self.variables.get(arg, "") for arg in stmt.activity.arguments],
                start_to_close_timeout=timedelta(minutes=1),
            )
            if stmt.activity.result:
                self.variables[stmt.activity.result] = result
        elif isinstance(stmt, SequenceStatement):
            for elem in stmt.sequence.elements:
                await self.execute_statement(elem)
        elif isinstance(stmt, ParallelStatement):
            await asyncio.gather(*[self.execute_statement(b) for b in stmt.parallel.branches])


class DSLActivities:
    @activity.defn
    async def activity1(self, arg: str) -> str:
        await asyncio.sleep(DELAY)
        return f"[result from activity1: {arg[-40:]}]"

    @activity.defn
    async def activity2(self, arg: str) -> str:
        await asyncio.sleep(DELAY)
        return f"[result from activity2: {arg[-40:]}]"


def sequence(n: int) -> DSLInput:
    """n activities in a row (activity1, activity2, …), each given the previous result."""
    elements: list[Statement] = [
        ActivityStatement(
            ActivityInvocation(
                name=f"activity{1 + i % 2}",
                arguments=[f"v{i}" if i else "arg"],
                result=f"v{i + 1}",
            )
        )
        for i in range(n)
    ]
    return DSLInput(root=SequenceStatement(Sequence(elements)), variables={"arg": "start"})
