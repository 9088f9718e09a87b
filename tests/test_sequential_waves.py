"""A sequential design's waves on the durable path, without a server: chunks that never
straddle a wave's end, the run state's units per wave, what a look stops and leaves
unspent, and an analysis that accepts exactly the worlds the design stopped."""

from __future__ import annotations

from typing import Any

import pytest
from orchestration_lab import make_spec

from forklab.activities.experiment.planning import episode_chunks
from forklab.activities.experiment.twin import run_twin, twin_held_out
from forklab.contracts.experiment import (
    BatchOutcome,
    BatchStatus,
    CapacityVerdict,
    LookResult,
    PlanSnapshot,
    Rehearsal,
    WorldLook,
)
from forklab.experiments.experiment.analysis.build import build_report
from forklab.experiments.experiment.evidence_scores import world_scores
from forklab.experiments.experiment.outcomes import ExperimentOutcomes, WorldOutcomes, from_batch
from forklab.experiments.experiment.results import WorldStatus
from forklab.experiments.experiment.spec import ExperimentSpec
from forklab.experiments.experiment.waves import (
    Decision,
    chunk_count,
    chunk_span,
    chunk_spans,
    wave_chunks,
    wave_ends,
)
from forklab.workflows.experiment.approval_gate import ApprovalGate
from forklab.workflows.experiment.budget_ledger import BudgetLedger
from forklab.workflows.experiment.messages import BudgetUse, Plan
from forklab.workflows.experiment.run_state import RunState


@pytest.mark.parametrize("episodes", [1, 7, 60, 100, 241])
@pytest.mark.parametrize("looks", [2, 3, 8])
@pytest.mark.parametrize("batch", [1, 15, 1000])
def test_chunks_cover_every_episode_and_never_straddle_a_wave(
    episodes: int, looks: int, batch: int
) -> None:
    if looks > episodes:
        return
    ends = wave_ends(episodes, looks)
    assert ends[-1] == episodes and ends == sorted(set(ends))
    spans = chunk_spans(episodes, batch, ends)
    assert [a for a, _ in spans] == [0, *(b for _, b in spans[:-1])]  # contiguous
    assert spans[-1][1] == episodes and all(0 < b - a <= batch for a, b in spans)
    assert not any(a < end < b for a, b in spans for end in ends)
    assert chunk_count(episodes, batch, ends) == len(spans)
    assert [chunk_span(episodes, batch, ends, i) for i in range(len(spans))] == spans
    # each wave's chunks end at its end
    for k, end in enumerate(ends):
        first, stop = wave_chunks(episodes, batch, ends, k)
        assert spans[stop - 1][1] == end and spans[first][0] == (ends[k - 1] if k else 0)
    with pytest.raises(IndexError):
        chunk_span(episodes, batch, ends, len(spans))


def test_without_waves_the_chunks_are_the_fixed_designs() -> None:
    spans = chunk_spans(2500, 1000, [])
    assert spans == [(0, 1000), (1000, 2000), (2000, 2500)]
    verdict = CapacityVerdict.model_validate(
        {"ok": True, "reason": "", "estimated_world_seconds": 1, "episodes": 2500}
        | {"batch_episodes": 1000, "batches": 9}
    )  # a verdict recorded before waves existed reads as it did
    assert verdict.wave_ends == [] and verdict.prefix_chunks == 3
    assert [(c.first, c.stop) for c in verdict.chunks()] == spans


def sequential_spec(**fields: Any) -> ExperimentSpec:
    worlds = [
        {"name": "baseline", "role": "baseline"},
        {"name": "boost", "role": "treatment", "intervention": {"name": "boost"}},
        {"name": "inert", "role": "treatment", "intervention": {"name": "noop"}},
        {"name": "placebo", "role": "placebo", "intervention": {"name": "noop"}},
        {"name": "drag", "role": "positive_control", "intervention": {"name": "drag"}},
    ]
    return make_spec(
        episodes=240,
        worlds=worlds,
        hypothesis={
            "text": "boost wins, inert does nothing, drag loses",
            "expected": {"boost": "decrease", "inert": "decrease", "drag": "increase"},
        },
        analysis={"sequential": {"looks": 4}},
        **fields,
    )


def state(spec: ExperimentSpec, batch: int = 30) -> RunState:
    chunks = episode_chunks(spec, batch)
    ends = wave_ends(spec.episodes, 4)
    plan = Plan(
        rehearsal=Rehearsal(
            code_digest="c" * 64,
            episodes=spec.episodes,
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
            episodes=spec.episodes,
            batch_episodes=batch,
            batches=len(chunks) * len(spec.worlds),
            wave_ends=ends,
        ),
    )
    return RunState(
        spec=spec,
        gate=ApprovalGate.opening(
            workflow_id="forklab-toy", run_id="run-1", public_key="", key_location="", nonce="n"
        ),
        ledger=BudgetLedger(
            BudgetUse(max_world_seconds=100.0, max_concurrent_sandboxes=2), safety_factor=3.0
        ),
        origin_run_id="run-1",
        plan=plan,
    )


def look(number: int, **decisions: Decision) -> LookResult:
    return LookResult(
        look=number,
        worlds=[
            WorldLook(
                world=w,
                look=number,
                episodes=60 * number,
                rescue=0,
                harm=0,
                statistic=0.0,
                boundary=2.0,
                decision=d,
            )
            for w, d in decisions.items()
        ],
    )


