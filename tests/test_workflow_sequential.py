"""A sequential design the durable path does not run is refused before approval."""

from __future__ import annotations

from orchestration_lab import SANDBOX_ACTIVITIES, Lab, make_spec

from forklab.workflows.experiment.messages import Status


async def test_a_sequential_design_is_refused_before_approval_and_nothing_runs(
    lab: Lab,
) -> None:
    spec = make_spec(analysis={"sequential": {"looks": 4}})
    handle, _ = await lab.start(spec)
    result = await handle.result()
    assert result.status is Status.refused
    assert result.error is not None
    assert "analysis.sequential: the durable path does not run episodes in waves" in result.error
    assert result.approval.attempts == []
    assert not SANDBOX_ACTIVITIES & set(await lab.activity_types(handle))
    assert lab.sandbox_folders() == []
