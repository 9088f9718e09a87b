"""A workflow whose fork can leave out what its prefix holds: a timer, a child workflow,
a signal's point, an inherited call (``tests/test_fork_owed.py``)."""

from __future__ import annotations

from datetime import timedelta

from sample_message_workflows import ComposeGreetingChild
from temporalio import workflow

from forklab.workflows.runfork.interceptor import current_fork

_TIMEOUT = timedelta(seconds=30)


@workflow.defn(name="OtherChild")
class OtherChild:
    """A child the parent never started."""

    @workflow.run
    async def run(self) -> str:
        return "other"


@workflow.defn(name="Owes")
class OwesWorkflow:
    """A reservation, a sleep, a child, a wait for ``approve``, a second reservation and
    a confirmation. A fork's intervention ``{"skip": KIND}`` leaves one out, as a changed
    build or another code path would: ``timer``, ``child`` (or ``other-child``: another
    child in its place), ``signal`` (the run ends before the point where the parent got
    the signal), ``call`` (it waits for ever instead of making the second reservation)."""

    def __init__(self) -> None:
        self.approved = False

    @workflow.signal
    def approve(self) -> None:
        self.approved = True

    @workflow.run
    async def run(self) -> str:
        marker = current_fork()
        skip = (marker.intervention or {}).get("skip") if marker is not None else None
        a = await workflow.execute_activity(
            "reserve", "a", result_type=str, start_to_close_timeout=_TIMEOUT
        )
        if skip != "timer":
            await workflow.sleep(0.2)
        child = ""
        if skip == "other-child":  # another child in place of the parent's
            child = await workflow.execute_child_workflow(
                OtherChild.run, id=f"{workflow.info().workflow_id}-other"
            )
        elif skip != "child":
            child = await workflow.execute_child_workflow(
                ComposeGreetingChild.run, "kid", id=f"{workflow.info().workflow_id}-kid"
            )
        if skip == "signal":
            return a
        await workflow.wait_condition(lambda: self.approved)
        if skip == "call":
            await workflow.wait_condition(lambda: not self.approved)  # never
        b = await workflow.execute_activity(
            "reserve", "b", result_type=str, start_to_close_timeout=_TIMEOUT
        )
        return await workflow.execute_activity(
            "confirm", [a, b, child], result_type=str, start_to_close_timeout=_TIMEOUT
        )


@workflow.defn(name="Owes")
class OwesWithoutSleepWorkflow:
    """A later build of ``Owes`` that no longer sleeps between the reservation and the
    child: a fork of a parent recorded by the earlier build owes a timer it never starts."""

    def __init__(self) -> None:
        self.approved = False

    @workflow.signal
    def approve(self) -> None:
        self.approved = True

    @workflow.run
    async def run(self) -> str:
        a = await workflow.execute_activity(
            "reserve", "a", result_type=str, start_to_close_timeout=_TIMEOUT
        )
        child = await workflow.execute_child_workflow(
            ComposeGreetingChild.run, "kid", id=f"{workflow.info().workflow_id}-kid"
        )
        await workflow.wait_condition(lambda: self.approved)
        b = await workflow.execute_activity(
            "reserve", "b", result_type=str, start_to_close_timeout=_TIMEOUT
        )
        return await workflow.execute_activity(
            "confirm", [a, b, child], result_type=str, start_to_close_timeout=_TIMEOUT
        )
