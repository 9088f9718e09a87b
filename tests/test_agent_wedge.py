"""No payload wedges ForkLab's agent workers, and no memo wedges a ForkLabPlugin worker.

"Wedged": a workflow task that fails for ever (Temporal retries it), a worker that stops
serving, or a ``RecursionError`` that takes more than one run down. Each payload is sent
raw (as ``temporal workflow start --input`` or any client would) to the shipped workers
on a real dev server:

- the research pipeline started with an input nested 10,000 levels deep (at the top and
  in a field), a 1.2 MB one, or one of the wrong shape, beside a good run on the same
  worker: each bad one fails at once with one sentence naming the input's type, no
  workflow task fails, and the good run completes;
- a running team: updates of the wrong shape (a string, a missing field, nested 10,000
  deep, ``Infinity``) to the reviewer are rejected before its validator runs, and the
  same as signals to the writer are dropped (logged by the SDK with the sentence); then
  the good findings arrive and the team completes, no workflow task failed anywhere;
- a user's workflow on a ``ForkLabPlugin`` worker (pydantic's converter) started with a
  memo value nested 10,000 deep under its own key completes (the fork interceptor reads
  only ForkLab's keys), carrying it on undecoded at continue-as-new, and one under
  ForkLab's marker key fails at once.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from agent_fixtures import Services, agent_settings
from fork_workloads import StepsInput, StepsWorkflow, echo
from sample_workflows import Bank, Calls, MoneyTransferWorkflow, TransferDetails
from temporalio.api.common.v1 import Payload
from temporalio.client import (
    Client,
    WorkflowExecutionStatus,
    WorkflowFailureError,
    WorkflowHandle,
    WorkflowUpdateFailedError,
)
from temporalio.common import RawValue
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.exceptions import ApplicationError
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from forklab.agents.research import ResearchInput, ResearchPipelineWorkflow
from forklab.agents.team import ReviewerInput, ReviewerWorkflow, WriterInput
from forklab.contracts.errors import ForkErrorType
from forklab.contracts.runfork import MARKER_MEMO_KEY
from forklab.temporal import ForkLabPlugin, ensure_search_attributes
from forklab.workers.config import Settings
from forklab.workers.runfork.agent_config import AgentSettings
from forklab.workers.runfork.agent_converter import MAX_PAYLOAD_BYTES
from forklab.workers.runfork.agent_worker import build_agent_worker, connect_agents
from forklab.workers.runfork.team_worker import build_team_worker, team_task_queue

#: Far longer than a refusal takes (a wedged run never ends: the wait is the failure).
_WAIT = 30
#: What "at once" means here, on a loaded machine: a few workflow tasks.
_PROMPT = 15
_DEEP = 10_000
_LIMIT = f"an agent worker's workflows read JSON of at most {MAX_PAYLOAD_BYTES} bytes"


@dataclass
class Lab:
    client: Client
    agent: AgentSettings
    env: WorkflowEnvironment
    home: Path


@pytest.fixture
async def lab(
    temporal_env: WorkflowEnvironment, services: Services, tmp_path: Path
) -> AsyncIterator[Lab]:
    agent = agent_settings(services, tmp_path / "home")
    target = temporal_env.client.service_client.config.target_host
    settings = Settings.load({"address": target, "home": tmp_path / "home"}, env={})
    client = await connect_agents(settings, agent)
    await ensure_search_attributes(client)
    agents = build_agent_worker(client, agent, workflows=[ResearchPipelineWorkflow])
    async with agents, build_team_worker(client, agent):
        yield Lab(client=client, agent=agent, env=temporal_env, home=tmp_path / "home")


def _raw(text: str) -> RawValue:
    return RawValue(Payload(metadata={"encoding": b"json/plain"}, data=text.encode()))


def _deep(levels: int) -> str:
    return "[" * levels + "]" * levels


def _refused(exc: BaseException | None) -> ApplicationError:
    assert isinstance(exc, ApplicationError), exc
    assert exc.type == ForkErrorType.payload_refused, exc
    assert exc.non_retryable and "\n" not in exc.message, exc
    return exc


async def _task_failures(handle: WorkflowHandle[Any, Any]) -> list[str]:
    return [
        e.workflow_task_failed_event_attributes.failure.message
        async for e in handle.fetch_history_events()
        if e.HasField("workflow_task_failed_event_attributes")
    ]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (_deep(_DEEP), ": nested deeper than 200 levels; refused: "),
        ('{"topic": "t", "model": ' + _deep(_DEEP) + "}", ": nested deeper than 200 levels"),
        ('{"topic": "' + "x" * 1_200_000 + '"}', f": 1200013 bytes; refused: {_LIMIT}"),
        ('{"topic": "t", "amount_cents": "many"}', " does not validate (1 error, first: "),
        ('"just text"', " does not validate (1 error, first: field (top level): "),
    ],
    ids=["10000-deep", "10000-deep-field", "1.2MB", "wrong-type", "not-an-object"],
)
async def test_a_bad_research_input_fails_at_once_and_the_worker_serves_the_next_run(
    lab: Lab, text: str, expected: str
) -> None:
    good = await lab.client.start_workflow(
        ResearchPipelineWorkflow.run,
        ResearchInput(topic="durable execution", model="slow"),
        id=f"good-{uuid.uuid4().hex[:8]}",
        task_queue=lab.agent.agent_task_queue,
    )
    started = time.monotonic()
    bad = await lab.client.start_workflow(
        "ResearchPipeline",
        _raw(text),
        id=f"bad-{uuid.uuid4().hex[:8]}",
        task_queue=lab.agent.agent_task_queue,
    )
    with pytest.raises(WorkflowFailureError) as failed:
        await asyncio.wait_for(bad.result(), _WAIT)
    assert time.monotonic() - started < _PROMPT
    refused = _refused(failed.value.cause)
    assert refused.message.startswith("a ResearchInput payload"), refused.message
    assert expected in refused.message, refused.message
    assert await _task_failures(bad) == []
    events = [e async for e in bad.fetch_history_events()]
    assert not [e for e in events if e.HasField("activity_task_scheduled_event_attributes")]
    # the same worker, the same time: the good run was not taken down with it
    assert (await asyncio.wait_for(good.result(), 90))["status"] == "ok"
    assert await _task_failures(good) == []


#: Wrong shapes for the writer's ``findings`` signal and the reviewer's ``review`` update.
_JUNK = {
    "a string": '"findings"',
    "a list": "[1, 2, 3]",
    "a missing field": '{"topic": "t"}',
    "a field of the wrong type": '{"topic": "t", "sections": "s", "conclusion": "c", "draft": 5}',
    "nested 10,000 deep": '{"topic": "t", "sections": ' + _deep(_DEEP) + "}",
    "Infinity": '{"topic": "t", "sections": {}, "conclusion": Infinity, "draft": "d"}',
    "NaN in an unknown field": '{"conclusion": "c", "draft": "d", "extra": NaN}',
}


async def test_messages_of_the_wrong_shape_are_refused_and_the_team_goes_on(
    lab: Lab, caplog: pytest.LogCaptureFixture
) -> None:
    queue = team_task_queue(lab.agent)
    suffix = uuid.uuid4().hex[:8]
    reviewer = await lab.client.start_workflow(
        ReviewerWorkflow.run,
        ReviewerInput(topic="durable execution"),
        id=f"reviewer-{suffix}",
        task_queue=queue,
    )
    writer = await lab.client.start_workflow(
        "TeamWriter",
        WriterInput(topic="durable execution", reviewer=reviewer.id),
        id=f"writer-{suffix}",
        task_queue=queue,
    )
    for what, text in _JUNK.items():
        with pytest.raises(WorkflowUpdateFailedError) as rejected:
            await asyncio.wait_for(reviewer.execute_update("review", _raw(text)), _WAIT)
        refused = _refused(rejected.value.cause)
        assert refused.message.startswith("a ReviewRequest payload"), (what, refused.message)
    caplog.set_level(logging.ERROR, logger="temporalio")
    for text in _JUNK.values():
        await writer.signal("findings", _raw(text))
    # dropped, each logged with the sentence; the writer still waits for its findings
    deadline = time.monotonic() + _WAIT
    while len(_dropped(caplog)) < len(_JUNK) and time.monotonic() < deadline:
        await asyncio.sleep(0.2)
    dropped = _dropped(caplog)
    assert len(dropped) == len(_JUNK), [r.getMessage() for r in caplog.records]
    assert all(m.startswith("a Findings payload") for m in dropped), dropped
    assert (await writer.describe()).status == WorkflowExecutionStatus.RUNNING
    # rejected updates leave nothing in the reviewer's history
    events = [e async for e in reviewer.fetch_history_events()]
    assert not [
        e for e in events if e.HasField("workflow_execution_update_accepted_event_attributes")
    ]
    full = "a full and substantive conclusion of the research on durable execution"
    findings = {"topic": "durable execution", "sections": {"r": full}, "conclusion": full}
    await writer.signal("findings", findings)
    result = await asyncio.wait_for(writer.result(), 90)
    assert result["conclusion"] == full and "approved" in result["review"]
    assert "approved" in await asyncio.wait_for(reviewer.result(), _WAIT)
    assert await _task_failures(writer) == [] and await _task_failures(reviewer) == []


def _dropped(caplog: pytest.LogCaptureFixture) -> list[str]:
    """The messages of the refusals the SDK logged as it dropped a ``findings`` signal."""
    return [
        r.exc_info[1].message
        for r in caplog.records
        if "dropping the signal" in r.getMessage()
        and r.exc_info is not None
        and isinstance(r.exc_info[1], ApplicationError)
        and r.exc_info[1].type == ForkErrorType.payload_refused
    ]


async def test_a_deep_memo_neither_wedges_a_plugin_worker_nor_passes_as_a_marker(
    lab: Lab,
) -> None:
    """A user's worker with ``ForkLabPlugin`` and its own converter (pydantic's): the fork
    interceptor, in every run, decodes only ForkLab's memo keys, each alone."""
    config = lab.env.client.config()
    config["data_converter"] = pydantic_data_converter
    client = Client(**config)
    queue = f"plugin-{uuid.uuid4().hex[:8]}"
    details = TransferDetails(source="a", target="b", amount=5, reference="r")
    deep = Payload(metadata={"encoding": b"json/plain"}, data=_deep(_DEEP).encode())
    bank = Bank(Calls())
    async with Worker(
        client,
        task_queue=queue,
        workflows=[MoneyTransferWorkflow, StepsWorkflow],
        activities=[bank.withdraw, bank.deposit, bank.refund, echo],
        plugins=[ForkLabPlugin(lab.home / "runlog.sqlite")],
    ):
        theirs = await client.start_workflow(
            MoneyTransferWorkflow.run,
            details,
            id=f"transfer-{uuid.uuid4().hex[:8]}",
            task_queue=queue,
            memo={"note": RawValue(deep)},
        )
        assert await asyncio.wait_for(theirs.result(), _WAIT) == "transferred: W-r D-r"
        # carried on at continue-as-new as it came, undecoded
        steps = await client.start_workflow(
            StepsWorkflow.run,
            StepsInput(steps=2, can_every=1),
            id=f"steps-{uuid.uuid4().hex[:8]}",
            task_queue=queue,
            memo={"note": RawValue(deep)},
        )
        assert len(await asyncio.wait_for(steps.result(), _WAIT)) == 2
        last = await client.get_workflow_handle(steps.id).describe()
        assert last.run_id != steps.result_run_id
        assert last.raw_description.workflow_execution_info.memo.fields["note"] == deep
        ours = await client.start_workflow(
            MoneyTransferWorkflow.run,
            details,
            id=f"transfer-{uuid.uuid4().hex[:8]}",
            task_queue=queue,
            memo={MARKER_MEMO_KEY: RawValue(deep)},
        )
        with pytest.raises(WorkflowFailureError) as failed:
            await asyncio.wait_for(ours.result(), _WAIT)
    cause = failed.value.cause
    assert isinstance(cause, ApplicationError) and cause.type == ForkErrorType.marker_invalid
    assert cause.message.startswith(f"memo {MARKER_MEMO_KEY!r} cannot be read ("), cause.message
    assert await _task_failures(theirs) == [] and await _task_failures(ours) == []
    assert await _task_failures(client.get_workflow_handle(steps.id)) == []
