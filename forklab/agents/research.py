"""Example agent (a): the research pipeline — research, insights, risks, recommendations
(which charges the customer first), summary, finalize (a deterministic scorer).

With ``workspace`` set, the run also keeps files: after each section a ``workspace_write``
tool call writes ``report/<section>.md`` into the run's workspace and returns the sealed
layer that now holds it; the state's ``workspace_layer`` is that digest (the run's files
at that step), and a fork at step N continues from step N's layer.

Every model call and the charge are activities, so any step can be forked. The model is
named in the input; a fork swaps it with ``--model`` without touching this code.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from pydantic import BaseModel, ConfigDict, Field
from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, ApplicationError

from forklab.contracts.errors import ForkErrorType

with workflow.unsafe.imports_passed_through():
    from forklab.activities.runfork.workspace import WorkspaceStep, WorkspaceWrite
    from forklab.agents.inputs import AgentErrorType, checked_input
    from forklab.agents.research_score import PIPELINE, passes, score_sections
    from forklab.agents.tools import ChargeRequest, ChatAnswer, ChatCall, EffectResult

_CALL_TIMEOUT = timedelta(seconds=60)
_RETRY = RetryPolicy(maximum_attempts=5, maximum_interval=timedelta(seconds=5))


class ResearchInput(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    topic: str = Field(min_length=1, max_length=500)
    model: str = "fast"
    customer: str = "cust-1"
    amount_cents: int = Field(default=4900, gt=0)
    #: the ledger key name of the charge (one invoice per run lineage)
    invoice: str = "inv-1"
    temperature: float = Field(default=0.0, ge=0.0, le=2.0)
    #: end the run as failed (not completed) when the scorer fails the report
    fail_on_low_score: bool = True
    #: keep each section as a file in the run's workspace (a sealed layer per step)
    workspace: bool = False


def _blocked(exc: BaseException) -> bool:
    cause = exc.cause if isinstance(exc, ActivityError) else exc
    return isinstance(cause, ApplicationError) and cause.type == ForkErrorType.tool_blocked


@workflow.defn(name="ResearchPipeline")
class ResearchPipelineWorkflow:
    def __init__(self) -> None:
        self._state: dict[str, Any] = {}

    @workflow.run
    async def run(self, inp: ResearchInput) -> dict[str, Any]:
        inp = checked_input(ResearchInput, inp)
        state: dict[str, Any] = {
            "topic": inp.topic,
            "sections": {},
            "invoice": None,
            "status": "running",
            "score": None,
        }
        if inp.workspace:
            state["workspace_layer"] = None
        self._state = state
        for step in PIPELINE:
            if step == "recommendations":
                state["invoice"] = await self._charge(inp)
            context = "\n".join(f"{k}: {v}" for k, v in state["sections"].items())
            answer: ChatAnswer = await workflow.execute_activity(
                "chat_model",
                ChatCall(
                    model=inp.model,
                    messages=[
                        {"role": "system", "content": "You write one section of a report."},
                        {"role": "user", "content": f"STEP: {step}\nTOPIC: {inp.topic}\n{context}"},
                    ],
                    temperature=inp.temperature,
                ),
                result_type=ChatAnswer,
                start_to_close_timeout=_CALL_TIMEOUT,
                retry_policy=_RETRY,
                summary=f"{step}: model call",
            )
            state["sections"][step] = answer.content
            if inp.workspace:
                state["workspace_layer"] = await self._keep(
                    state["workspace_layer"], f"report/{step}.md", answer.content
                )
        score = score_sections(state["sections"])
        state["score"] = score
        state["status"] = "ok" if passes(score) else "failed"
        if state["status"] == "failed" and inp.fail_on_low_score:
            raise ApplicationError(
                f"the scorer failed the report (score {score:.2f})",
                state,
                type=AgentErrorType.low_quality_report,
                non_retryable=True,
            )
        return state

    async def _charge(self, inp: ResearchInput) -> dict[str, Any]:
        try:
            result: EffectResult = await workflow.execute_activity(
                "charge_customer",
                ChargeRequest(
                    key_name=inp.invoice, customer=inp.customer, amount_cents=inp.amount_cents
                ),
                result_type=EffectResult,
                start_to_close_timeout=_CALL_TIMEOUT,
                retry_policy=_RETRY,
                summary="recommendations: charge_customer",
            )
        except (ActivityError, ApplicationError) as exc:
            if _blocked(exc):
                return {"status": "blocked", "key_name": inp.invoice}
            raise
        return {"status": "charged", "key_name": result.key_name, "effect_id": result.effect_id}

    async def _keep(self, layer: str | None, path: str, content: str) -> str:
        done: WorkspaceStep = await workflow.execute_activity(
            "workspace_write",
            WorkspaceWrite(layer=layer, path=path, content=content),
            result_type=WorkspaceStep,
            start_to_close_timeout=_CALL_TIMEOUT,
            retry_policy=_RETRY,
            summary=f"workspace: write {path}",
        )
        return done.workspace_layer

    @workflow.query
    def state(self) -> dict[str, Any]:
        return self._state
