"""The guard's held-out batch starts in its box as the analysis starts, and is handed to
the guard when it asks; a batch nobody asks for is killed, and a run whose guard world
did not complete starts none."""

from __future__ import annotations

import time
from pathlib import Path

from forklab.activities.experiment.held_out import HeldOutAhead
from forklab.activities.experiment.runner_bundle import bundle_files
from forklab.activities.experiment.twin import twin_held_out
from forklab.activities.sandbox.workload_calls import WorkloadCalls
from forklab.cli.experiment.rehearsal import workload_code_digest
from forklab.contracts.experiment import BatchOutcome, BatchStatus, EpisodeChunk, Progress
from forklab.experiments.experiment.analysis.guard import validate_guard
from forklab.experiments.experiment.analysis.held_out_plan import held_out_request, holdout_size
from forklab.experiments.experiment.spec import ExperimentSpec
from tests.helpers import restart_spec


def _progress(spec: ExperimentSpec, failed: str | None = None) -> Progress:
    chunk = EpisodeChunk(index=0, first=0, stop=spec.episodes)
    batches = [
        BatchOutcome(
            world=w.name,
            chunk=chunk,
            status=BatchStatus.failed if w.name == failed else BatchStatus.completed,
        )
        for w in spec.worlds
    ]
    return Progress(chunks=1, prefixes=[], batches=batches)


def _ahead(tmp_path: Path, spec: ExperimentSpec, progress: Progress) -> HeldOutAhead:
    calls = WorkloadCalls(tmp_path / "calls")
    files = bundle_files(spec.workload.name)
    return HeldOutAhead(calls, files, workload_code_digest(spec), spec, progress)


def _boxes_started(ahead: HeldOutAhead, seconds: float = 30.0) -> list[int]:
    deadline = time.monotonic() + seconds
    while not ahead._boxes and time.monotonic() < deadline:
        time.sleep(0.01)
    return list(ahead._boxes)


def test_the_batch_started_ahead_is_the_one_the_guard_validates_with(tmp_path: Path) -> None:
    spec = restart_spec("ahead", 3, 60)
    rule = {"any": [{"queue_depth": {"ge": 1}}]}
    twin = validate_guard(spec, spec.worlds[1], rule, holdout_size(spec), twin_held_out(1))
    with _ahead(tmp_path, spec, _progress(spec)) as ahead:
        assert _boxes_started(ahead), "the box starts on entry, before anyone asks"
        durable = validate_guard(spec, spec.worlds[1], rule, holdout_size(spec), ahead.runner)
        assert ahead._taken
    assert durable == twin
    assert not list((tmp_path / "calls").iterdir()), "the call's folder is removed"


def test_a_batch_nobody_asks_for_is_killed_on_exit(tmp_path: Path) -> None:
    """A large held-out batch (200,000 episodes: minutes of work) left behind by an
    analysis that failed ends with it, in well under its run time."""
    small = restart_spec("ahead-unused", 3, 100).model_dump(mode="json")
    small["analysis"] = {"guard": {"holdout_episodes": 200_000}}
    spec = ExperimentSpec.model_validate(small)
    started = time.monotonic()
    with _ahead(tmp_path, spec, _progress(spec)) as ahead:
        boxes = _boxes_started(ahead)
        assert boxes
        time.sleep(0.5)
    assert time.monotonic() - started < 20
    for pgid in boxes:
        assert not Path(f"/proc/{pgid}").exists(), "the box's processes are gone"
    assert not list((tmp_path / "calls").iterdir())


def test_no_batch_starts_when_the_guard_world_did_not_complete(tmp_path: Path) -> None:
    spec = restart_spec("ahead-failed", 3, 60)
    with _ahead(tmp_path, spec, _progress(spec, failed="restart")) as ahead:
        time.sleep(0.3)
        assert not ahead._boxes and ahead._future is None


def test_the_request_ahead_is_the_one_validate_guard_makes() -> None:
    spec = restart_spec("ahead-request", 3, 60)
    episodes, plans = held_out_request(spec, spec.worlds[1], 25)
    assert episodes == range(60, 85)
    assert [p.name for p in plans] == ["baseline", "restart"]
