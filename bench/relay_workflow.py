"""A relay team for ``bench/team_fork.py``: member i waits for its predecessor's signal
(member 0 starts at once), makes one activity call and signals member i + 1. Forking
member 0 at step 0 moves every other member back to step 0: all of them are forked."""

from __future__ import annotations

from datetime import timedelta

from pydantic import BaseModel
from temporalio import activity, workflow


class RelayInput(BaseModel):
    index: int
    next_member: str | None = None


@activity.defn(name="relay_step")
async def relay_step(index: int) -> int:
    return index + 1


@workflow.defn(name="BenchRelay")
class RelayWorkflow:
    def __init__(self) -> None:
        self._go = False

    @workflow.signal
    def go(self, value: int) -> None:
        self._go = True

    @workflow.run
    async def run(self, inp: RelayInput) -> int:
        if inp.index > 0:
            await workflow.wait_condition(lambda: self._go)
        value: int = await workflow.execute_activity(
            relay_step, inp.index, start_to_close_timeout=timedelta(seconds=30)
        )
        if inp.next_member is not None:
            await workflow.get_external_workflow_handle(inp.next_member).signal("go", value)
        return value
