"""A zombie attempt on a real dev server: attempt 1 applies the charge and hangs past its
timeout; attempt 2 finds the key claimed without a result (the ambiguous window), asks
the payments service, records what it found; attempt 1's late completion is rejected."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

from agent_fixtures import Services
from fork_workloads import ChargeOnceWorkflow
from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from activities.agent_tools import EffectTools, LedgerMode
from activities.effect_ledger import EffectLedger
from workflows.runfork.interceptor import ForkInterceptor


async def test_zombie_completion_is_rejected_and_nothing_is_charged_twice(
    temporal_env: WorkflowEnvironment, services: Services, tmp_path: Path
) -> None:
    client = await Client.connect(
        temporal_env.client.service_client.config.target_host,
        data_converter=pydantic_data_converter,
    )
    ledger = EffectLedger(tmp_path / "effects.sqlite")
    tools = EffectTools(
        services.effects_url,
        ledger,
        LedgerMode.ledger_query,
        crash_point="after_apply",
        crash_flag=tmp_path / "hung",
        hang_seconds=4.0,
    )
    queue = f"zombie-{uuid.uuid4().hex[:8]}"
    customer = f"zombie-{uuid.uuid4().hex[:6]}"
    async with Worker(
        client,
        task_queue=queue,
        workflows=[ChargeOnceWorkflow],
        activities=[tools.charge_customer],
        interceptors=[ForkInterceptor()],
    ):
        status = await client.execute_workflow(
            ChargeOnceWorkflow.run, customer, id=customer, task_queue=queue
        )
        assert status == "recovered"  # attempt 2 found the applied charge by its key
        for _ in range(100):  # wait for the zombie to wake up and try to complete
            if any(e["event"] == "complete:rejected" for e in ledger.events(customer)):
                break
            await asyncio.sleep(0.1)
    events = [(e["event"], e["epoch"]) for e in ledger.events(customer)]
    assert events == [
        ("claim:new", 1),
        ("claim:ambiguous", 2),
        ("complete", 2),
        ("complete:rejected", 2),
    ]
    charges = [
        e
        for e in services.effects_log()
        if e["kind"] == "charge" and e["params"]["customer"] == customer
    ]
    assert len(charges) == 1
    (entry,) = ledger.entries(customer)
    assert entry.epoch == 2 and entry.result is not None and entry.result["status"] == "recovered"
