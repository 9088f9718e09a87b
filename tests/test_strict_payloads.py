"""Payloads are read by the shared strict reader (issue 35, point 7): a workflow input
holding ``NaN``, ``Infinity`` or ``1e999`` — which anyone who can start a workflow can send
(``temporal workflow start --input``) and pydantic's parser reads — fails the workflow at
once with ``BadInput``, before any activity; it is neither run with the number nor
retried for ever. Before, the run went ahead: its rehearsal ran the workload with the
number (and failed before approval, ``FailedBeforeApproval``, on what it did with it)."""

from __future__ import annotations

import asyncio
import json

import pytest
from orchestration_lab import Lab, make_spec
from temporalio.api.common.v1 import Payload
from temporalio.client import WorkflowFailureError
from temporalio.common import RawValue
from temporalio.exceptions import ApplicationError

from forklab.contracts.errors import ExperimentErrorType
from forklab.runtime import strict_json
from forklab.workers.converter import strict_data_converter
from forklab.workflows.experiment.messages import ExperimentInput, workflow_id


def _raw_input(lab: Lab, number: str) -> tuple[str, RawValue]:
    spec = make_spec(params={"twin_sleep": 0.25})
    inp = ExperimentInput(spec=spec, approver_public_key="00" * 32, requested_by="tests")
    text = inp.model_dump_json().replace('"twin_sleep":0.25', f'"twin_sleep":{number}')
    assert number in text
    data = Payload(metadata={"encoding": b"json/plain"}, data=text.encode())
    return spec.id, RawValue(data)


@pytest.mark.parametrize("number", ["NaN", "-Infinity", "1e999"])
async def test_a_workflow_input_holding_a_non_finite_number_fails_at_once(
    lab: Lab, number: str
) -> None:
    spec_id, raw = _raw_input(lab, number)
    handle = await lab.client.start_workflow(
        "ForkLabExperiment", raw, id=workflow_id(spec_id), task_queue=lab.settings.task_queue
    )
    with pytest.raises(WorkflowFailureError) as info:
        await asyncio.wait_for(handle.result(), timeout=60)
    cause = info.value.cause
    assert isinstance(cause, ApplicationError), cause
    assert cause.type == ExperimentErrorType.bad_input and "not a finite number" in cause.message
    assert await lab.activity_types(handle) == []  # nothing ran


def test_the_converter_refuses_deep_nesting_and_reads_what_forklab_writes() -> None:
    conv = strict_data_converter.payload_converter
    deep = Payload(metadata={"encoding": b"json/plain"}, data=b"[" * 300 + b"]" * 300)
    with pytest.raises(ApplicationError, match="nested deeper than"):
        conv.from_payloads([deep])
    value = {"a": [1.5, {"b": None}], "c": "NaN"}
    assert conv.from_payloads(conv.to_payloads([value])) == [value]
    assert json.loads(conv.to_payloads([float("nan")])[0].data) is None  # written as null
    assert strict_json.MAX_DEPTH < 300
