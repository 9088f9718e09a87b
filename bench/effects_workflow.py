"""The 6-step run of ``bench/crash_consistency.py``: every step charges the customer once
(key ``inv-<step>``) through the effect tools."""

from __future__ import annotations

from datetime import timedelta

from pydantic import BaseModel
from temporalio import workflow
from temporalio.common import RetryPolicy

with workflow.unsafe.imports_passed_through():
    from forklab.agents.tools import ChargeRequest, EffectResult

STEPS = 6


class EffectsInput(BaseModel):
    customer: str


@workflow.defn(name="BenchEffects")
class EffectsWorkflow:
    @workflow.run
    async def run(self, inp: EffectsInput) -> list[str]:
        out = []
        for i in range(1, STEPS + 1):
            r: EffectResult = await workflow.execute_activity(
                "charge_customer",
                ChargeRequest(key_name=f"inv-{i}", customer=inp.customer, amount_cents=100 * i),
                result_type=EffectResult,
                start_to_close_timeout=timedelta(seconds=4),
                retry_policy=RetryPolicy(initial_interval=timedelta(milliseconds=200)),
            )
            out.append(r.status)
        return out
