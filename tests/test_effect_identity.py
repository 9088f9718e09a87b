"""Effect identity is run identity (issue 35, point 1), on a real dev server, the real
payments service and both ledger backends (a SQLite home; a PostgreSQL database of the
test's own): a second run under a workflow id that an earlier, closed run used, and a
run with the same id in another namespace sharing the store, each charge for real (a
new effect, its own ``Idempotency-Key``) and see only their own ledger entries and
run-log events. Keyed by the bare workflow id, the second run replayed the first run's
charge and the service was never called."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from agent_fixtures import Services
from fork_workloads import ChargeOnceWorkflow
from google.protobuf.duration_pb2 import Duration
from stores_lab import postgres_database
from temporalio.api.workflowservice.v1 import RegisterNamespaceRequest
from temporalio.client import Client, WorkflowHandle
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.service import RPCError
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from forklab.activities.runfork.run_context import RunContextInterceptor
from forklab.activities.stores.run_log import RunLog
from forklab.agents.tools import EffectTools, LedgerMode
from forklab.cli.runfork.agent_lab import AgentLab
from forklab.experiments.runfork.identity import effect_scope, run_stream
from forklab.workers.config import Settings
from forklab.workers.runfork.agent_config import AgentSettings
from forklab.workers.stores import effect_ledger
from forklab.workflows.runfork.interceptor import ForkInterceptor


@pytest.fixture(params=["sqlite", "postgresql"])
def agent(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[AgentSettings]:
    """One home (run log, and the SQLite ledger or the PostgreSQL one) for every run."""
    if request.param == "sqlite":
        yield AgentSettings(home=tmp_path)
        return
    with postgres_database() as url:
        settings = Settings.load({"home": tmp_path}, env={"FORKLAB_LEDGER": url})
        yield AgentSettings.load(settings, env={})


async def _client(env: WorkflowEnvironment, namespace: str = "default") -> Client:
    return await Client.connect(
        env.client.service_client.config.target_host,
        namespace=namespace,
        data_converter=pydantic_data_converter,
    )


async def _other_namespace(env: WorkflowEnvironment) -> Client:
    """A client of a namespace of its own on the same dev server, once the server serves it."""
    name = f"other-{uuid.uuid4().hex[:8]}"
    await env.client.workflow_service.register_namespace(
        RegisterNamespaceRequest(
            namespace=name, workflow_execution_retention_period=Duration(seconds=86400)
        )
    )
    client = await _client(env, name)
    for _ in range(200):
        try:
            await client.count_workflows()
            return client
        except RPCError:
            await asyncio.sleep(0.1)
    raise AssertionError(f"namespace {name} never became available")


def _charges(services: Services, customer: str) -> list[dict[str, Any]]:
    return [
        e
        for e in services.effects_log()
        if e["kind"] == "charge" and e["params"]["customer"] == customer
    ]


def _worker(client: Client, queue: str, tools: EffectTools, log: RunLog) -> Worker:
    return Worker(
        client,
        task_queue=queue,
        workflows=[ChargeOnceWorkflow],
        activities=[tools.charge_customer],
        interceptors=[ForkInterceptor(), RunContextInterceptor(log)],
    )


async def _charge(client: Client, run: str, queue: str) -> tuple[str, WorkflowHandle[Any, Any]]:
    handle = await client.start_workflow(ChargeOnceWorkflow.run, run, id=run, task_queue=queue)
    return await handle.result(), handle


def _own_events(log: RunLog, client: Client, handle: WorkflowHandle[Any, Any]) -> list[str]:
    stream = run_stream(client.namespace, handle.id, handle.first_execution_run_id or "")
    return [e.producer.split("/")[0] for e in log.read(stream)]


async def test_a_reused_workflow_id_charges_again_and_sees_only_its_own_effects(
    temporal_env: WorkflowEnvironment, services: Services, agent: AgentSettings
) -> None:
    client = await _client(temporal_env)
    ledger, log = effect_ledger(agent), RunLog(agent.run_log_path)
    tools = EffectTools(services.effects_url, ledger, LedgerMode.ledger_query)
    queue, run = f"identity-{uuid.uuid4().hex[:8]}", f"monthly-{uuid.uuid4().hex[:6]}"
    lab = AgentLab(client, agent)
    async with _worker(client, queue, tools, log):
        first_status, first = await _charge(client, run, queue)
        first_scope = await lab.effect_scope(run)
        # next month: the same id again, after the first run closed
        second_status, second = await _charge(client, run, queue)
        second_scope = await lab.effect_scope(run)
    assert (first_status, second_status) == ("applied", "applied")
    charges = _charges(services, run)
    assert len(charges) == 2  # the payments service was called for each month
    assert charges[0]["key"] != charges[1]["key"]  # each with its own Idempotency-Key
    assert first_scope != second_scope
    (a,) = ledger.entries(first_scope)
    (b,) = ledger.entries(second_scope)
    assert a.result is not None and b.result is not None
    assert {a.result["effect_id"], b.result["effect_id"]} == {c["effect_id"] for c in charges}
    # the run log: each run reads its own start and end, not the other's
    assert _own_events(log, client, first) == [first.first_execution_run_id] * 2
    assert _own_events(log, client, second) == [second.first_execution_run_id] * 2
    stream = await lab.run_stream(run)  # what `forklab watch` reads: the latest run's
    assert [e.producer.split("/")[0] for e in lab.watch(stream)] == [
        second.first_execution_run_id
    ] * 2
    assert (await lab.trail(run))["ledger"] == [b.model_dump(mode="json")]


async def test_one_id_in_two_namespaces_on_one_store_charges_in_each(
    temporal_env: WorkflowEnvironment, services: Services, agent: AgentSettings
) -> None:
    here, there = await _client(temporal_env), await _other_namespace(temporal_env)
    ledger, log = effect_ledger(agent), RunLog(agent.run_log_path)
    tools = EffectTools(services.effects_url, ledger, LedgerMode.ledger_query)
    queue, run = f"identity-{uuid.uuid4().hex[:8]}", f"monthly-{uuid.uuid4().hex[:6]}"
    async with _worker(here, queue, tools, log), _worker(there, queue, tools, log):
        status_here, run_here = await _charge(here, run, queue)
        status_there, run_there = await _charge(there, run, queue)
        scope_here = await AgentLab(here, agent).effect_scope(run)
        scope_there = await AgentLab(there, agent).effect_scope(run)
    assert (status_here, status_there) == ("applied", "applied")
    charges = _charges(services, run)
    assert len(charges) == 2 and charges[0]["key"] != charges[1]["key"]
    assert scope_here != scope_there
    assert len(ledger.entries(scope_here)) == len(ledger.entries(scope_there)) == 1
    assert _own_events(log, here, run_here) == [run_here.first_execution_run_id] * 2
    assert _own_events(log, there, run_there) == [run_there.first_execution_run_id] * 2


def test_a_namespace_and_root_pair_is_one_to_one() -> None:
    """A joined string would let namespace ``a/b`` with root ``c`` meet namespace ``a``
    with root ``b/c``; the scope keeps them apart."""
    assert effect_scope("a/b", "c") != effect_scope("a", "b/c")
    assert run_stream("a", "b", "c") != run_stream("a", "b/c", "")
