"""Workflows written the way Temporal's samples are, knowing nothing of ForkLab: the
money-transfer template (withdraw, deposit, refund when the deposit fails), a DSL
interpreter (samples-python ``dsl``: sequences and parallel branches of activities named
in the input, results kept in variables), a research-bot shape (parallel searches between
sequential planning and writing) and an OpenAI Agents SDK agent with an activity tool
(samples-python ``openai_agents/basic`` tools agent).

Every activity counts its executions per workflow id in :class:`Calls`, so a test can say
how many steps a fork ran live."""

from __future__ import annotations

import asyncio
from collections import Counter
from datetime import timedelta
from typing import Literal

from pydantic import BaseModel
from temporalio import activity, workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, ApplicationError

with workflow.unsafe.imports_passed_through():
    from agents import Agent, Runner
    from sample_tools import Mailer
    from temporalio.openai_agents.workflow import activity_as_tool

    from forklab.workflows.runfork.interceptor import current_fork


class Calls:
    """Executions per (workflow id, activity type), across every worker of the test."""

    def __init__(self) -> None:
        self.counts: Counter[tuple[str, str]] = Counter()

    def count(self) -> None:
        info = activity.info()
        self.counts[(info.workflow_id or "", info.activity_type)] += 1

    def of(self, workflow_id: str) -> int:
        return sum(n for (wid, _), n in self.counts.items() if wid == workflow_id)


# --- money transfer ---------------------------------------------------------------------


class TransferDetails(BaseModel):
    source: str
    target: str
    amount: int
    reference: str


class Bank:
    """The template's banking service; an account named ``closed-*`` refuses deposits."""

    def __init__(self, calls: Calls) -> None:
        self.calls = calls

    @activity.defn(name="withdraw")
    async def withdraw(self, d: TransferDetails) -> str:
        self.calls.count()
        return f"W-{d.reference}"

    @activity.defn(name="deposit")
    async def deposit(self, d: TransferDetails) -> str:
        self.calls.count()
        if d.target.startswith("closed-"):
            raise ApplicationError(f"account {d.target} is closed", non_retryable=True)
        return f"D-{d.reference}"

    @activity.defn(name="refund")
    async def refund(self, d: TransferDetails) -> str:
        self.calls.count()
        return f"R-{d.reference}"


_BANK_RETRY = RetryPolicy(maximum_attempts=3, initial_interval=timedelta(milliseconds=100))


@workflow.defn(name="MoneyTransfer")
class MoneyTransferWorkflow:
    @workflow.run
    async def run(self, d: TransferDetails) -> str:
        timeout = timedelta(seconds=30)
        withdrawn = await workflow.execute_activity(
            "withdraw", d, result_type=str, start_to_close_timeout=timeout, retry_policy=_BANK_RETRY
        )
        try:
            deposited = await workflow.execute_activity(
                "deposit",
                d,
                result_type=str,
                start_to_close_timeout=timeout,
                retry_policy=_BANK_RETRY,
            )
        except ActivityError:
            # the template's compensation: put the money back, then fail
            refunded = await workflow.execute_activity(
                "refund",
                d,
                result_type=str,
                start_to_close_timeout=timeout,
                retry_policy=_BANK_RETRY,
            )
            return f"refunded: {withdrawn} {refunded}"
        return f"transferred: {withdrawn} {deposited}"


# --- the DSL interpreter ----------------------------------------------------------------


class ActivityStatement(BaseModel):
    kind: Literal["activity"] = "activity"
    name: str
    arguments: list[str] = []
    result: str | None = None


class SequenceStatement(BaseModel):
    kind: Literal["sequence"] = "sequence"
    elements: list[Statement]


class ParallelStatement(BaseModel):
    kind: Literal["parallel"] = "parallel"
    branches: list[Statement]


Statement = ActivityStatement | SequenceStatement | ParallelStatement
SequenceStatement.model_rebuild()
ParallelStatement.model_rebuild()


class DSLInput(BaseModel):
    root: Statement
    variables: dict[str, str] = {}


class DslActivities:
    """The sample's activity1..activity5: each joins its arguments under its name. The
    ``delays`` make parallel calls complete in another order than they were scheduled."""

    def __init__(self, calls: Calls, delays: dict[str, float] | None = None) -> None:
        self.calls = calls
        self.delays = delays or {}

    async def _do(self, name: str, args: list[str]) -> str:
        self.calls.count()
        await asyncio.sleep(self.delays.get(name, 0.0))
        return f"{name}({','.join(args)})"

    @activity.defn(name="activity1")
    async def activity1(self, args: list[str]) -> str:
        return await self._do("activity1", args)

    @activity.defn(name="activity2")
    async def activity2(self, args: list[str]) -> str:
        return await self._do("activity2", args)

    @activity.defn(name="activity3")
    async def activity3(self, args: list[str]) -> str:
        return await self._do("activity3", args)

    @activity.defn(name="activity4")
    async def activity4(self, args: list[str]) -> str:
        return await self._do("activity4", args)

    @activity.defn(name="activity5")
    async def activity5(self, args: list[str]) -> str:
        return await self._do("activity5", args)

    def all(self) -> list[object]:
        return [self.activity1, self.activity2, self.activity3, self.activity4, self.activity5]


