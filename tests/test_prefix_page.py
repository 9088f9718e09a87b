"""The prefix page `forklab fork` passes in a fork's start, without a server: passed only
where the fork's fetch would read the same page, and only when it fits a start."""

from __future__ import annotations

import base64

from temporalio.api.common.v1 import Payload

from forklab.activities.runfork.history_events import RunRecord
from forklab.activities.runfork.prefix_page import MAX_PASSED_BYTES, passed_page, prefix_page
from forklab.contracts.runfork import FetchPrefixInput, PrefixPage
from forklab.experiments.runfork.steps import Step, StepStatus


def _run(results: int, size: int = 10, closed: bool = True) -> RunRecord:
    payload = Payload(metadata={"encoding": b"json/plain"}, data=b"1" * size)
    b64 = base64.b64encode(payload.SerializeToString()).decode()
    steps = [
        Step(
            index=i,
            activity_type="tick",
            input_sha256="a" * 64,
            status=StepStatus.completed,
            run_id="run-1",
            result_b64=b64,
        )
        for i in range(1, results + 1)
    ]
    return RunRecord(
        workflow_id="parent",
        run_id="run-1",
        workflow_type="Chain",
        task_queue="q",
        input=[],
        base_step=0,
        steps=steps,
        others=[],
        marker=None,
        receipt=None,
        previous_run_id=None,
        closed=closed,
        seed=7,
    )


_FIRST = FetchPrefixInput(workflow_id="parent", run_id="run-1", from_step=1, upto_step=4)


def test_a_closed_run_passes_the_page_its_fetch_would_serve() -> None:
    rec = _run(6)
    passed = passed_page(rec, _FIRST)
    assert passed is not None
    page = PrefixPage.model_validate_json(passed)
    assert page == prefix_page(rec, _FIRST)
    assert [s.index for s in page.steps] == [1, 2, 3, 4]
    assert [s.index for s in page.recorded_after] == [5, 6] and page.seed == 7


def test_the_fetch_reads_where_the_page_may_differ_or_not_fit() -> None:
    """A running parent (its history may grow before the fork reads it), another run (the
    fork starts from the next run's input), a later page, a prefix needing more than one
    page or more than the limit: nothing is passed, the worker reads."""
    assert passed_page(_run(6, closed=False), _FIRST) is None
    assert passed_page(_run(6), _FIRST.model_copy(update={"run_id": "run-2"})) is None
    assert passed_page(_run(6), _FIRST.model_copy(update={"from_step": 2})) is None
    assert passed_page(_run(6, size=600), _FIRST.model_copy(update={"max_bytes": 2000})) is None
    big = _run(4, size=MAX_PASSED_BYTES // 3)
    assert prefix_page(big, _FIRST.model_copy(update={"max_bytes": 10**8})).next_step is None
    assert passed_page(big, _FIRST.model_copy(update={"max_bytes": 10**8})) is None
