"""Two runs of one spec id never touch each other's sandboxes (issue 7: the first run's
cleanup killed the second's live sandbox). Sandboxes carry ``forklab.run`` =
``<workflow id>/<first run id>``, and every cleanup acts on that label only."""

from __future__ import annotations

import asyncio
import contextlib

from orchestration_lab import Lab, make_spec, signed
from temporalio.client import WorkflowFailureError

from forklab.activities.experiment.approval_keys import new_private_key, public_key_hex
from forklab.workflows.experiment.messages import (
    ApprovalAttempt,
    ExperimentInput,
    ExperimentResult,
    Stage,
    Status,
)
from forklab.workflows.experiment.workflow import ExperimentWorkflow


async def test_cancelling_one_run_leaves_the_other_runs_sandboxes_alone(lab: Lab) -> None:
    spec = make_spec(params={"sandbox_sleep": 0.1}, episodes=24)
    handles = []
    for suffix in ("a", "b"):
        key = new_private_key()
        handle = await lab.client.start_workflow(
            ExperimentWorkflow.run,
            ExperimentInput(
                spec=spec,
                approver_public_key=public_key_hex(key),
                requested_by="tests",
                batch_episodes=6,
                rehearsal_episodes=4,
                workload_bundle=lab.ship(spec),
            ),
            id=f"forklab-{spec.id}-{suffix}",  # e.g. raw `temporal workflow start`
            task_queue=lab.settings.task_queue,
            result_type=ExperimentResult,
        )
        view = await lab.wait_for(handle, Stage.awaiting_approval)
        attempt = await handle.execute_update(
            "approve", args=[signed(view, key)], result_type=ApprovalAttempt
        )
        assert attempt.accepted
        handles.append(handle)
    first, second = handles
    # both runs have sandboxes at the same time, under one experiment label
    await lab.wait_until(second, lambda v: v.stage is Stage.running_worlds, timeout=120)
    await lab.wait_until(first, lambda v: v.stage is Stage.running_worlds, timeout=120)
    await second.cancel()
    with contextlib.suppress(WorkflowFailureError):
        await asyncio.wait_for(second.result(), timeout=120)
    cancelled = await lab.status(second)
    assert cancelled.status is Status.cancelled and cancelled.cleanup is not None
    result = await asyncio.wait_for(first.result(), timeout=240)
    assert result.status is Status.completed, result.error
    assert result.analysis is not None
    assert [(w.name, w.status, w.episodes) for w in result.analysis.worlds] == [
        (name, "completed", 24) for name in ("baseline", "boost", "placebo")
    ], [(w.name, w.error) for w in result.analysis.worlds]
    # the second run's cleanup killed none of the first run's batches
    assert lab.sandboxes(spec.id) == []
