"""What a parsed closed run keeps in memory, and the cache of them (``ClosedRuns``): a
cached run must not hold the history it was parsed from, and the cache's bound counts
what a run keeps, its input included (docs/benchmarks/cohort-scale.md: a worker forking
a cohort keeps one parsed run per parent run)."""

from __future__ import annotations

from temporalio.api.common.v1 import Payload
from temporalio.api.enums.v1 import EventType
from temporalio.api.history.v1 import HistoryEvent
from temporalio.client import WorkflowHistory

from forklab.activities.runfork.history_events import ClosedRuns, kept_bytes, parse_run


def _history(workflow_id: str, task: bytes, result: bytes) -> WorkflowHistory:
    """A closed run: started with ``task``, one activity returning ``result``, completed."""
    started = HistoryEvent(event_id=1, event_type=EventType.EVENT_TYPE_WORKFLOW_EXECUTION_STARTED)
    attrs = started.workflow_execution_started_event_attributes
    attrs.workflow_type.name = "Agent"
    attrs.task_queue.name = "agents"
    attrs.input.payloads.append(Payload(metadata={"encoding": b"json/plain"}, data=task))
    scheduled = HistoryEvent(event_id=2, event_type=EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED)
    scheduled.activity_task_scheduled_event_attributes.activity_type.name = "answer"
    completed = HistoryEvent(event_id=3, event_type=EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED)
    done = completed.activity_task_completed_event_attributes
    done.scheduled_event_id = 2
    done.result.payloads.append(Payload(metadata={"encoding": b"json/plain"}, data=result))
    closed = HistoryEvent(event_id=4, event_type=EventType.EVENT_TYPE_WORKFLOW_EXECUTION_COMPLETED)
    return WorkflowHistory(workflow_id, [started, scheduled, completed, closed])


def test_a_parsed_run_keeps_nothing_of_its_history() -> None:
    """The run's input is a copy: protobuf keeps a parsed history whole while any payload
    read out of it is referenced, so a record holding one would weigh its whole history
    (every activity's input and result) in the cache, not what the cache counts."""
    history = _history("run-1", b'"task-1"', b'"yes"')
    rec = parse_run("run-1", history, 0, "r1")
    assert rec.closed and [s.activity_type for s in rec.steps] == ["answer"]
    started = history.events[0].workflow_execution_started_event_attributes
    started.input.payloads[0].data = b'"changed in the history"'
    assert [p.data for p in rec.input] == [b'"task-1"']


def test_the_cache_bound_counts_each_runs_input() -> None:
    """A run whose input is large (an agent handed a long document) counts it: past the
    bound, the least recently used run is dropped, however few steps the runs have."""
    big = b'"' + b"x" * 100_000 + b'"'
    runs = [
        parse_run(f"run-{i}", _history(f"run-{i}", big, b'"yes"'), 0, f"r{i}") for i in range(5)
    ]
    assert all(kept_bytes(r) > 100_000 for r in runs)
    cache = ClosedRuns(max_bytes=250_000)
    for r in runs:
        cache.put(r, 0)
    kept = [r for r in runs if cache.get(r.workflow_id, r.run_id, 0) is not None]
    assert [r.workflow_id for r in kept] == ["run-3", "run-4"]


def test_the_cache_stays_under_its_bound_after_many_runs() -> None:
    """Thousands of distinct closed runs put one after another (a cohort's parent runs):
    what the cache counts never passes its bound, and it keeps the latest ones."""
    cache = ClosedRuns(max_bytes=200_000)
    for i in range(2_000):
        cache.put(parse_run(f"run-{i}", _history(f"run-{i}", b'"task"', b'"yes"'), 0, f"r{i}"), 0)
        assert cache._bytes <= cache.max_bytes
    assert cache.get("run-1999", "r1999", 0) is not None
    assert cache.get("run-0", "r0", 0) is None
