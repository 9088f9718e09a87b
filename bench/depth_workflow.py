"""The long run of ``bench/fork_depth.py``: N trivial steps, continue-as-new every few
hundred, a few steps in flight at once (so 10,000 steps take minutes, not an hour)."""

from __future__ import annotations

import asyncio
from datetime import timedelta

from pydantic import BaseModel
from temporalio import activity, workflow


class DepthInput(BaseModel):
    steps: int
    done: int = 0
    can_every: int = 500
    in_flight: int = 20


@activity.defn(name="tick")
async def tick(i: int) -> int:
    return i


@workflow.defn(name="BenchDepth")
class DepthWorkflow:
    @workflow.run
    async def run(self, inp: DepthInput) -> int:
        i = inp.done
        while i < inp.steps:
            chunk = range(i + 1, min(inp.steps, i + inp.in_flight) + 1)
            await asyncio.gather(
                *(
                    workflow.execute_activity(tick, n, start_to_close_timeout=timedelta(seconds=30))
                    for n in chunk
                )
            )
            i = chunk[-1]
            if i < inp.steps and i - inp.done >= inp.can_every:
                workflow.continue_as_new(inp.model_copy(update={"done": i}))
        return i