@workflow.defn(name="DSLWorkflow")
class DSLWorkflow:
    @workflow.run
    async def run(self, inp: DSLInput) -> dict[str, str]:
        self.variables = dict(inp.variables)
        await self.execute(inp.root)
        return self.variables

    async def execute(self, stmt: Statement) -> None:
        if isinstance(stmt, ActivityStatement):
            result = await workflow.execute_activity(
                stmt.name,
                [self.variables.get(a, "") for a in stmt.arguments],
                result_type=str,
                start_to_close_timeout=timedelta(minutes=1),
            )
            if stmt.result:
                self.variables[stmt.result] = result
        elif isinstance(stmt, SequenceStatement):
            for element in stmt.elements:
                await self.execute(element)
        else:
            await asyncio.gather(*(self.execute(b) for b in stmt.branches))


def dsl_sequence(steps: int) -> DSLInput:
    """The sample's ``workflow1.yaml`` shape, ``steps`` long: each step reads the last."""
    elements: list[Statement] = []
    for i in range(1, steps + 1):
        args = ["arg1"] if i == 1 else [f"r{i - 1}"]
        elements.append(
            ActivityStatement(name=f"activity{(i - 1) % 5 + 1}", arguments=args, result=f"r{i}")
        )
    return DSLInput(root=SequenceStatement(elements=elements), variables={"arg1": "v1"})


def dsl_parallel() -> DSLInput:
    """The sample's ``workflow2.yaml``: a step, two parallel sequences, a step."""
    act = ActivityStatement
    return DSLInput(
        root=SequenceStatement(
            elements=[
                act(name="activity1", arguments=["arg1"], result="r1"),
                ParallelStatement(
                    branches=[
                        SequenceStatement(
                            elements=[
                                act(name="activity2", arguments=["r1"], result="r2"),
                                act(name="activity3", arguments=["r2"], result="r3"),
                            ]
                        ),
                        SequenceStatement(
                            elements=[
                                act(name="activity4", arguments=["r1"], result="r4"),
                                act(name="activity5", arguments=["r4"], result="r5"),
                            ]
                        ),
                    ]
                ),
                act(name="activity3", arguments=["r3", "r5"], result="r6"),
            ]
        ),
        variables={"arg1": "v1"},
    )


# --- the research-bot shape -------------------------------------------------------------


class ResearchBotInput(BaseModel):
    query: str
    searches: int = 5
    #: the same search twice in a level (identical calls among siblings)
    repeat_first: bool = False


class BotActivities:
    """Plan, search and write; searches finish in the reverse of their order (a later
    search is quicker), so completion order differs from scheduling order."""

    def __init__(self, calls: Calls) -> None:
        self.calls = calls

    @activity.defn(name="plan_searches")
    async def plan_searches(self, query: str) -> list[str]:
        self.calls.count()
        return [f"{query} aspect {i}" for i in range(1, 6)]

    @activity.defn(name="web_search")
    async def web_search(self, term: str) -> str:
        self.calls.count()
        digit = int(term.rsplit(" ", 1)[-1]) if term[-1:].isdigit() else 0
        await asyncio.sleep(0.05 * (6 - digit))
        return f"found: {term}"

    @activity.defn(name="write_report")
    async def write_report(self, findings: list[str]) -> str:
        self.calls.count()
        return " | ".join(findings)

    def all(self) -> list[object]:
        return [self.plan_searches, self.web_search, self.write_report]


@workflow.defn(name="ResearchBot")
class ResearchBotWorkflow:
    @workflow.run
    async def run(self, inp: ResearchBotInput) -> str:
        timeout = timedelta(minutes=1)
        terms = await workflow.execute_activity(
            "plan_searches", inp.query, result_type=list[str], start_to_close_timeout=timeout
        )
        terms = terms[: inp.searches]
        if inp.repeat_first:
            terms = [terms[0], *terms]
        findings = await asyncio.gather(
            *(
                workflow.execute_activity(
                    "web_search", t, result_type=str, start_to_close_timeout=timeout
                )
                for t in terms
            )
        )
        return await workflow.execute_activity(
            "write_report", list(findings), result_type=str, start_to_close_timeout=timeout
        )


