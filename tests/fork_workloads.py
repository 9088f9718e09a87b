"""A plain workflow (no agent framework) for the fork tests: N echo steps, with options
that produce the boundaries a fork must refuse or handle (random ids, a timer, a step
that never completes, continue-as-new)."""

from __future__ import annotations

import asyncio
from datetime import timedelta

from pydantic import BaseModel
from temporalio import activity, workflow
from temporalio.common import RetryPolicy

with workflow.unsafe.imports_passed_through():
    from forklab.activities.runfork.workspace import WorkspaceStep, WorkspaceWrite
    from forklab.agents.tools import ChargeRequest, EffectResult


class StepsInput(BaseModel):
    steps: int
    done: int = 0
    random_ids: bool = False
    sleep_after: int | None = None
    hold_at: int | None = None
    can_every: int | None = None
    trace: list[str] = []
    #: calls made at once (a multiple that divides ``can_every``); 1: one after another
    parallel: int = 1


class EchoIn(BaseModel):
    i: int
    tag: str


@activity.defn(name="echo")
async def echo(x: EchoIn) -> str:
    return f"echo {x.i} {x.tag}"


@activity.defn(name="hold")
async def hold(x: EchoIn) -> str:
    while True:  # until cancelled or the test ends
        activity.heartbeat()
        await asyncio.sleep(0.2)


@workflow.defn(name="ForkSteps")
class StepsWorkflow:
    @workflow.run
    async def run(self, inp: StepsInput) -> list[str]:
        if inp.parallel > 1:
            return await self._in_parallel(inp)
        trace = list(inp.trace)
        for i in range(inp.done + 1, inp.steps + 1):
            tag = str(workflow.uuid4())[:8] if inp.random_ids else "fixed"
            name = "hold" if inp.hold_at == i else "echo"
            out = await workflow.execute_activity(
                name,
                EchoIn(i=i, tag=tag),
                result_type=str,
                start_to_close_timeout=timedelta(minutes=5),
                heartbeat_timeout=timedelta(seconds=30),
                retry_policy=RetryPolicy(maximum_attempts=3),
            )
            trace.append(out)
            if inp.sleep_after == i:
                await workflow.sleep(timedelta(milliseconds=10))
            if inp.can_every and i % inp.can_every == 0 and i < inp.steps:
                workflow.continue_as_new(inp.model_copy(update={"done": i, "trace": trace[-3:]}))
        return trace

    async def _in_parallel(self, inp: StepsInput) -> list[str]:
        """``parallel`` echo calls at a time, continuing-as-new every ``can_every``."""
        trace = list(inp.trace)
        for first in range(inp.done + 1, inp.steps + 1, inp.parallel):
            last = min(first + inp.parallel - 1, inp.steps)
            trace += await asyncio.gather(
                *(
                    workflow.execute_activity(
                        "echo",
                        EchoIn(i=i, tag="fixed"),
                        result_type=str,
                        start_to_close_timeout=timedelta(minutes=5),
                    )
                    for i in range(first, last + 1)
                )
            )
            if inp.can_every and last % inp.can_every == 0 and last < inp.steps:
                workflow.continue_as_new(inp.model_copy(update={"done": last, "trace": trace[-3:]}))
        return trace


@workflow.defn(name="ChargeOnce")
class ChargeOnceWorkflow:
    """One charge with a short timeout, so a hanging attempt is retried quickly."""

    @workflow.run
    async def run(self, customer: str) -> str:
        result: EffectResult = await workflow.execute_activity(
            "charge_customer",
            ChargeRequest(key_name="inv-z", customer=customer, amount_cents=700),
            result_type=EffectResult,
            start_to_close_timeout=timedelta(seconds=2),
            retry_policy=RetryPolicy(initial_interval=timedelta(milliseconds=200)),
        )
        return result.status


class FilesInput(BaseModel):
    steps: int
    done: int = 0
    #: the steps that write ``f<i>.txt`` into the run's workspace (the others echo)
    write_at: list[int] = []
    #: continue-as-new after this step, carrying the workspace layer in the input
    can_after: int | None = None
    workspace_layer: str | None = None
    #: written into every file (runs with different tags write different layers)
    tag: str = ""
    #: this step never completes (a run that stays open)
    hold_at: int | None = None


@workflow.defn(name="ForkFiles")
class FilesWorkflow:
    """Echo and file steps; a continue-as-new hands the workspace layer to the next run in
    its input (as an agent's state would). Returns the final layer."""

    @workflow.run
    async def run(self, inp: FilesInput) -> str | None:
        layer = inp.workspace_layer
        for i in range(inp.done + 1, inp.steps + 1):
            if i in inp.write_at:
                done: WorkspaceStep = await workflow.execute_activity(
                    "workspace_write",
                    WorkspaceWrite(layer=layer, path=f"f{i}.txt", content=f"{inp.tag}step {i}"),
                    result_type=WorkspaceStep,
                    start_to_close_timeout=timedelta(minutes=1),
                )
                layer = done.workspace_layer
            else:
                await workflow.execute_activity(
                    "hold" if inp.hold_at == i else "echo",
                    EchoIn(i=i, tag="fixed"),
                    result_type=str,
                    start_to_close_timeout=timedelta(minutes=5),
                    heartbeat_timeout=timedelta(seconds=30),
                )
            if inp.can_after == i and i < inp.steps:
                workflow.continue_as_new(
                    inp.model_copy(update={"done": i, "workspace_layer": layer})
                )
        return layer
