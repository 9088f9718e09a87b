"""Faults: a world whose process crashes or writes garbage fails alone (the other worlds
of its sandbox complete); cancellation cleans up."""

from __future__ import annotations

import asyncio

import pytest
from orchestration_lab import Lab, make_spec
from temporalio.client import WorkflowFailureError

from forklab.workflows.experiment.messages import Stage, Status


async def test_crashing_and_garbage_worlds_fail_alone(lab: Lab) -> None:
    spec = make_spec(
        worlds=[
            {"name": "baseline", "role": "baseline"},
            {"name": "boost", "role": "treatment", "intervention": {"name": "boost"}},
            {"name": "crash", "role": "treatment", "intervention": {"name": "crash"}},
            {"name": "garbage", "role": "treatment", "intervention": {"name": "garbage"}},
        ],
    )
    handle, key = await lab.start(spec)
    await lab.approve(handle, key)
    result = await handle.result()
    assert result.status is Status.completed, result.error
    worlds = {w.name: w for w in result.worlds}
    assert worlds["baseline"].status == "completed" and worlds["baseline"].episodes == 24
    assert worlds["boost"].status == "completed" and worlds["boost"].episodes == 24
    # two chunks fill the two slots: the four worlds of a chunk share one sandbox, and
    # the two that failed took nothing from the two that completed
    assert worlds["crash"].status == "failed"
    assert "process exited with code 3 without a result" in (worlds["crash"].error or "")
    assert worlds["garbage"].status == "failed"  # it wrote its garbage where nobody reads it
    assert "exited with code 0 without a result" in (worlds["garbage"].error or "")
    # a failed world's later batch is skipped, unless its group started already (two
    # chunks, two slots: both groups start at once); no other world's is
    assert {s.split(" ")[0] for s in result.skipped} <= {"crash", "garbage"}
    assert result.cleanup is not None and result.cleanup.left == 0
    assert lab.sandboxes(spec.id) == [] and lab.sandbox_folders() == []
    assert result.analysis is not None and not result.analysis.valid
    rows = {w.world: w for w in lab.ledger.worlds(spec.id)}
    assert rows["crash"].status == "failed" and rows["crash"].error == worlds["crash"].error


async def test_cancellation_mid_run_cleans_up_every_sandbox(lab: Lab) -> None:
    spec = make_spec(params={"sandbox_sleep": 0.5})
    handle, key = await lab.start(spec)
    await lab.approve(handle, key)
    await lab.wait_until(
        handle, lambda v: v.stage is Stage.running_worlds and v.progress.running > 0
    )
    for _ in range(200):  # the batch's sandbox appears once its activity has started
        if lab.sandboxes(spec.id):
            break
        await asyncio.sleep(0.05)
    assert lab.sandboxes(spec.id), "a world batch should be running in a sandbox"
    await handle.cancel()
    with pytest.raises(WorkflowFailureError):
        await handle.result()
    view = await lab.status(handle)
    assert view.status is Status.cancelled and view.stage is Stage.done
    assert view.cleanup is not None and view.cleanup.left == 0
    assert lab.sandboxes(spec.id) == [] and lab.sandbox_folders() == []
    root = lab.ledger.experiment(spec.id)
    assert root is not None and root.status == "cancelled"