def test_units_follow_the_waves_and_a_stopped_world_starts_no_more_work() -> None:
    s = state(sequential_spec())
    assert [u.chunk.index for u in s.prefix_units(1)] == [2, 3]
    assert [(u.chunk.first, len(u.worlds)) for u in s.world_units(0)] == [(0, 5), (30, 5)]
    for chunk in range(2):
        for w in s.spec.worlds:
            c = s.plan.capacity.chunk(chunk)  # type: ignore[union-attr]
            done = BatchStatus.completed
            s.record_batch(BatchOutcome(world=w.name, chunk=c, status=done, seconds=1.5))
    assert s.world_units(0) is not None and list(s.world_units(0)) == []
    go = Decision.continue_
    s.record_look(look(1, boost=Decision.efficacy, inert=go, placebo=go, drag=Decision.efficacy))
    assert [u.worlds for u in s.world_units(1)] == [("baseline", "inert", "placebo")] * 2
    # boost and drag leave 180 episodes each, priced at their own pace (1.5 s for 30)
    assert s.ledger.use.unspent_world_episodes == 360
    assert s.ledger.use.unspent_world_seconds == pytest.approx(360 * 0.05)
    assert s.tally.design_stop("boost") is not None and s.tally.design_stop("inert") is None
    s.record_look(look(2, inert=Decision.futility, placebo=Decision.check_decided))
    # no world but the baseline runs: it stops too, and no wave is left to run
    assert s.live_worlds() == [] and list(s.world_units(2)) == []
    assert s.ledger.use.unspent_world_episodes == 360 + 3 * 120


def test_without_the_baseline_no_world_runs_on() -> None:
    s = state(sequential_spec())
    c = s.plan.capacity.chunk(0)  # type: ignore[union-attr]
    s.record_batch(BatchOutcome(world="baseline", chunk=c, status=BatchStatus.failed, error="x"))
    assert s.live_worlds() == [] and list(s.world_units(1)) == []


def cut(out: ExperimentOutcomes, lengths: dict[str, int]) -> ExperimentOutcomes:
    """``out`` as the durable path stores a run whose worlds stopped at ``lengths``."""

    def short(w: WorldOutcomes) -> WorldOutcomes:
        n = lengths.get(w.name)
        if n is None:
            return w
        return w.model_copy(
            update={
                "status": WorldStatus.stopped,
                "outcomes": w.outcomes[:n],
                "intervened": w.intervened[:n],
                "shocks": w.shocks[:n],
                "inherited": w.inherited[:n],
            }
        )

    return out.model_copy(update={"worlds": [short(w) for w in out.worlds]})


def report_of(spec: ExperimentSpec, out: ExperimentOutcomes) -> Any:
    return build_report(spec, out, "c" * 64, held_out=twin_held_out(processes=1))


def test_the_analysis_of_the_worlds_the_design_stopped_is_the_rehearsals() -> None:
    spec = sequential_spec()
    twin = run_twin(spec, processes=1)
    full = from_batch(twin.batch, "c" * 64, "s1", twin.seconds)
    rehearsed = report_of(spec, full)
    assert rehearsed.sequential is not None and rehearsed.valid
    stops = {p.world: p.episodes for p in rehearsed.sequential.worlds if p.unspent_episodes}
    assert stops == {"boost": 60, "inert": 120, "drag": 60}
    durable = report_of(spec, cut(full, stops))
    assert durable.valid
    assert durable.sequential is not None
    assert durable.sequential.worlds == rehearsed.sequential.worlds
    assert durable.verdicts == rehearsed.verdicts
    completion = next(c for c in durable.checks if c.name == "completion")
    assert completion.passed and "ran what its sequential design asked" in completion.reason
    # the fixed design's tests are not run on a sample the design chose
    assert {c.world for c in durable.comparisons} == {"placebo"}
    # the evidence log scores a control stopped once its check was decided as behaved
    own = {"completed": True, "workload_identity": True, "common_snapshot": True}
    assert world_scores(durable, "drag", own)["positive_control_direction"] == 1.0
    assert world_scores(durable, "placebo", own)["placebo_fidelity"] == 1.0


@pytest.mark.parametrize(
    ("lengths", "why"),
    [
        ({"boost": 120, "drag": 60, "inert": 120}, "boost (stopped; 120/60)"),  # ran past its stop
        ({"boost": 60, "drag": 60, "inert": 60}, "inert (stopped after 60 episodes, not by"),  # cut
        ({"boost": 60, "drag": 60, "inert": 120, "placebo": 180}, "placebo (stopped after 180"),
    ],
)
def test_a_world_cut_where_its_design_did_not_stop_it_makes_the_run_invalid(
    lengths: dict[str, int], why: str
) -> None:
    """Stored progress is not trusted to say where the design stopped a world: the
    analysis recomputes each stop from the outcomes and refuses any other cut."""
    spec = sequential_spec()
    twin = run_twin(spec, processes=1)
    report = report_of(spec, cut(from_batch(twin.batch, "c" * 64, "s1", twin.seconds), lengths))
    completion = next(c for c in report.checks if c.name == "completion")
    assert not completion.passed and why in completion.reason, completion.reason
    assert not report.valid and all(v.verdict.value == "invalid" for v in report.verdicts)
