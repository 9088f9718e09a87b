"""Waiting for a fork to close and reading it, in one stream: the fork's history read as
it grows (a long poll that ends at the close event) instead of waiting for its result,
then describing it and reading its history again, which costs an experiment two more
server round trips per fork than a bare fork's ``result()``.

A fork that continued as new is read whole once it has closed (``read_chain``), as is
a fork whose stream fails: the stream is a shortcut, never the only way.
"""

from __future__ import annotations

import contextlib
from typing import Any

from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowFailureError, WorkflowHandle, WorkflowHistory
from temporalio.service import RPCError

from forklab.activities.runfork.history_events import RunRecord, parse_run
from forklab.activities.runfork.history_reads import read_chain

#: A run's status by its close event, as ``read_chain`` spells it.
_STATUS = {
    EventType.EVENT_TYPE_WORKFLOW_EXECUTION_COMPLETED: "completed",
    EventType.EVENT_TYPE_WORKFLOW_EXECUTION_FAILED: "failed",
    EventType.EVENT_TYPE_WORKFLOW_EXECUTION_TIMED_OUT: "timed_out",
    EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CANCELED: "canceled",
    EventType.EVENT_TYPE_WORKFLOW_EXECUTION_TERMINATED: "terminated",
}


async def closed_chain(client: Client, handle: WorkflowHandle[Any, Any]) -> list[RunRecord]:
    """The fork's chain once it has closed (however it ended), oldest run first."""
    if client.data_converter.payload_codec is None:
        try:
            events = [e async for e in handle.fetch_history_events(wait_new_event=True)]
        except RPCError:
            events = []
        status = _STATUS.get(events[-1].event_type) if events else None
        started = events[0].workflow_execution_started_event_attributes if events else None
        if status is not None and started is not None and not started.continued_execution_run_id:
            run_id = started.first_execution_run_id
            history = WorkflowHistory(workflow_id=handle.id, events=events)
            record = parse_run(handle.id, history, 0, run_id)
            record.status = status
            return [record]
    with contextlib.suppress(WorkflowFailureError):
        await handle.result()
    return await read_chain(client, handle.id)
