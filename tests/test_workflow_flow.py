"""The durable path end to end: start → approve → worlds in sandboxes → report."""

from __future__ import annotations

import asyncio
import json
from html import escape
from pathlib import Path

from helpers import forklab_in_process as forklab
from orchestration_lab import Lab, cli_env

from forklab.activities.experiment.planning import plan_fingerprint
from forklab.cli.experiment.rehearsal import rehearse
from forklab.cli.experiment.specfile import load_spec
from forklab.workflows.experiment.messages import Stage, Status
from forklab.workflows.experiment.search_attributes import EXPERIMENT, STAGE
from tests.helpers import assert_self_contained

ROOT = Path(__file__).resolve().parent.parent


async def test_full_flow_matches_the_local_twin(lab: Lab, tmp_path: Path) -> None:
    spec = load_spec(str(ROOT / "forklab" / "workloads" / "recovery-counter.yaml"))
    spec = spec.model_copy(update={"id": "flow-recovery", "episodes": 60})
    handle, key = await lab.start(spec, batch_episodes=25, rehearsal_episodes=20)
    view = await lab.wait_for(handle, Stage.awaiting_approval)
    assert view.plan is not None and view.plan.capacity.ok
    assert lab.sandbox_folders() == []  # no sandbox before approval
    # the rehearsal ran every prefix for good, and the plan an approval signs names them
    handed = view.plan.rehearsal.prefixes
    assert handed is not None and (handed.chunks, handed.batch_episodes) == (3, 25)
    snap = view.plan.snapshot
    bound = plan_fingerprint(spec, snap.code_digest, snap.snapshot_id, handed.index)
    assert view.plan.fingerprint == bound
    assert bound != plan_fingerprint(spec, snap.code_digest, snap.snapshot_id)
    await lab.approve(handle, key, approver="alice")
    result = await handle.result()

    assert result.status is Status.completed, result.error
    twin = rehearse(spec)
    assert result.analysis is not None
    assert result.analysis.outcomes_digest == twin.outcomes_digest
    report = lab.store.get_json(result.analysis.report_digest)
    assert report["outcomes_digest"] == twin.outcomes_digest
    assert report["comparisons"] == json.loads(twin.model_dump_json())["comparisons"]
    # the guard's held-out check ran two worlds in a box; the guarded one is derived
    assert report["guard"] == json.loads(twin.model_dump_json())["guard"]
    markdown = lab.store.get_bytes(result.analysis.markdown_digest).decode()
    assert "recovery" in markdown and result.snapshot_id and result.snapshot_id in markdown
    # no model configured: the report shows the deterministic readout and says so
    assert result.analysis.readout == "deterministic"
    assert "## Readout" in markdown and "Deterministic readout: no model is configured" in markdown
    # every world from one snapshot, every batch once, nothing left behind
    assert result.cleanup is not None and result.cleanup.left == 0
    assert lab.sandboxes(spec.id) == [] and lab.sandbox_folders() == []
    assert result.budget.spent_world_seconds <= spec.budget.max_world_seconds
    assert result.budget.peak_concurrent_sandboxes <= spec.budget.max_concurrent_sandboxes
    assert result.approval.decided_by == "alice"
    assert "network isolation" in markdown and result.network_isolation in markdown
    # `forklab report` writes the stored renderings; the HTML carries the same provenance
    out = tmp_path / "report"
    shown = await asyncio.to_thread(
        forklab, cli_env(lab.settings), "report", spec.id, "--out", str(out)
    )
    assert shown.returncode == 0, shown.stderr
    # the Markdown alone on stdout (`report X > r.md`), the line about the files on stderr
    assert shown.stdout == (markdown if markdown.endswith("\n") else markdown + "\n")
    assert shown.stderr == f"wrote report.md, report.json and report.html to {out}\n"
    assert sorted(p.name for p in out.iterdir()) == ["report.html", "report.json", "report.md"]
    assert (out / "report.md").read_text() == markdown
    assert json.loads((out / "report.json").read_text()) == report
    html = (out / "report.html").read_text()
    assert_self_contained(html)
    # failure rates, rescues vs harms, a slice chart for each of the three comparisons
    assert html.count("<svg") == 2 + 3 and '<h2 id="provenance">Provenance</h2>' in html
    # the readout right under the verdicts, the provenance folded at the end
    assert (
        html.index("Verdicts</h2>")
        < html.index('<section id="readout">')
        < html.index("Failure rate per world")
    )
    assert html.index("<details>") > html.index("Power (")
    assert (
        f'<code class="hash" title="{result.plan_fingerprint}">{result.plan_fingerprint}</code>'
        in html
        and escape(result.network_isolation) in html
    )
    # what the Web UI shows: search attributes and a summary on every sandbox activity
    desc = await handle.describe()
    assert desc.typed_search_attributes.get(EXPERIMENT) == spec.id
    assert desc.typed_search_attributes.get(STAGE) == "done"
    history = await handle.fetch_history()
    summaries = [
        json.loads(e.user_metadata.summary.data)
        for e in history.events
        if e.HasField("activity_task_scheduled_event_attributes")
        and e.activity_task_scheduled_event_attributes.activity_type.name == "run_world_group"
    ]
    # three chunks fill the spec's two slots: each chunk's worlds share one sandbox
    names = ", ".join(w.name for w in spec.worlds)
    assert sorted(summaries) == sorted(
        f"{names} · episodes {first}..{min(first + 25, 60) - 1} · attempt 1"
        for first in (0, 25, 50)
    )
    kinds = [
        e.activity_task_scheduled_event_attributes.activity_type.name
        for e in history.events
        if e.HasField("activity_task_scheduled_event_attributes")
    ]
    assert "run_prefixes" not in kinds and kinds.count("rehearsed_prefix") == 3
    assert f"index `{handed.index}` is part of the plan fingerprint" in markdown
    # the ledger: one root row and one row per world
    root = lab.ledger.experiment(spec.id)
    assert root is not None and root.status == "completed"
    assert root.plan_fingerprint == result.plan_fingerprint
    assert root.report_digest == result.analysis.report_digest
    worlds = lab.ledger.worlds(spec.id)
    assert sorted(w.world for w in worlds) == sorted(w.name for w in spec.worlds)
    assert all(w.episodes == 60 and w.snapshot_id == result.snapshot_id for w in worlds)
