"""The fan-out of ``bench/fanout_fork.py``: ``levels`` rounds of ``width`` calls in
parallel (``asyncio.gather``), each round merged by one call whose result feeds the next;
a later branch finishes sooner, so each level completes in the reverse of the order it
was scheduled. Every call counts its executions per workflow id."""

from __future__ import annotations

import asyncio
from collections import Counter
from datetime import timedelta

from pydantic import BaseModel
from temporalio import activity, workflow


class FanInput(BaseModel):
    levels: int = 10
    width: int = 8


class FanActivities:
    def __init__(self, width: int = 8) -> None:
        self.width = width
        self.executed: Counter[str] = Counter()

    @activity.defn(name="branch")
    async def branch(self, level: int, i: int, previous: str) -> str:
        self.executed[activity.info().workflow_id or ""] += 1
        await asyncio.sleep(0.01 * (self.width - i))
        return f"L{level}.{i}<{len(previous)}>"

    @activity.defn(name="merge")
    async def merge(self, level: int, parts: list[str]) -> str:
        self.executed[activity.info().workflow_id or ""] += 1
        return f"M{level}[{','.join(parts)}]"


@workflow.defn(name="BenchFanOut")
class FanOutWorkflow:
    @workflow.run
    async def run(self, inp: FanInput) -> str:
        timeout = timedelta(minutes=1)
        merged = ""
        for level in range(1, inp.levels + 1):
            parts = await asyncio.gather(
                *(
                    workflow.execute_activity(
                        "branch",
                        args=[level, i, merged],
                        result_type=str,
                        start_to_close_timeout=timeout,
                    )
                    for i in range(inp.width)
                )
            )
            merged = await workflow.execute_activity(
                "merge", args=[level, list(parts)], result_type=str, start_to_close_timeout=timeout
            )
        return merged
