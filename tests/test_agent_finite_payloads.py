"""ForkLab's own agent workers refuse non-finite numbers and over-deep nesting in every
payload they accept (issue 35, point 7), although the OpenAI Agents plugin's converter
takes ``NaN``, ``Infinity`` and ``1e999`` and hands over the raw JSON where a value fails
validation. Each payload is sent raw (bypassing ForkLab's client, as ``temporal workflow
start --input`` would) to the shipped workers on a real dev server:

- the research pipeline's input: the run fails at once with the sentence (never a
  workflow task retried for ever);
- the team reviewer's ``review`` update: rejected (without the defence it was reviewed);
- the ``chat_model`` activity's input: fails once, non-retryably (without the defence the
  model was called).

A signal holding one is dropped, the run going on (``test_agent_wedge.py``). What a
workflow reads is refused by the agents' converter
(``forklab.workers.runfork.agent_converter``), an activity's input by the check of
``forklab.workflows.runfork.finite_payloads``.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from agent_fixtures import Services, agent_settings
from finite_workflows import ChatWithInfinity
from pydantic import BaseModel, ConfigDict
from temporalio.api.common.v1 import Payload
from temporalio.client import Client, WorkflowFailureError, WorkflowUpdateFailedError
from temporalio.common import RawValue
from temporalio.exceptions import ApplicationError
from temporalio.testing import WorkflowEnvironment

from forklab.agents.research import ResearchPipelineWorkflow
from forklab.agents.team import ReviewerInput, ReviewerWorkflow
from forklab.contracts.errors import ForkErrorType
from forklab.runtime import strict_json
from forklab.temporal import ensure_search_attributes
from forklab.workers.config import Settings
from forklab.workers.runfork.agent_config import AgentSettings
from forklab.workers.runfork.agent_worker import build_agent_worker, connect_agents
from forklab.workers.runfork.plugin import ForkLabPlugin
from forklab.workers.runfork.team_worker import build_team_worker, team_task_queue
from forklab.workflows.runfork.finite_payloads import FinitePayloads, check_args

#: Far longer than a refusal takes; without the defence some runs go on or wedge.
_WAIT = 30


@dataclass
class Workers:
    client: Client
    agent: AgentSettings


@pytest.fixture
async def workers(
    temporal_env: WorkflowEnvironment, services: Services, tmp_path: Path
) -> AsyncIterator[Workers]:
    agent = agent_settings(services, tmp_path / "home")
    target = temporal_env.client.service_client.config.target_host
    settings = Settings.load({"address": target, "home": tmp_path / "home"}, env={})
    client = await connect_agents(settings, agent)
    await ensure_search_attributes(client)
    agents = build_agent_worker(
        client, agent, workflows=[ResearchPipelineWorkflow, ChatWithInfinity]
    )
    async with agents, build_team_worker(client, agent):
        yield Workers(client=client, agent=agent)


def _raw(text: str) -> RawValue:
    return RawValue(Payload(metadata={"encoding": b"json/plain"}, data=text.encode()))


def _deep(levels: int) -> str:
    return "[" * levels + "]" * levels


def _refused(exc: BaseException | None) -> ApplicationError:
    assert isinstance(exc, ApplicationError), exc
    assert exc.type == ForkErrorType.payload_refused, exc
    assert exc.non_retryable
    return exc


@pytest.mark.parametrize(
    ("field", "expected"),
    [
        ('"temperature": NaN', "nan is not a finite number"),
        ('"temperature": -Infinity', "-inf is not a finite number"),
        ('"temperature": 1e999', "inf is not a finite number"),
        (f'"model": {_deep(strict_json.MAX_DEPTH + 50)}', "nested deeper than"),
    ],
)
async def test_a_research_input_holding_a_non_finite_number_fails_the_run_at_once(
    workers: Workers, field: str, expected: str
) -> None:
    handle = await workers.client.start_workflow(
        "ResearchPipeline",
        _raw('{"topic": "durable execution", ' + field + "}"),
        id=f"research-{uuid.uuid4().hex[:8]}",
        task_queue=workers.agent.agent_task_queue,
    )
    with pytest.raises(WorkflowFailureError) as failed:
        await asyncio.wait_for(handle.result(), _WAIT)
    refused = _refused(failed.value.cause)
    assert refused.message.startswith("a ResearchInput payload: "), refused.message
    assert expected in refused.message
    events = [e async for e in handle.fetch_history_events()]
    assert not [e for e in events if e.HasField("activity_task_scheduled_event_attributes")]
    # failed, not retried: one workflow task failure would be a task, not the run, failing
    assert not [e for e in events if e.HasField("workflow_task_failed_event_attributes")]


async def test_an_update_holding_infinity_is_rejected_and_the_reviewer_goes_on(
    workers: Workers,
) -> None:
    reviewer = await workers.client.start_workflow(
        ReviewerWorkflow.run,
        ReviewerInput(topic="durable execution"),
        id=f"reviewer-{uuid.uuid4().hex[:8]}",
        task_queue=team_task_queue(workers.agent),
    )
    with pytest.raises(WorkflowUpdateFailedError) as rejected:
        await asyncio.wait_for(
            reviewer.execute_update("review", _raw('{"conclusion": Infinity, "draft": "d"}')),
            _WAIT,
        )
    refused = _refused(rejected.value.cause).message
    assert refused.startswith("a ReviewRequest payload: field conclusion: inf "), refused
    # rejected before its validator: not in the history, the reviewer still takes a review
    events = [e async for e in reviewer.fetch_history_events()]
    assert not [
        e for e in events if e.HasField("workflow_execution_update_accepted_event_attributes")
    ]
    good = '{"conclusion": "a full and substantive conclusion of the research", "draft": "d"}'
    await reviewer.execute_update("review", _raw(good))
    assert "approved" in await asyncio.wait_for(reviewer.result(), _WAIT)


async def test_an_activity_input_holding_1e999_fails_without_a_retry(workers: Workers) -> None:
    outcome = await asyncio.wait_for(
        workers.client.execute_workflow(
            ChatWithInfinity.run,
            id=f"chat-{uuid.uuid4().hex[:8]}",
            task_queue=workers.agent.agent_task_queue,
        ),
        _WAIT,
    )
    assert outcome["type"] == ForkErrorType.payload_refused
    assert outcome["retry_state"] == "NON_RETRYABLE_FAILURE"
    assert outcome["message"].startswith("the activity's input: field [0].temperature: inf ")


@dataclass
class _Call:
    model: str
    extra: dict[str, object]


class _Loose(BaseModel):
    model_config = ConfigDict(extra="allow")

    name: str
    sections: dict[str, str]


@pytest.mark.parametrize(
    ("value", "where"),
    [
        (_Loose.model_construct(name="n", sections={"a": float("nan")}), "[0].sections.a"),
        (_Loose.model_validate({"name": "n", "sections": {}, "t": float("inf")}), "[0].t"),
        (_Call(model="m", extra={"x": [1.0, float("-inf")]}), "[0].extra.x[1]"),
    ],
)
def test_the_check_walks_the_models_and_dataclasses_a_converter_builds(
    value: object, where: str
) -> None:
    with pytest.raises(ApplicationError) as refused:
        check_args([value], "the workflow's input")
    assert f"field {where}: " in _refused(refused.value).message
    check_args([_Call(model="m", extra={"x": [1.0, 2]})], "the workflow's input")


def test_a_users_worker_keeps_its_own_rule_unless_it_asks(tmp_path: Path) -> None:
    """``ForkLabPlugin()`` adds no check (a user's ``NaN`` is theirs); the agents' does."""
    config: Any = {"client": None, "task_queue": "q"}
    plain = ForkLabPlugin(tmp_path / "runlog.sqlite").configure_worker(dict(config))
    strict = ForkLabPlugin(tmp_path / "runlog.sqlite", strict_payloads=True)
    assert not [i for i in plain["interceptors"] if isinstance(i, FinitePayloads)]
    assert isinstance(strict.configure_worker(dict(config))["interceptors"][0], FinitePayloads)
