"""The rehearsal hands its prefixes over: for a workload without files whose prefixes fit
its box, it runs every episode's prefix for good, and hands over the checkpoints the
prefix stage's runner would write (the same bytes), so the run's worlds and outcomes are
the same and the prefixes run once, not twice."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from orchestration_lab import UNCONFINED_HERE
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from forklab.activities.experiment.planning import PlanningActivities
from forklab.activities.experiment.runner_bundle import bundle_files
from forklab.activities.experiment.workload_bundles import WorkloadBundles
from forklab.activities.sandbox.local import LocalSandboxBackend
from forklab.activities.sandbox.shared_snapshots import SharedSnapshots
from forklab.activities.sandbox.workload_calls import (
    Handover,
    WorkloadCallError,
    WorkloadCalls,
    WorkloadContractError,
)
from forklab.activities.stores.artifacts import LocalArtifactStore
from forklab.contracts.experiment import EpisodeChunk, RehearsedPrefixInput, RehearseInput
from forklab.experiments.experiment.bundle import BundleFile
from forklab.experiments.experiment.spec import ExperimentSpec
from forklab.experiments.experiment.worlds import spec_world_plans
from forklab.runtime import box, worker_calls
from forklab.runtime.file_format import request_text
from tests.test_boxed_rehearsal import BREAKS_AT, breaks_spec, parts_on_three_cpus

CHUNKS = [(0, 250), (250, 500), (500, 600)]


def _cascade_spec(episodes: int = 600) -> ExperimentSpec:
    return ExperimentSpec.model_validate(
        {
            "id": "handed",
            "hypothesis": {"text": "h"},
            "seed": 11,
            "episodes": episodes,
            "workload": {"name": "retry-cascade", "params": {}},
            "worlds": [
                {"name": "baseline", "role": "baseline"},
                {"name": "jitter", "role": "treatment", "intervention": {"name": "jitter"}},
            ],
        }
    )


def _runner_prefix(tmp_path: Path, spec: ExperimentSpec, first: int, stop: int) -> bytes:
    """What the prefix stage's runner writes for episodes ``first`` .. ``stop - 1``."""
    folder = tmp_path / f"runner-{first}"
    folder.mkdir()
    request = request_text(
        spec.workload.name,
        dict(spec.workload.params),
        spec.seed,
        episodes=range(first, stop),
    )
    (folder / "request.json").write_text(request)
    args = ["prefix", "--request", str(folder / "request.json")]
    args += ["--checkpoints", str(folder / "cp"), "--out", str(folder / "out")]
    assert box.main(args) == 0
    return (folder / "cp").read_bytes()


def _rehearse_handing_over(
    tmp_path: Path, spec: ExperimentSpec, chunks: list[tuple[int, int]], files: list[BundleFile]
) -> tuple[dict[str, Any], dict[int, bytes]]:
    taken: dict[int, bytes] = {}

    def take(index: int, checkpoints: bytes) -> None:
        taken[index] = checkpoints

    calls = WorkloadCalls(tmp_path / "calls")
    answer, _, _ = calls.rehearse(
        spec, spec_world_plans(spec), 20, files, handover=Handover(chunks, take)
    )
    return answer, taken


def test_the_handed_over_prefixes_are_the_prefix_runners_bytes(tmp_path: Path) -> None:
    spec = _cascade_spec()
    answer, taken = _rehearse_handing_over(tmp_path, spec, CHUNKS, bundle_files(spec.workload.name))
    assert answer["handed"] is True
    assert sorted(taken) == [0, 1, 2]
    for index, (first, stop) in enumerate(CHUNKS):
        checkpoints = _runner_prefix(tmp_path, spec, first, stop)
        assert taken[index] == checkpoints, f"chunk {index}'s checkpoints differ"
    assert not list((tmp_path / "calls").iterdir()), "the call's folder is removed"


def _box_request(spec: ExperimentSpec) -> dict[str, Any]:
    """What the worker sends the box about ``spec`` (its ops add their own fields)."""
    return {
        "workload": spec.workload.name,
        "params": dict(spec.workload.params),
        "seed": spec.seed,
        "worlds": [p.to_json() for p in spec_world_plans(spec)],
    }


