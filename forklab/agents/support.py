"""Example agent (b): a support agent written with the OpenAI Agents SDK, run on Temporal
through ``temporalio-openai-agents``. Its model calls are the plugin's
``invoke_model_activity`` and its one tool, ``email.send``, is an activity.

Nothing here knows about forks: the worker interceptor forks it like any workflow.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from pydantic import BaseModel, ConfigDict, Field
from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from agents import Agent, ModelSettings, Runner
    from temporalio.openai_agents.workflow import activity_as_tool

    from forklab.agents.inputs import checked_input
    from forklab.agents.tools import EffectTools


class SupportInput(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    ticket: str = Field(min_length=1, max_length=2000)
    customer: str = "customer@example.test"
    model: str = "slow"
    #: the model's sampling temperature (None: the endpoint's default)
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)


class SupportResult(BaseModel):
    final_output: str


@workflow.defn(name="SupportAgent")
class SupportAgentWorkflow:
    @workflow.run
    async def run(self, inp: SupportInput) -> SupportResult:
        inp = checked_input(SupportInput, inp)
        # only a temperature that was asked for changes the model settings: an input
        # without one makes the same model calls as before the field existed
        sampling: dict[str, Any] = (
            {}
            if inp.temperature is None
            else {"model_settings": ModelSettings(temperature=inp.temperature)}
        )
        agent: Agent[None] = Agent(
            name="support",
            instructions="Answer the customer's ticket; send them an email when needed.",
            model=inp.model,
            tools=[
                activity_as_tool(
                    EffectTools.send_email, start_to_close_timeout=timedelta(seconds=60)
                )
            ],
            **sampling,
        )
        result = await Runner.run(agent, f"TICKET: {inp.ticket}\nCUSTOMER: {inp.customer}")
        return SupportResult(final_output=str(result.final_output))
