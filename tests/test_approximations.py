"""The typed approximations of an approximate fork, and the input drift a fork is known
to have before it starts: a call whose recorded input holds the parent's workflow id
where nothing handed to the workflow did (pure)."""

from __future__ import annotations

import base64
import json

from temporalio.api.common.v1 import Payload

from forklab.experiments.runfork.approximations import (
    Approximation,
    ApproximationKind,
    id_drift,
    predicted_id_drift,
)
from forklab.experiments.runfork.receipt import (
    BoundaryError,
    BoundaryMode,
    ForkReceipt,
    resolve_boundary,
)
from forklab.experiments.runfork.steps import Step, StepStatus, payload_digest

ENC = b"json/plain"


def _step(index: int, data: bytes, result: bytes = b'"ok"') -> Step:
    payload = Payload(metadata={"encoding": ENC}, data=result)
    return Step(
        index=index,
        activity_type="reserve",
        input_sha256=payload_digest([(ENC, data)]),
        status=StepStatus.completed,
        run_id="r",
        result_b64=base64.b64encode(payload.SerializeToString()).decode(),
    )


def test_a_call_asking_with_the_parent_id_is_predicted_with_both_digests() -> None:
    data = b'"pay-42-order"'
    step = _step(1, data)
    [drift] = id_drift([step], {1: [(ENC, data)]}, [(0, b"[]")], "pay-42", "pay-42/at-1")
    assert (drift.kind, drift.step) == (ApproximationKind.input_drift, 1)
    assert drift.parent_input_sha256 == step.input_sha256
    assert drift.fork_input_sha256 == payload_digest([(ENC, b'"pay-42/at-1-order"')])
    # an exact boundary is refused at that step, before anything starts
    try:
        resolve_boundary([step], [], 1, BoundaryMode.exact, drift=[drift])
    except BoundaryError as exc:
        assert str(exc).startswith(
            "cannot fork exactly at step 1: step 1: reserve asks with the parent's "
            "workflow id 'pay-42' in its input"
        )
    else:
        raise AssertionError("an exact fork with a known drift was accepted")
    approx = resolve_boundary([step], [], 1, BoundaryMode.approximate, drift=[drift])
    assert approx.approximations == [drift] and not approx.restorable


def test_an_id_the_workflow_was_handed_is_no_known_drift() -> None:
    """The id in the start input, in a result or message before the call: the value may
    have come from there (the fork is handed the same), so nothing is predicted."""
    data = b'{"order": "pay-42"}'
    step = _step(2, data)
    holding = {2: [(ENC, data)]}
    assert id_drift([step], holding, [(0, b'{"order": "pay-42"}')], "pay-42", "f") == []
    assert id_drift([step], holding, [(1, b"R-pay-42")], "pay-42", "fork-1") == []
    # a result of the step itself, or after it, was not handed over before the call
    assert len(id_drift([step], holding, [(2, b"R-pay-42")], "pay-42", "fork-1")) == 1
    # ids too short to tell from other text are not looked for
    assert predicted_id_drift([(ENC, b'"ab-order"')], "ab", "fork-1") is None


def test_an_escaped_id_is_replaced_as_escaped() -> None:
    parent = 'pay "quoted"'
    data = json.dumps({"ref": f"{parent}-1"}).encode()
    predicted = predicted_id_drift([(ENC, data)], parent, "fork-1")
    assert predicted == payload_digest([(ENC, json.dumps({"ref": "fork-1-1"}).encode())])


def test_a_receipt_written_before_approximations_were_typed_still_reads() -> None:
    receipt = {
        "fork_workflow_id": "f",
        "name": "f",
        "requested_step": 1,
        "resolved_step": 1,
        "parent_workflow_id": "p",
        "parent_run_id": "r",
        "source_run_id": "r",
        "lineage": ["p"],
        "boundary": "approximate",
        "prefix_sha256": "0" * 64,
        "restorable": False,
        "why": "approximate",
        "approximations": ["inherited calls are matched by activity type"],
        "tool_policies": {},
        "requested_by": "t",
        "created_at": "2026-01-01T00:00:00Z",
    }
    r = ForkReceipt.model_validate(receipt)
    assert r.approximations == [
        Approximation(
            kind=ApproximationKind.noted, detail="inherited calls are matched by activity type"
        )
    ]
    # and a typed one round-trips as it was written
    assert ForkReceipt.model_validate_json(r.model_dump_json()) == r


def test_the_history_parser_keeps_inputs_holding_the_run_id_and_drift_records() -> None:
    """What ``forklab fork`` predicts from (a step's input holding the run's workflow id)
    and what ``forklab trail`` reads (``forklab.record_drift``): a record that does not
    parse, which any workflow could schedule under that name, is left out."""
    from temporalio.api.history.v1 import HistoryEvent

    from forklab.activities.runfork.history_events import RunInputs, parse_events
    from forklab.contracts.runfork import RECORD_DRIFT
    from forklab.experiments.runfork.approximations import DriftRecord

    record = DriftRecord(
        step=1, activity_type="reserve", parent_input_sha256="a" * 64, fork_input_sha256="b" * 64
    )
    events = []
    for i, (name, data) in enumerate(
        [
            ("reserve", b'"pay-42-order"'),
            ("reserve", b'"other"'),
            (RECORD_DRIFT, record.model_dump_json().encode()),
            (RECORD_DRIFT, b'{"step": "one"}'),
        ],
        start=1,
    ):
        ev = HistoryEvent(event_id=i)
        attrs = ev.activity_task_scheduled_event_attributes
        attrs.activity_type.name = name
        attrs.input.payloads.append(Payload(metadata={"encoding": ENC}, data=data))
        events.append(ev)
    for i, scheduled in enumerate((1, 2), start=5):
        ev = HistoryEvent(event_id=i)
        ev.activity_task_completed_event_attributes.scheduled_event_id = scheduled
        events.append(ev)
    inputs = RunInputs(look_for="pay-42")
    steps, _ = parse_events(events, 0, "run", inputs)  # type: ignore[arg-type]
    assert [s.index for s in steps] == [1, 2]
    assert inputs.holding_id == {1: [(ENC, b'"pay-42-order"')]}
    assert inputs.drift == [record]