def test_chunks_written_in_parts_equal_one_loop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Runs of chunks in three forked parts write what one process writes."""
    spec = _cascade_spec(120)
    request = _box_request(spec)
    chunks = [(a, a + 20) for a in range(0, 120, 20)]
    workload = worker_calls._workload(request)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "one").mkdir()
    os.chdir(tmp_path / "one")
    worker_calls._hand_over(workload, request, chunks)
    forks = parts_on_three_cpus(monkeypatch)
    (tmp_path / "parts").mkdir()
    os.chdir(tmp_path / "parts")
    worker_calls._hand_over(workload, request, chunks)
    assert len(forks) == 3
    one = tmp_path / "one" / worker_calls.PREFIXES_DIR
    parts = tmp_path / "parts" / worker_calls.PREFIXES_DIR
    names = sorted(p.name for p in one.iterdir())
    assert names == sorted(p.name for p in parts.iterdir())
    assert len(names) == 6, names  # the checkpoints of each chunk
    for name in names:
        assert (one / name).read_bytes() == (parts / name).read_bytes(), name


def test_a_broken_prefix_is_answered_and_nothing_is_handed_over(tmp_path: Path) -> None:
    """Handing over checks each prefix as the check did: the first broken episode in
    episode order is the answer, whichever part it is in, and no chunk is taken."""
    spec, files = breaks_spec(tmp_path, {"bad": [3_100, 4_700]}, 5_000)
    chunks = [(a, min(a + 1_000, 5_000)) for a in range(0, 5_000, 1_000)]
    with pytest.raises(WorkloadContractError) as caught:
        _rehearse_handing_over(tmp_path, spec, chunks, files)
    assert "(episode 3100, prefix" in str(caught.value), str(caught.value)


def test_a_bundled_workload_hands_over_its_checkpoints(tmp_path: Path) -> None:
    spec, files = breaks_spec(tmp_path, {}, 3_000)
    chunks = [(0, 1_000), (1_000, 2_000), (2_000, 3_000)]
    answer, taken = _rehearse_handing_over(tmp_path, spec, chunks, files)
    assert answer["handed"] is True
    assert [len(cp.splitlines()) for cp in taken.values()] == [1_000, 1_000, 1_000]


def test_prefixes_that_do_not_fit_the_box_are_only_checked(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Past its share of the box's CPU the rehearsal only checks the prefixes (and the
    prefix stage runs them after approval): nothing is written."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(worker_calls, "_limit", lambda which: (100, 100))
    monkeypatch.setattr(worker_calls, "HANDOVER_CPU_SHARE", 0.0)
    spec = _cascade_spec(60)
    request = _box_request(spec) | {"episodes": 10, "all_episodes": 60}
    request["chunks"] = [[0, 30], [30, 60]]
    assert worker_calls.rehearse(request)["handed"] is False
    assert not (tmp_path / worker_calls.PREFIXES_DIR).exists()
    monkeypatch.setattr(worker_calls, "HANDOVER_CPU_SHARE", 1.0)
    assert worker_calls.rehearse(request)["handed"] is True
    assert len(list((tmp_path / worker_calls.PREFIXES_DIR).iterdir())) == 2


#: A workload that, in the last episode it runs, swaps chunk 0's checkpoints for a link
#: to a file of the host (which the worker, reading them, must not follow).
SWAPS_A_LINK = BREAKS_AT.replace(
    '        state["tries"] += 1\n',
    """        state["tries"] += 1
        if shocks.episode == self.params["swap_at"] and state["tries"] == 1:
            import os

            target = "prefixes/0.checkpoints"
            if os.path.exists(target):
                os.remove(target)
                os.symlink(self.params["host_file"], target)
""",
).replace(
    'default_params = {"bad": [], "threads": 0}',
    'default_params = {"bad": [], "threads": 0, "swap_at": -1, "host_file": ""}',
)


def test_a_link_the_box_leaves_in_place_of_checkpoints_is_refused(tmp_path: Path) -> None:
    secret = tmp_path / "secret.txt"
    secret.write_text("host secret\n")
    params = {"swap_at": 199, "host_file": str(secret)}
    spec, files = breaks_spec(tmp_path, params, 200, SWAPS_A_LINK)
    with pytest.raises(WorkloadCallError, match="wrote no checkpoints for chunk 0"):
        _rehearse_handing_over(tmp_path, spec, [(0, 100), (100, 200)], files)


def _planning(tmp_path: Path, store: LocalArtifactStore) -> PlanningActivities:
    """A worker's planning activities (each with its own cache of indexes)."""
    return PlanningActivities(
        SharedSnapshots(LocalSandboxBackend(tmp_path / "sandboxes"), store),
        2,
        WorkloadCalls(tmp_path / "calls"),
        WorkloadBundles(store, tmp_path / "bundles"),
        store,
        allow_unconfined=UNCONFINED_HERE,
    )


async def test_the_rehearse_activity_stores_them_and_the_prefix_stage_takes_them(
    tmp_path: Path,
) -> None:
    """Through the worker's activities: the rehearsal stores each chunk's checkpoints and
    an index; ``rehearsed_prefix`` gives each chunk's refs back, refuses a chunk the index
    lacks and a damaged index."""
    store = LocalArtifactStore(tmp_path / "artifacts")
    planning = _planning(tmp_path, store)
    spec = _cascade_spec()
    env = ActivityEnvironment()
    rehearsal = await env.run(
        planning.rehearse, RehearseInput(spec=spec, sample_episodes=20, batch_episodes=250)
    )
    handed = rehearsal.prefixes
    assert handed is not None and (handed.chunks, handed.batch_episodes) == (3, 250)
    for index, (first, stop) in enumerate(CHUNKS):
        chunk = EpisodeChunk(index=index, first=first, stop=stop)
        prefix = await env.run(
            planning.rehearsed_prefix, RehearsedPrefixInput(index=handed.index, chunk=chunk)
        )
        assert prefix.rehearsed and prefix.seconds == 0 and prefix.sandbox_id is None
        checkpoints = _runner_prefix(tmp_path, spec, first, stop)
        assert store.get_bytes(prefix.checkpoints_digest) == checkpoints
    beyond = EpisodeChunk(index=3, first=600, stop=700)
    with pytest.raises(ApplicationError, match="have no chunk 3"):
        await env.run(
            planning.rehearsed_prefix, RehearsedPrefixInput(index=handed.index, chunk=beyond)
        )
    # a damaged index (read by a worker that has not cached it) fails the prefix stage
    blob = tmp_path / "artifacts" / handed.index[:2] / handed.index[2:]
    blob.chmod(0o644)
    blob.write_bytes(blob.read_bytes().replace(b'"index":0', b'"index":9'))
    fresh = _planning(tmp_path, store)
    first = EpisodeChunk(index=0, first=0, stop=250)
    with pytest.raises(ApplicationError, match=r"cannot be read: artifact .* is corrupt"):
        await env.run(fresh.rehearsed_prefix, RehearsedPrefixInput(index=handed.index, chunk=first))
