"""The budget is a hard bound: refused before approval when it cannot fit, never overspent."""

from __future__ import annotations

from orchestration_lab import SANDBOX_ACTIVITIES, Lab, make_spec

from forklab.workflows.experiment.messages import Stage, Status


async def test_infeasible_budget_is_refused_before_approval(lab: Lab) -> None:
    spec = make_spec(budget={"max_world_seconds": 1, "max_concurrent_sandboxes": 2})
    handle, _ = await lab.start(spec)
    result = await handle.result()
    assert result.status is Status.refused
    assert result.error is not None and "budget.max_world_seconds is 1" in result.error
    assert result.approval.attempts == []
    assert not SANDBOX_ACTIVITIES & set(await lab.activity_types(handle))
    assert lab.sandbox_folders() == []


async def test_too_many_concurrent_sandboxes_are_refused(lab: Lab) -> None:
    spec = make_spec(budget={"max_world_seconds": 300, "max_concurrent_sandboxes": 99})
    handle, _ = await lab.start(spec)
    view = await lab.wait_for(handle, Stage.done)
    assert view.status is Status.refused
    assert view.error is not None and "max_concurrent_sandboxes is 99" in view.error


async def test_tight_budget_skips_work_instead_of_overspending(lab: Lab) -> None:
    # Sandboxes run 8x slower than the rehearsal: after the first chunk's group (both
    # worlds, one sandbox) the revised estimate for the second (6 x the ~4.8 s the first
    # ran) cannot fit in what is left, so it is skipped, not started. The budget leaves
    # room for a rehearsal up to 3x slower than its sleeps (a loaded machine) to pass the
    # capacity check (6 x 0.03 s x 40 world-episodes = 7.2 s at nominal speed).
    spec = make_spec(
        episodes=20,
        params={"twin_sleep": 0.03, "sandbox_sleep": 0.24},
        worlds=[
            {"name": "baseline", "role": "baseline"},
            {"name": "boost", "role": "treatment", "intervention": {"name": "boost"}},
        ],
        budget={"max_world_seconds": 24.0, "max_concurrent_sandboxes": 1, "safety_factor": 6},
    )
    handle, key = await lab.start(spec, batch_episodes=10)
    view = await lab.approve(handle, key)
    assert view.plan is not None and view.plan.capacity.ok, view.plan
    result = await handle.result()
    assert result.status is Status.completed, result.error
    budget = result.budget
    assert budget.spent_world_seconds <= spec.budget.max_world_seconds
    assert budget.skipped_batches == 2 and budget.reserved_world_seconds == 0
    assert [line.split(": budget: needs up to")[0] for line in result.skipped] == [
        "baseline episodes 10..19",
        "boost episodes 10..19",
    ]
    worlds = {w.name: w for w in result.worlds}
    assert all(w.status == "skipped" for w in worlds.values())
    assert all("1 of 2 batches skipped (budget" in (w.error or "") for w in worlds.values())
    assert result.analysis is not None and not result.analysis.valid
    assert lab.sandboxes(spec.id) == []
