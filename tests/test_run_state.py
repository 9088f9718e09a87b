"""The run's state and views without a server: units, skips, progress, status and result."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from orchestration_lab import make_spec

from forklab.activities.experiment.progress import prefix_refs, read_progress, save_progress
from forklab.activities.stores.artifacts import ArtifactError, LocalArtifactStore
from forklab.cli.experiment.experiment_commands import summary_line
from forklab.contracts.experiment import (
    AnalysisResult,
    BatchOutcome,
    BatchStatus,
    CapacityVerdict,
    CleanupResult,
    EpisodeChunk,
    PlanSnapshot,
    PrefixRefsInput,
    PrefixResult,
    Rehearsal,
)
from forklab.experiments.experiment.budget import START_ALLOWANCE
from forklab.workflows.experiment import views
from forklab.workflows.experiment.approval_gate import ApprovalGate
from forklab.workflows.experiment.budget_ledger import BudgetLedger
from forklab.workflows.experiment.messages import BudgetUse, Plan, Stage, Status
from forklab.workflows.experiment.run_state import RunState, Unit
from forklab.workflows.experiment.tally import ChunkSet, ProgressTally
from tests.helpers import ROOT


def state(episodes: int = 24, chunk: int = 12, workspace: bool = False) -> RunState:
    spec = make_spec(episodes=episodes)
    plan = Plan(
        rehearsal=Rehearsal(
            code_digest="c" * 64,
            episodes=episodes,
            prefix_seconds_per_episode=0.01,
            world_seconds_per_episode={w.name: 0.02 for w in spec.worlds},
            worlds=[],
            workspace=workspace,
        ),
        snapshot=PlanSnapshot(
            snapshot_id="s1", backend="local", code_digest="c" * 64, files=3, fingerprint="f" * 64
        ),
        capacity=CapacityVerdict(
            ok=True,
            reason="fits",
            estimated_world_seconds=10.0,
            episodes=episodes,
            batch_episodes=chunk,
            batches=-(-episodes // chunk) * len(spec.worlds),
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


def chunks(s: RunState) -> list[EpisodeChunk]:
    assert s.plan is not None
    return list(s.plan.capacity.chunks())


def prefix(chunk: EpisodeChunk, isolated: bool = True) -> PrefixResult:
    note = None if isolated else "unshare is not allowed here"
    return PrefixResult(
        chunk=chunk, checkpoints_digest="d", seconds=0.5, network_isolated=isolated, note=note
    )


def test_units_are_chunk_major_and_skip_what_is_done() -> None:
    s = state()
    assert [u.key for u in s.prefix_units()] == ["prefix#0", "prefix#1"]
    s.record_prefix(prefix(chunks(s)[0]))
    assert [u.key for u in s.prefix_units()] == ["prefix#1"]
    # two chunks fill the two slots: each chunk's worlds share one sandbox
    assert [u.key for u in s.world_units()] == [
        "baseline+boost+placebo#0",
        "baseline+boost+placebo#1",
    ]
    assert s.need(Unit(chunks(s)[0])) == s.ledger.need("prefix", 0.01, 12)
    group = Unit(chunks(s)[0], ("baseline", "boost", "placebo"))
    assert s.shares(group) == [s.ledger.paced_need(0.02, 12, None)] * 3
    assert s.need(group) == sum(s.shares(group))


def test_worlds_are_grouped_to_keep_every_slot_busy() -> None:
    """Fewer chunks than slots: a chunk's worlds are split over the slots (one chunk, two
    slots: two groups); a workload with files runs a world per sandbox."""
    one_chunk = state(episodes=12)
    assert one_chunk.group_size() == 2
    assert [u.worlds for u in one_chunk.world_units()] == [("baseline", "boost"), ("placebo",)]
    files = state(workspace=True)
    assert files.group_size() == 1
    assert [u.key for u in files.world_units()][:3] == ["baseline#0", "boost#0", "placebo#0"]
    # a world that recorded the chunk is left out of its group
    one_chunk.record_batch(
        BatchOutcome(world="boost", chunk=chunks(one_chunk)[0], status=BatchStatus.completed)
    )
    assert [u.worlds for u in one_chunk.world_units()] == [("baseline", "placebo")]


def test_a_world_batch_is_blocked_once_its_world_or_prefix_is_lost() -> None:
    s = state()
    first, second = chunks(s)
    assert s.blocked(Unit(first, ("boost",))) == "its episodes' prefixes did not run"
    s.record_prefix(prefix(first))
    s.record_prefix(prefix(second))
    assert s.blocked(Unit(first, ("boost",))) is None
    s.record_batch(BatchOutcome(world="boost", chunk=first, status=BatchStatus.failed, error="x"))
    assert s.blocked(Unit(second, ("boost",))) == "the world is already failed"
    assert s.blocked(Unit(second, ("placebo",))) is None
    # a group runs without its stopped world, whose batch is recorded as skipped
    group = Unit(second, ("boost", "placebo"))
    assert s.blocked(group) is None
    assert s.without_stopped(group) == Unit(second, ("placebo",))
    assert s.tally.worlds["boost"].skipped == 1
    s.record_batch(BatchOutcome(world="placebo", chunk=first, status=BatchStatus.skipped))
    assert s.blocked(Unit(second, ("boost", "placebo"))) == (
        "every world of the group is already failed or skipped"
    )


def test_a_skipped_prefix_skips_every_world_of_its_chunk() -> None:
    s = state()
    s.skip(Unit(chunks(s)[1]), "budget: needs up to 9.0 world-seconds, 1.0 left")
    assert s.ledger.use.skipped_batches == 3
    result = views.result(s, None)
    assert result.skipped == [
        f"{w} episodes 12..23: budget: needs up to 9.0 world-seconds, 1.0 left"
        for w in ("baseline", "boost", "placebo")
    ]
    assert views.progress(s).batches_skipped == 3


def test_a_prefix_skipped_for_budget_is_not_skipped_again_by_a_continued_run() -> None:
    """A prefix chunk skipped for budget never enters ``tally.prefixes``; the run that
    continues as new must not offer it again (another skipped row per world, another
    skipped line, another ``ledger.skip``), and a repeated skip changes nothing."""
    s = state()
    s.ledger.use.max_world_seconds = 1.0  # too little for any prefix

    def run_prefixes(run: RunState) -> None:  # the workflow's loop, without sandboxes
        for unit in run.prefix_units():
            blocked = run.ledger.refusal(run.need(unit))
            assert blocked is not None
            run.skip(unit, blocked)

    run_prefixes(s)
    assert s.ledger.use.skipped_batches == 6  # two chunks, three worlds
    continued = state()  # the next run of the chain: tally and budget from the carry
    continued.tally = ProgressTally.model_validate_json(s.tally.model_dump_json())
    continued.ledger = BudgetLedger(s.ledger.use.model_copy(deep=True), 3.0, s.ledger.slowdowns)
    assert list(continued.prefix_units()) == []
    run_prefixes(continued)
    continued.skip(Unit(chunks(continued)[0]), "again")  # a repeated skip: no-op
    assert continued.ledger.use.skipped_batches == 6
    assert views.progress(continued).batches_skipped == 6
    assert len(continued.tally.skipped_lines) == 6
    assert all(w.skipped == 2 for w in continued.tally.worlds.values())
    assert not continued.new_batches  # nothing new to save either
    assert list(continued.world_units()) == []


def test_status_details_and_result_show_the_same_state() -> None:
    s = state()
    s.stage, s.message = Stage.running_worlds, "running world batches"
    first, second = chunks(s)
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


def test_the_web_ui_shows_verdicts_at_the_top_and_the_whole_cleanup() -> None:
    """The run's current details lead with the verdicts once the analysis is done, and
    say what cleanup and the evidence log did; the result's JSON (the Web UI's Result
    panel) has the verdicts right after the status."""
    s = state()
    assert "Verdicts" not in views.details(s) and "cleanup" not in views.details(s)
    s.verdicts = ["boost: supported (expected failures to decrease: …)", "placebo: supported"]
    s.cleanup = CleanupResult(found=3, removed=3, rounds=1, left=0)
    s.evidence_log = "skipped: Braintrust is not configured"
    text = views.details(s)
    lines = text.splitlines()
    assert lines[2] == "**Verdicts**" and lines[4] == f"- {s.verdicts[0]}"
    assert text.index("**Verdicts**") < text.index("**Run**") < text.index("- prefixes")
    assert "- cleanup: 3 found, 3 removed, 0 left" in lines
    assert "- evidence log: skipped: Braintrust is not configured" in lines
    analysis = AnalysisResult(
        report_digest="r", markdown_digest="m", html_digest="h", outcomes_digest="o",
        valid=True, worlds=[], verdicts=s.verdicts,
    )  # fmt: skip
    shown = views.result(s, analysis).model_dump(mode="json")
    assert list(shown)[:4] == ["experiment_id", "status", "error", "verdicts"]
    assert shown["verdicts"] == s.verdicts


def test_the_static_summary_is_cut_at_a_word() -> None:
    hypothesis = "Broadcasting the failure state to peers prevents the retry storm; " * 5
    line = summary_line(f"ForkLab x: {hypothesis}")
    assert len(line) <= 200 and line.endswith("…")
    assert hypothesis.startswith(line[len("ForkLab x: ") : -1] + " ")  # cut between words
    assert summary_line("ForkLab x: short\n text") == "ForkLab x: short text"


def test_the_experiment_activity_summaries_are_short_and_say_what_happens() -> None:
    """The Web UI cuts a long summary (the cleanup one named the whole run key), and the
    evidence log must not claim Braintrust on a worker without it."""
    source = (ROOT / "forklab" / "workflows" / "experiment" / "workflow.py").read_text()
    summaries = re.findall(r'summary=f?"([^"]*)"', source)
    assert summaries and all(len(s) <= 72 for s in summaries), summaries
    assert not any("Braintrust" in s for s in summaries)
    assert not any("_run_key" in s or "run_id" in s for s in summaries)  # ids run long


def test_a_world_whose_rehearsal_caught_a_stall_is_priced_by_paces_seen() -> None:
    """Under load, a run had its baseline world skipped as over budget: rehearsed rates
    are microseconds per episode, baseline's sample caught a 50 ms stall, and the slowdown
    of another world's sandbox (~10,000x its rate) was multiplied by baseline's rate."""
    s = state(episodes=24, chunk=6)
    assert s.plan is not None
    rates = {"baseline": 0.0125, "boost": 1.2e-5, "placebo": 1.2e-5}  # baseline: a stall
    s.plan.rehearsal.world_seconds_per_episode = rates
    s.ledger.use.max_world_seconds = 300.0
    first, second = chunks(s)[:2]
    planned = s.need(Unit(first, ("baseline",)))  # nothing seen yet: as rehearsed
    assert planned == pytest.approx(3.0 * 0.0125 * 6 + START_ALLOWANCE)

    def done(world: str, chunk: EpisodeChunk, seconds: float) -> BatchOutcome:
        return BatchOutcome(world=world, chunk=chunk, status=BatchStatus.completed, seconds=seconds)

    s.record_batch(done("boost", first, 0.7))
    # a world not seen yet: at least the slowest pace any world's batch ran at (0.7 s / 6)
    assert s.need(Unit(first, ("placebo",))) == pytest.approx(3.0 * 0.7)
    assert s.need(Unit(second, ("baseline",))) == pytest.approx(planned)  # was 2187 (> 300)
    s.record_batch(done("baseline", first, 9.0))  # its own sandbox: 9 s
    assert s.need(Unit(second, ("baseline",))) == pytest.approx(3.0 * 9.0)
    assert s.need(Unit(second, ("boost",))) == pytest.approx(3.0 * 0.7)  # its own pace only
    s.record_batch(done("boost", second, 0.1))  # paces never shrink
    assert s.need(Unit(second, ("boost",))) == pytest.approx(3.0 * 0.7)
    chained = state(episodes=24, chunk=6)  # the next run of a chain: paces from progress
    assert chained.plan is not None
    chained.plan.rehearsal.world_seconds_per_episode = rates
    chained.tally = ProgressTally.model_validate_json(s.tally.model_dump_json())  # the carry
    assert chained.paces == s.paces == {"boost": pytest.approx(0.7 / 6), "baseline": 1.5}


def test_what_a_run_keeps_of_its_progress_does_not_grow_with_the_chunks() -> None:
    """10,000,000 episodes × 8 worlds at 1,000 episodes a batch: 10,000 chunks, 80,000
    batches. The tally a run keeps (and a continued run inherits) holds spans, counts and
    paces: its size after the whole experiment is that after a tenth of it, give or take
    the digits of the counts. The records themselves went to the stored progress."""
    s = state(episodes=10_000_000, chunk=1000)
    s.spec = s.spec.model_copy(
        update={"worlds": [s.spec.worlds[0]] * 8}  # eight worlds' worth of records
    )
    names = [f"w{i}" for i in range(8)]
    sizes = []
    for c in chunks(s):
        s.record_prefix(prefix(c))
        for name in names:
            s.record_batch(
                BatchOutcome(world=name, chunk=c, status=BatchStatus.completed, seconds=1.0)
            )
        if c.index in (999, 9_999):
            sizes.append(len(s.tally.model_dump_json()))
        s.saved("a" * 64, s.save_input())  # a save between chunks, as runs make them
    assert s.tally.prefixes.spans == [(0, 10_000)]
    assert views.progress(s).batches_completed == 80_000
    assert sizes[1] - sizes[0] < 64, sizes


def test_a_chunk_set_keeps_sorted_spans() -> None:
    seen = ChunkSet()
    for i in (3, 1, 2, 7, 0, 5, 6, 6):
        seen.add(i)
    assert seen.spans == [(0, 4), (5, 8)]
    assert [i in seen for i in range(9)] == [True] * 4 + [False] + [True] * 3 + [False]
    assert seen.count() == 7 and seen.first_missing() == 4
    seen.add(4)
    assert seen.spans == [(0, 8)] and seen.first_missing() == 8
    assert ChunkSet(spans=[(2, 3)]).first_missing() == 0


def test_the_stored_progress_merges_saves_and_is_read_back_verified(tmp_path: Path) -> None:
    """Each save sends only the records since the last one; reading walks the index, and
    a damaged segment is reported, never read."""
    store = LocalArtifactStore(tmp_path)
    s = state(episodes=24, chunk=6)
    first, second, third, fourth = chunks(s)
    digests = []
    for c in (first, second, third, fourth):
        s.record_prefix(prefix(c).model_copy(update={"checkpoints_digest": f"cp{c.index}"}))
        s.record_batch(BatchOutcome(world="boost", chunk=c, status=BatchStatus.completed))
        inp = s.save_input()
        assert len(inp.prefixes) == len(inp.batches) == 1  # only what is new travels
        late = BatchOutcome(world="placebo", chunk=c, status=BatchStatus.completed)
        s.record_batch(late)  # completed while the save ran: kept for the next save
        s.saved(save_progress(store, inp), inp)
        assert s.new_batches == [late] and not s.new_prefixes
        s.new_batches.clear()
        assert save_progress(store, inp) == s.tally.digest  # a retried save changes nothing
        digests.append(s.tally.digest)
    assert s.tally.digest is not None
    progress = read_progress(store, s.tally.digest)
    assert [p.chunk.index for p in progress.prefixes] == [0, 1, 2, 3]
    assert [b.chunk.index for b in progress.batches] == [0, 1, 2, 3]
    assert progress.chunks == 4
    refs = prefix_refs(store, PrefixRefsInput(progress=s.tally.digest, first=1, stop=3))
    assert [(r.index, r.checkpoints_digest) for r in refs] == [(1, "cp1"), (2, "cp2")]
    index = store.get_json(s.tally.digest)
    segment = store.path(index["segments"][2]["digest"])
    segment.write_bytes(segment.read_bytes().replace(b"cp2", b"cpX"))
    with pytest.raises(ArtifactError, match="corrupt"):
        read_progress(store, s.tally.digest)
    with pytest.raises(ArtifactError, match="corrupt"):
        prefix_refs(store, PrefixRefsInput(progress=s.tally.digest, first=2, stop=3))
    # chunks whose segments are intact are still read (only overlapping segments are)
    assert prefix_refs(store, PrefixRefsInput(progress=s.tally.digest, first=0, stop=1))
