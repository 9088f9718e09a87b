"""The run's state and views without a server: units, skips, progress, status and result."""

from __future__ import annotations

import pytest
from orchestration_lab import make_spec

from activities.budget import START_ALLOWANCE
from activities.models import (
    BatchOutcome,
    BatchStatus,
    CapacityVerdict,
    EpisodeChunk,
    PlanSnapshot,
    PrefixResult,
    Rehearsal,
)
from workflows import views
from workflows.approval_gate import ApprovalGate
from workflows.budget_ledger import BudgetLedger
from workflows.messages import BudgetUse, Plan, Stage, Status
from workflows.run_state import RunState, Unit


def state(episodes: int = 24, chunk: int = 12) -> RunState:
    spec = make_spec(episodes=episodes)
    chunks = [
        EpisodeChunk(index=i, first=f, stop=min(f + chunk, episodes))
        for i, f in enumerate(range(0, episodes, chunk))
    ]
    plan = Plan(
        rehearsal=Rehearsal(
            code_digest="c" * 64,
            episodes=episodes,
            prefix_seconds_per_episode=0.01,
            world_seconds_per_episode={w.name: 0.02 for w in spec.worlds},
            worlds=[],
        ),
        snapshot=PlanSnapshot(
            snapshot_id="s1", backend="local", code_digest="c" * 64, files=3, fingerprint="f" * 64
        ),
        capacity=CapacityVerdict(
            ok=True,
            reason="fits",
            estimated_world_seconds=10.0,
            chunks=chunks,
            batches=len(chunks) * len(spec.worlds),
        ),
    )
    use = BudgetUse(max_world_seconds=100.0, max_concurrent_sandboxes=2)
    return RunState(
        spec=spec,
        gate=ApprovalGate.opening(
            workflow_id="forklab-toy", run_id="run-1", public_key="", key_location="", nonce="n"
        ),
        ledger=BudgetLedger(use, safety_factor=3.0),
        origin_run_id="run-1",
        plan=plan,
    )


def prefix(chunk: EpisodeChunk, isolated: bool = True) -> PrefixResult:
    note = None if isolated else "unshare is not allowed here"
    return PrefixResult(
        chunk=chunk, checkpoints_digest="d", seconds=0.5, network_isolated=isolated, note=note
    )


def test_units_are_chunk_major_and_skip_what_is_done() -> None:
    s = state()
    assert [u.key for u in s.prefix_units()] == ["prefix#0", "prefix#1"]
    s.record_prefix(prefix(s.chunks()[0]))
    assert [u.key for u in s.prefix_units()] == ["prefix#1"]
    assert [u.key for u in s.world_units()][:3] == ["baseline#0", "boost#0", "placebo#0"]
    assert s.need(Unit(s.chunks()[0])) == s.ledger.need("prefix", 0.01, 12)


def test_a_world_batch_is_blocked_once_its_world_or_prefix_is_lost() -> None:
    s = state()
    first, second = s.chunks()
    assert s.blocked(Unit(first, "boost")) == "its episodes' prefixes did not run"
    s.record_prefix(prefix(first))
    s.record_prefix(prefix(second))
    assert s.blocked(Unit(first, "boost")) is None
    s.record_batch(BatchOutcome(world="boost", chunk=first, status=BatchStatus.failed, error="x"))
    assert s.blocked(Unit(second, "boost")) == "the world is already failed"
    assert s.blocked(Unit(second, "placebo")) is None


def test_a_skipped_prefix_skips_every_world_of_its_chunk() -> None:
    s = state()
    s.skip(Unit(s.chunks()[1]), "budget: needs up to 9.0 world-seconds, 1.0 left")
    assert s.ledger.use.skipped_batches == 3
    result = views.result(s, None)
    assert result.skipped == [
        f"{w} episodes 12..23: budget: needs up to 9.0 world-seconds, 1.0 left"
        for w in ("baseline", "boost", "placebo")
    ]
    assert views.progress(s).batches_skipped == 3


def test_status_details_and_result_show_the_same_state() -> None:
    s = state()
    s.stage, s.message = Stage.running_worlds, "running world batches"
    first, second = s.chunks()
    s.record_prefix(prefix(first))
    s.record_prefix(prefix(second, isolated=False))
    s.ledger.reserve("boost#0", 5.0)
    view = views.status_view(s)
    assert view.status is Status.running and view.progress.running == 1
    assert view.progress.prefixes_done == 2 and view.budget.reserved_world_seconds == 5.0
    text = views.details(s)
    assert f"**{s.spec.id}** · stage **running_worlds** · running world batches" in text
    assert "- budget: 0.0 of 100 world-seconds spent, 5.0 reserved" in text
    assert f"- plan fingerprint: `{'f' * 64}`" in text
    assert views.isolation(s) == "1 of 2 sandboxes fell back: unshare is not allowed here"
    s.ledger.settle("boost#0", 2.0)
    result = views.result(s, None)
    assert result.budget.spent_world_seconds == 2.0 and result.plan_fingerprint == "f" * 64
    assert views.infra(s).world_seconds_spent == 2.0
    assert views.provenance(s)["approval"] == "pending"


def test_a_world_whose_rehearsal_caught_a_stall_is_priced_by_paces_seen() -> None:
    """Under load, a run had its baseline world skipped as over budget: rehearsed rates
    are microseconds per episode, baseline's sample caught a 50 ms stall, and the slowdown
    of another world's sandbox (~10,000x its rate) was multiplied by baseline's rate."""
    s = state(episodes=24, chunk=6)
    assert s.plan is not None
    rates = {"baseline": 0.0125, "boost": 1.2e-5, "placebo": 1.2e-5}  # baseline: a stall
    s.plan.rehearsal.world_seconds_per_episode = rates
    s.ledger.use.max_world_seconds = 300.0
    first, second = s.chunks()[:2]
    planned = s.need(Unit(first, "baseline"))  # nothing seen yet: as rehearsed
    assert planned == pytest.approx(3.0 * 0.0125 * 6 + START_ALLOWANCE)

    def done(world: str, chunk: EpisodeChunk, seconds: float) -> BatchOutcome:
        return BatchOutcome(world=world, chunk=chunk, status=BatchStatus.completed, seconds=seconds)

    s.record_batch(done("boost", first, 0.7))
    # a world not seen yet: at least the slowest pace any world's batch ran at (0.7 s / 6)
    assert s.need(Unit(first, "placebo")) == pytest.approx(3.0 * 0.7)
    assert s.need(Unit(second, "baseline")) == pytest.approx(planned)  # was 2187 (> 300)
    s.record_batch(done("baseline", first, 9.0))  # its own sandbox: 9 s
    assert s.need(Unit(second, "baseline")) == pytest.approx(3.0 * 9.0)
    assert s.need(Unit(second, "boost")) == pytest.approx(3.0 * 0.7)  # its own pace only
    s.record_batch(done("boost", second, 0.1))  # paces never shrink
    assert s.need(Unit(second, "boost")) == pytest.approx(3.0 * 0.7)
    chained = state(episodes=24, chunk=6)  # the next run of a chain: paces from progress
    assert chained.plan is not None
    chained.plan.rehearsal.world_seconds_per_episode = rates
    chained.restore(s.progress_record())
    assert chained.paces == s.paces == {"boost": pytest.approx(0.7 / 6), "baseline": 1.5}
