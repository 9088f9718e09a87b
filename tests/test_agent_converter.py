"""The agents' converter (``forklab.workers.runfork.agent_converter``) without a server:
what it refuses where a workflow reads, what it leaves to the OpenAI Agents plugin's
reading, and that the plugin that installs it configures a client more than once.
The same refusals on a real dev server: ``test_agent_wedge.py``."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from agents.items import ModelResponse
from temporalio.api.common.v1 import Payload
from temporalio.converter import (
    ActivitySerializationContext,
    DataConverter,
    WorkflowSerializationContext,
)
from temporalio.exceptions import ApplicationError
from temporalio.openai_agents import ModelActivityParameters
from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner

from forklab.agents.team import Findings
from forklab.contracts.errors import ForkErrorType
from forklab.workers.runfork.agent_converter import (
    MAX_PAYLOAD_BYTES,
    StrictAgentJSONPayloadConverter,
    StrictAgentPayloadConverter,
    StrictAgentsPlugin,
    drifts,
)

_WORKFLOW = WorkflowSerializationContext(namespace="default", workflow_id="w")
_ACTIVITY = ActivitySerializationContext(
    namespace="default",
    workflow_id="w",
    workflow_type="W",
    activity_type="chat_model",
    activity_id="1",
    activity_task_queue="q",
    is_local=False,
)
_GOOD = {"topic": "t", "sections": {"a": "b"}, "conclusion": "c"}


def _json(converter: StrictAgentPayloadConverter) -> StrictAgentJSONPayloadConverter:
    found = converter.converters[b"json/plain"]
    assert isinstance(found, StrictAgentJSONPayloadConverter)
    return found


def _payload(data: bytes) -> Payload:
    return Payload(metadata={"encoding": b"json/plain"}, data=data)


def _deep(levels: int) -> bytes:
    return b"[" * levels + b"]" * levels


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (_deep(10_000), "a Findings payload: nested deeper than 200 levels"),
        (b'{"topic": ' + _deep(250) + b"}", "a Findings payload: nested deeper than 200 levels"),
        (b'"' + b"x" * MAX_PAYLOAD_BYTES + b'"', f"a Findings payload: {MAX_PAYLOAD_BYTES + 2} "),
        (b'{"conclusion": NaN}', "a Findings payload: field conclusion: nan is not a finite"),
        (b'{"x": [1e999]}', "a Findings payload: field x[0]: inf is not a finite number"),
        (b"{'topic': 1}", "a Findings payload: not JSON (Expecting property name"),
        (b'"\xff"', "a Findings payload: not JSON ("),
        (b'"findings"', "a Findings payload does not validate (1 error, first: field (top "),
        (b'{"topic": "t"}', "a Findings payload does not validate (2 errors, first: field sec"),
    ],
    ids=[
        *("10000-deep", "250-deep", "oversize", "nan", "1e999"),
        *("not-json", "not-utf8", "text", "missing"),
    ],
)
def test_a_workflow_reads_only_json_it_can_honour(data: bytes, reason: str) -> None:
    strict = StrictAgentPayloadConverter().with_context(_WORKFLOW)
    with pytest.raises(ApplicationError) as refused:
        strict.from_payloads([_payload(data)], [Findings])
    error = refused.value
    assert error.type == ForkErrorType.payload_refused and error.non_retryable
    assert error.message.startswith(reason), error.message
    assert "\n" not in error.message


def test_a_good_payload_reads_as_the_plugin_reads_it_and_writes_the_same_bytes() -> None:
    plain = StrictAgentPayloadConverter()
    strict = plain.with_context(_WORKFLOW)
    [payload] = plain.to_payloads([Findings.model_validate(_GOOD)])
    assert strict.to_payloads([Findings.model_validate(_GOOD)]) == [payload]
    [value] = strict.from_payloads([payload], [Findings])
    assert value == Findings.model_validate(_GOOD)
    assert strict.from_payloads([_payload(b'{"a": [1, 2.5, null]}')]) == [{"a": [1, 2.5, None]}]


def test_an_activity_keeps_the_plugins_reading() -> None:
    """An activity's input and result (and a converter with no context) are read as the
    plugin reads them: a value that fails validation comes back as the raw JSON."""
    converter = StrictAgentPayloadConverter()
    activity = converter.with_context(_ACTIVITY)
    assert activity.from_payloads([_payload(b'"findings"')], [Findings]) == ["findings"]
    assert _json(converter).from_payload(_payload(b'"findings"'), Findings) == "findings"


def test_the_openai_agents_sdks_types_keep_the_lenient_reading() -> None:
    assert drifts(ModelResponse) and drifts(list[ModelResponse])
    assert drifts(dict[str, ModelResponse | None])
    assert not drifts(Findings) and not drifts(dict) and not drifts(list[Findings])


def _plugin() -> StrictAgentsPlugin:
    return StrictAgentsPlugin(
        model_params=ModelActivityParameters(start_to_close_timeout=timedelta(seconds=5))
    )


def test_the_plugin_puts_the_converter_in_place_once_or_twice() -> None:
    """The OpenAI Agents plugin refuses any converter but its own; configured again (a
    client made from this client's config) it must not refuse the strict one."""
    config: Any = {"data_converter": DataConverter.default}
    for _ in range(2):
        config = _plugin().configure_client(config)
        assert config["data_converter"].payload_converter_class is StrictAgentPayloadConverter
    replayer: Any = _plugin().configure_replayer(
        {"data_converter": DataConverter.default, "workflow_runner": SandboxedWorkflowRunner()}
    )
    assert replayer["data_converter"].payload_converter_class is StrictAgentPayloadConverter
