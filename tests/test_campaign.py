"""The campaign benchmark, small: two ``forklab worker`` processes on one task queue run a
retry-cascade whose workflow continues as new mid-run; its outcomes equal the twin's."""

from __future__ import annotations

from pathlib import Path

from bench.campaign import HISTORY_GOAL, campaign_spec, report, run_campaign
from forklab.activities.experiment.progress import read_progress
from forklab.activities.stores.artifacts import LocalArtifactStore
from forklab.workflows.experiment.messages import Stage

ROOT = Path(__file__).resolve().parent.parent


async def test_a_small_campaign_on_two_workers_equals_the_twin(tmp_path: Path) -> None:
    spec = campaign_spec(
        ROOT / "forklab" / "workloads" / "retry-cascade.yaml", episodes=200, sandboxes=2
    )
    # low enough that the chain continues as new several times once the worlds run,
    # whatever the machine's pace (at 150 a loaded machine made one carry, mid-prefixes)
    limit = 100
    c = await run_campaign(
        spec, tmp_path, workers=2, batch_episodes=25, rehearsal_episodes=20, history_events=limit
    )
    (r,) = c.rounds
    d = r.durable
    assert d.result.analysis is not None, d.result.error
    assert r.same_digest and c.same_digest, (d.result.analysis.outcomes_digest, r.twin.digest)
    # ... each chunk's eight worlds in one sandbox (eight chunks fill the two slots)
    digest = next(run.progress_digest for run in d.runs if run.progress_digest)
    store = LocalArtifactStore(tmp_path / "shared" / "artifacts")
    progress = read_progress(store, digest)
    assert len(progress.prefixes) == 8 and len(progress.batches) == 8 * 8
    boxes = {(b.chunk.index, b.sandbox_id) for b in progress.batches}
    assert len(boxes) == 8 and len({box for _, box in boxes}) == 8
    cleanup = d.result.cleanup
    assert cleanup is not None and cleanup.left == 0 and d.store_kept_bytes > 0
    assert len(d.runs) == d.result.runs > 1
    assert c.largest_run_events == d.largest_run_events < limit < HISTORY_GOAL
    assert Stage.running_worlds.value in {run.carry_stage for run in d.runs}
    carries = [run.carry_bytes for run in d.runs[1:]]
    # the same size whatever the progress: digits move, and a world's pace appears once
    # its first batch completed (a few bytes a world), nothing grows with the chunks done
    assert max(carries) - min(carries) < 64 * len(spec.worlds), carries
    # every world-run was done once, by one of the two worker processes
    pids = {w.proc.pid for w in c.workers}
    done = {pid for run in d.runs for pid in run.world_runs}
    assert done <= pids
    assert sum(d.world_runs(w) for w in c.workers) == 200 * 8
    assert all(w.peak_rss_kib > 0 for w in c.workers)
    assert any("durable/twin" in line for line in report(c))
    # the clock starts on a standing fleet; the planning is broken down
    assert c.fleet_seconds > 0 and 0 < d.start_cli_seconds < d.planning_seconds
    assert any(line.startswith("planning until approval: forklab start") for line in report(c))


async def test_rounds_alternate_their_sides_on_one_fleet(tmp_path: Path) -> None:
    """Two rounds on one standing fleet: the twin first, then the durable run first; each
    round's experiment is a workflow of its own, and the ratio over the rounds is the
    sum of the durable seconds over the sum of the twin seconds."""
    spec = campaign_spec(
        ROOT / "forklab" / "workloads" / "retry-cascade.yaml", episodes=40, sandboxes=2
    )
    c = await run_campaign(
        spec, tmp_path, workers=2, batch_episodes=20, rehearsal_episodes=10, rounds=2
    )
    first, second = c.rounds
    assert (first.durable_first, second.durable_first) == (False, True)
    assert first.durable.spec.id != second.durable.spec.id
    assert c.same_digest and first.twin.digest == second.twin.digest
    twins = first.twin.finished.seconds + second.twin.finished.seconds
    assert c.ratio == (first.durable.seconds + second.durable.seconds) / twins
    lines = report(c)
    assert any(line.startswith("round 2 (durable, then twin)") for line in lines), lines
    for r in c.rounds:  # each round's line says where its durable clock went
        assert r.durable.worlds_seconds > 0
        stages = f"world groups {r.durable.worlds_seconds:.1f} s"
        assert any(ln.startswith(f"round {r.index + 1} ") and stages in ln for ln in lines)
    assert any(line.startswith("durable/twin over 2 rounds") for line in lines), lines