# --- the tools agent --------------------------------------------------------------------


@workflow.defn(name="ToolsAgent")
class ToolsAgentWorkflow:
    @workflow.run
    async def run(self, question: str) -> str:
        agent: Agent[None] = Agent(
            name="Hello world",
            instructions="You are a helpful agent.",
            model="slow",
            tools=[
                activity_as_tool(
                    Mailer.email_customer, start_to_close_timeout=timedelta(seconds=30)
                )
            ],
        )
        result = await Runner.run(agent, input=question)
        return str(result.final_output)


# --- a fan-out of levels ----------------------------------------------------------------


class FanOutInput(BaseModel):
    levels: int = 3
    width: int = 8


class FanOutActivities:
    """One call per (level, branch); a later branch finishes sooner, so each level
    completes in the reverse of the order it was scheduled."""

    def __init__(self, calls: Calls, width: int = 8) -> None:
        self.calls = calls
        self.width = width

    @activity.defn(name="branch")
    async def branch(self, level: int, i: int, previous: str) -> str:
        self.calls.count()
        await asyncio.sleep(0.04 * (self.width - i))
        return f"L{level}.{i}<{len(previous)}>"

    @activity.defn(name="merge")
    async def merge(self, level: int, parts: list[str]) -> str:
        self.calls.count()
        return f"M{level}[{','.join(parts)}]"

    def all(self) -> list[object]:
        return [self.branch, self.merge]


@workflow.defn(name="FanOut")
class FanOutWorkflow:
    """``levels`` rounds of ``width`` parallel branch calls (``asyncio.gather``), each
    round merged by one call whose result feeds the next round."""

    @workflow.run
    async def run(self, inp: FanOutInput) -> str:
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


@workflow.defn(name="FanOut")
class FanOutChangedWorkflow:
    """``FanOut`` after a code change: its branch calls carry another input."""

    @workflow.run
    async def run(self, inp: FanOutInput) -> str:
        timeout = timedelta(minutes=1)
        parts = await asyncio.gather(
            *(
                workflow.execute_activity(
                    "branch",
                    args=[1, i, "changed"],
                    result_type=str,
                    start_to_close_timeout=timeout,
                )
                for i in range(inp.width)
            )
        )
        return ",".join(parts)


@workflow.defn(name="FanOut")
class FanOutSkippingWorkflow:
    """``FanOut`` whose first level leaves out the branch a fork's intervention names
    (``{"skip_branch": i}``): a fork that takes another path before its fork point."""

    @workflow.run
    async def run(self, inp: FanOutInput) -> str:
        timeout = timedelta(minutes=1)
        marker = current_fork()
        asked = (marker.intervention or {}) if marker is not None else {}
        skip = asked.get("skip_branch")
        parts = await asyncio.gather(
            *(
                workflow.execute_activity(
                    "branch", args=[1, i, ""], result_type=str, start_to_close_timeout=timeout
                )
                for i in range(inp.width)
                if i != skip
            )
        )
        return ",".join(parts)


@workflow.defn(name="ArrivalOrder")
class ArrivalOrderWorkflow:
    """The research bot writing its findings in the order they arrived: the report (and
    the write call's input) depends on the order the searches completed."""

    @workflow.run
    async def run(self, inp: ResearchBotInput) -> str:
        timeout = timedelta(minutes=1)
        terms = await workflow.execute_activity(
            "plan_searches", inp.query, result_type=list[str], start_to_close_timeout=timeout
        )
        arrived: list[str] = []

        async def search(term: str) -> None:
            arrived.append(
                await workflow.execute_activity(
                    "web_search", term, result_type=str, start_to_close_timeout=timeout
                )
            )

        await asyncio.gather(*(search(t) for t in terms[: inp.searches]))
        return await workflow.execute_activity(
            "write_report", arrived, result_type=str, start_to_close_timeout=timeout
        )


@workflow.defn(name="AwaitsApproval")
class AwaitsApprovalWorkflow:
    """Withdraws, then waits for an ``approve`` signal before it deposits: a run (and each
    fork of it) stays open until someone decides."""

    def __init__(self) -> None:
        self.approved = False

    @workflow.signal
    def approve(self) -> None:
        self.approved = True

    @workflow.run
    async def run(self, d: TransferDetails) -> str:
        withdrawn = await workflow.execute_activity(
            "withdraw", d, result_type=str, start_to_close_timeout=timedelta(seconds=30)
        )
        await workflow.wait_condition(lambda: self.approved)
        deposited = await workflow.execute_activity(
            "deposit", d, result_type=str, start_to_close_timeout=timedelta(seconds=30)
        )
        return f"{withdrawn} {deposited}"
