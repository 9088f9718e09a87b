"""The campaign benchmark, small: two ``forklab worker`` processes on one task queue run a
retry-cascade whose workflow continues as new mid-run; its outcomes equal the twin's."""

from __future__ import annotations

from pathlib import Path

from activities.artifacts import LocalArtifactStore
from activities.progress import read_progress
from bench.campaign import HISTORY_GOAL, campaign_spec, report, run_campaign
from workflows.messages import Stage

ROOT = Path(__file__).resolve().parent.parent


async def test_a_small_campaign_on_two_workers_equals_the_twin(tmp_path: Path) -> None:
    spec = campaign_spec(ROOT / "experiments" / "retry-cascade.yaml", episodes=200, sandboxes=2)
    limit = 150
    c = await run_campaign(
        spec, tmp_path, workers=2, batch_episodes=25, rehearsal_episodes=20, history_events=limit
    )
    assert c.result.analysis is not None, c.result.error
    assert c.same_digest, (c.result.analysis.outcomes_digest, c.twin_digest)
    # ... each chunk's eight worlds in one sandbox (eight chunks fill the two slots)
    digest = next(r.progress_digest for r in c.runs if r.progress_digest)
    store = LocalArtifactStore(tmp_path / "shared" / "artifacts")
    progress = read_progress(store, digest)
    assert len(progress.prefixes) == 8 and len(progress.batches) == 8 * 8
    boxes = {(b.chunk.index, b.sandbox_id) for b in progress.batches}
    assert len(boxes) == 8 and len({box for _, box in boxes}) == 8
    cleanup = c.result.cleanup
    assert cleanup is not None and cleanup.left == 0 and c.store_kept_bytes > 0
    assert len(c.runs) == c.result.runs > 1
    assert c.largest_run_events < limit < HISTORY_GOAL
    assert Stage.running_worlds.value in {r.carry_stage for r in c.runs}
    carries = [r.carry_bytes for r in c.runs[1:]]
    # the same size whatever the progress: digits move, and a world's pace appears once
    # its first batch completed (a few bytes a world), nothing grows with the chunks done
    assert max(carries) - min(carries) < 64 * len(spec.worlds), carries
    # every world-run was done once, by one of the two worker processes
    pids = {w.proc.pid for w in c.workers}
    done = {pid for r in c.runs for pid in r.world_runs}
    assert done <= pids
    assert sum(c.world_runs(w) for w in c.workers) == 200 * 8
    assert all(w.peak_rss_kib > 0 for w in c.workers)
    assert any("durable/twin" in line for line in report(c))
    # the clock starts on a standing fleet; the planning is broken down
    assert c.fleet_seconds > 0 and 0 < c.start_cli_seconds < c.planning_seconds
    assert any(line.startswith("planning until approval: forklab start") for line in report(c))
