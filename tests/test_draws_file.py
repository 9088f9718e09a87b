"""The draws file: the prefix works out each episode's world block runs once, the worlds
preload them. Results and shock fingerprints must be exactly those of worlds that work
the runs out themselves; a file that does not belong is ignored or refused."""

from __future__ import annotations

import hashlib
import json
import marshal
import time
from pathlib import Path
from typing import Any

import pytest
from temporalio.testing import ActivityEnvironment

from activities.artifacts import ArtifactError, LocalArtifactStore
from activities.models import (
    BatchInput,
    BatchStatus,
    CleanupInput,
    EpisodeChunk,
    PrefixInput,
    RunnerJob,
)
from activities.runner_bundle import bundle_files
from activities.sandbox import LocalSandboxBackend, workload_inside
from activities.shared_snapshots import SharedSnapshots
from activities.world_batches import SandboxActivities
from experiments.runtime.canon import canonical_json
from experiments.runtime.crn import Block, EpisodeDraws, Run, Shocks, uniform
from experiments.runtime.draws_file import (
    DrawsFormatError,
    RunEntry,
    draws_key,
    encode,
    pack_words,
    read_draws,
    run_entry,
    shipped_run,
)
from experiments.runtime.file_format import (
    DRAWS_FILE,
    Checkpoint,
    WorldPlan,
    checkpoint_line,
    request_text,
)
from experiments.runtime.runner import (
    _run,
    continue_checkpoints,
    main,
    prefix_with_runs,
    preload_draws,
    run_batch,
    run_prefix,
)
from experiments.runtime.workload import State
from experiments.workloads.counter_recovery import CounterRecovery
from experiments.workloads.retry_cascade import RetryCascade

SEED = 7
WORLDS = [
    WorldPlan(name=n, intervention=None if n == "baseline" else n)
    for n in ("baseline", *RetryCascade.interventions)
]
PARAMS: dict[str, Any] = {}


def _prefix_in(folder: Path, workload: str, episodes: range, seed: int = SEED) -> bytes | None:
    """Run the runner's ``prefix`` mode as a sandbox does (files in ``folder``); returns
    the draws file it wrote, None if it wrote none."""
    folder.mkdir(parents=True, exist_ok=True)
    out, draws = folder / "out.json", folder / DRAWS_FILE
    req = json.loads(request_text(workload, PARAMS, seed, episodes=episodes, draws=str(draws)))
    assert _run("prefix", req, str(folder / "checkpoints.jsonl"), str(out)) == 0
    return draws.read_bytes() if draws.exists() else None


def _checkpoints(folder: Path) -> list[Checkpoint]:
    lines = (folder / "checkpoints.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]


def _continue_in(folder: Path, workload: str, world: WorldPlan, draws: bytes | None) -> Any:
    """The runner's ``continue`` mode, with the draws file ``draws`` (None: without)."""
    path = folder / DRAWS_FILE
    if draws is not None:
        path.write_bytes(draws)
    shipped = str(path) if draws is not None else None
    req = json.loads(request_text(workload, PARAMS, SEED, world=world, draws=shipped))
    out = folder / "columns.json"
    assert _run("continue", req, str(folder / "checkpoints.jsonl"), str(out)) == 0
    return json.loads(out.read_text())


@pytest.fixture(scope="module")
def chunk(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, bytes]:
    folder = tmp_path_factory.mktemp("prefix")
    draws = _prefix_in(folder, "retry-cascade", range(0, 60))
    assert draws is not None
    return folder, draws


def test_preloaded_runs_give_every_world_the_same_outcomes_and_fingerprints(
    chunk: tuple[Path, bytes],
) -> None:
    folder, draws = chunk
    twin = run_batch(RetryCascade(PARAMS), SEED, range(0, 60), WORLDS, memo=False)
    for world in WORLDS:
        alone = _continue_in(folder, "retry-cascade", world, None)
        shipped = _continue_in(folder, "retry-cascade", world, draws)
        assert canonical_json(shipped) == canonical_json(alone), world.name
        for column in ("outcomes", "intervened", "shocks"):
            assert shipped[column] == twin["worlds"][world.name][column], (world.name, column)
    # the runs were really taken from the file: one per episode
    workload = RetryCascade(PARAMS)
    runs = read_draws(draws, draws_key("retry-cascade", PARAMS, SEED))
    taken = 0
    width = len(workload._shocks.pairs)
    for cp in _checkpoints(folder):
        table = EpisodeDraws(SEED, cp["episode"])
        taken += preload_draws(workload, table, cp["state"], runs[cp["episode"]])
        (run,) = table.runs.values()
        # the shipped run: of its words, only the first tick's were worked out (the check)
        assert run.count > width and len(table.exogenous) == width
    assert taken == 60


def test_a_workload_that_names_no_runs_ships_no_file(tmp_path: Path) -> None:
    assert _prefix_in(tmp_path, "counter-recovery", range(0, 40)) is None
    world = WorldPlan(name="refresh", intervention="refresh")
    cols = _continue_in(tmp_path, "counter-recovery", world, None)
    twin = run_batch(CounterRecovery(PARAMS), SEED, range(0, 40), [world], memo=False)
    assert cols["outcomes"] == twin["worlds"]["refresh"]["outcomes"]


def test_a_file_of_another_chunk_is_ignored(tmp_path: Path, chunk: tuple[Path, bytes]) -> None:
    _, draws = chunk
    other = tmp_path / "other"
    _prefix_in(other, "retry-cascade", range(60, 90))
    for world in WORLDS[:3]:
        # the file holds episodes 0..59, the checkpoints are of 60..89: nothing matches
        assert canonical_json(_continue_in(other, "retry-cascade", world, draws)) == (
            canonical_json(_continue_in(other, "retry-cascade", world, None))
        )


def _entries(draws: bytes) -> dict[int, tuple[RunEntry, ...]]:
    return read_draws(draws, draws_key("retry-cascade", PARAMS, SEED))


def _rewritten(entries: dict[int, tuple[RunEntry, ...]]) -> bytes:
    """A well-formed file (checksum and all) holding ``entries``."""
    return encode(draws_key("retry-cascade", PARAMS, SEED), list(entries.items()))


def test_runs_of_another_episode_are_ignored_or_refused(chunk: tuple[Path, bytes]) -> None:
    folder, draws = chunk
    entries = _entries(draws)
    checkpoints = {cp["episode"]: cp for cp in _checkpoints(folder)}
    onset = {e: json.loads(cp["state"])["onset"] for e, cp in checkpoints.items()}
    workload = RetryCascade(PARAMS)
    same = next(b for a in onset for b in onset if a < b and onset[a] == onset[b])
    first = next(a for a in onset if a != same and onset[a] == onset[same])
    differs = next(b for b in onset if onset[b] != onset[first])
    # other ticks than the world's: not taken (the world works its run out itself)
    assert preload_draws(workload, EpisodeDraws(SEED, differs), checkpoints[differs]["state"],
                         entries[first]) == 0  # fmt: skip
    # the same ticks, another episode's words: refused by the check of the first tick
    with pytest.raises(DrawsFormatError, match="not what its first tick works out to"):
        preload_draws(workload, EpisodeDraws(SEED, same), checkpoints[same]["state"],
                      entries[first], "the draws file 'x'")  # fmt: skip
    # and through the runner: the file names episode ``first``'s runs as ``same``'s
    moved = _rewritten({**entries, same: entries[first]})
    with pytest.raises(DrawsFormatError, match=r"the draws file .*draws.bin"):
        _continue_in(folder, "retry-cascade", WORLDS[0], moved)


def test_a_flipped_word_or_decoded_value_is_refused(chunk: tuple[Path, bytes]) -> None:
    folder, draws = chunk
    entries = _entries(draws)
    (run,) = prefix_with_runs(RetryCascade(PARAMS), SEED, 3)[1]
    assert entries[3] == (run_entry(run),)
    flipped = list(run.words)
    flipped[1] ^= 1 << 40
    bad_word = Run(run.block, run.start, run.stop, flipped, run.decoded)
    first = run.decoded[0]
    bad_value = (first[0], first[1] + 1.0, *first[2:])
    bad_decoded = Run(run.block, run.start, run.stop, run.words, (bad_value, *run.decoded[1:]))
    for tampered in (
        {**entries, 3: (run_entry(bad_word),)},
        {**entries, 3: (run_entry(bad_decoded),)},
    ):
        with pytest.raises(DrawsFormatError, match=r"episode 3's run .* is not what"):
            _continue_in(folder, "retry-cascade", WORLDS[0], _rewritten(tampered))
    # a byte changed anywhere in the file: its checksum fails
    damaged = bytearray(draws)
    damaged[-100] ^= 1
    with pytest.raises(DrawsFormatError, match="checksum"):
        _continue_in(folder, "retry-cascade", WORLDS[0], bytes(damaged))
    # another seed (or workload, or params): refused
    with pytest.raises(DrawsFormatError, match="another workload, params or seed"):
        read_draws(draws, draws_key("retry-cascade", PARAMS, SEED + 1))
    with pytest.raises(DrawsFormatError, match="no draws file"):
        read_draws(b"{}", draws_key("retry-cascade", PARAMS, SEED))


def test_a_refused_file_ends_the_runner_with_its_sentence(
    chunk: tuple[Path, bytes], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """As a box runs it (``main``): one sentence naming the file, no traceback, exit 1."""
    folder, draws = chunk
    damaged = bytearray(draws)
    damaged[-100] ^= 1
    (tmp_path / DRAWS_FILE).write_bytes(bytes(damaged))
    request = tmp_path / "request.json"
    request.write_text(
        request_text(
            "retry-cascade", PARAMS, SEED, world=WORLDS[0], draws=str(tmp_path / DRAWS_FILE)
        )
    )
    argv = ["continue", "--request", str(request), "--out", str(tmp_path / "out.json")]
    assert main([*argv, "--checkpoints", str(folder / "checkpoints.jsonl")]) == 1
    said = capsys.readouterr().err.strip().splitlines()
    assert len(said) == 1, said
    assert said[0].startswith(f"the draws file '{tmp_path / DRAWS_FILE}' is refused"), said
    assert "checksum" in said[0]
    assert not (tmp_path / "out.json").exists()


class WrongHint(RetryCascade):
    """Names runs no world asks for (one tick late): they may only cost time."""

    def world_blocks(self, state: State) -> list[tuple[Block[Any], int, int]]:
        return [(b, start + 1, stop) for b, start, stop in super().world_blocks(state)]


def test_a_wrong_hint_changes_no_result(chunk: tuple[Path, bytes]) -> None:
    folder, _ = chunk
    workload = WrongHint(PARAMS)
    checkpoints = _checkpoints(folder)
    shipped = {}
    for cp in checkpoints[:20]:
        episode = cp["episode"]
        again, runs = prefix_with_runs(workload, SEED, episode)
        assert again == cp and runs
        shipped[episode] = [run_entry(r) for r in runs]
    for world in WORLDS[:3]:
        assert continue_checkpoints(workload, SEED, checkpoints[:20], world, shipped=shipped) == (
            continue_checkpoints(RetryCascade(PARAMS), SEED, checkpoints[:20], world)
        )


def test_a_world_that_draws_a_run_and_single_coordinates_keeps_its_fingerprint() -> None:
    block = Block([(-1, "cap"), (0, "work"), (0, "work")], lambda values: values)
    made = EpisodeDraws(5, 6).run(block, 3, 9)
    preloaded = EpisodeDraws(5, 6)
    # shipped as the file ships it: its decodings and the sum of its words
    shipped, head = shipped_run(block, run_entry(made), preloaded)
    assert list(head) == made.words[: len(block.pairs)]
    preloaded.preload(shipped)
    plain = Shocks(5, 6)
    for t in range(3, 9):
        for entity, stream in block.pairs:
            plain.exogenous(entity, t, stream)
    plain.exogenous(0, 4, "work")
    plain.exogenous(0, 12, "work")
    world = Shocks(5, 6, draws=preloaded)
    world.exogenous(0, 4, "work")  # inside the run: counted once
    world.exogenous(0, 12, "work")  # outside it
    assert world.exogenous_blocks(block, 3, 9) == made.decoded
    assert world.fingerprint() == plain.fingerprint()
    assert made.count == 12  # a pair named twice is one coordinate
    # a second, overlapping run of the same block: the union counts each coordinate once
    world.exogenous_blocks(block, 7, 11)
    for t in range(9, 11):
        plain.exogenous(-1, t, "cap")
        plain.exogenous(0, t, "work")
    assert world.fingerprint() == plain.fingerprint()
    assert world.exogenous(-1, 5, "cap") == uniform(5, 6, -1, 5, "cap")


@pytest.mark.parametrize(
    "decode",
    [
        lambda v: v,  # floats only: every column packed
        lambda v: (int(v[0] * 4), v[1], ("x",) if v[2] < 0.5 else ()),  # mixed columns
        lambda v: [v[0], v[1]],  # not a tuple: kept tick by tick
        lambda v: (v[0],) if v[1] < 0.5 else (v[0], v[1]),  # tuples of two widths
        lambda v: (1.0 if v[0] < 0.5 else 1, v[1]),  # a float column with an int in it
    ],
)
def test_a_shipped_run_reads_back_exactly(decode: Any) -> None:
    """Whatever the decodings' shape, a run read back from the file has them exactly
    (types included: an int is never read back as a float), and the same count and sum."""
    block = Block([(-1, "cap"), (0, "work"), (1, "work")], decode)
    made = EpisodeDraws(5, 6).run(block, 3, 40)
    data = encode("k", [(6, (run_entry(made),))])
    (entry,) = read_draws(data, "k")[6]
    run, head = shipped_run(block, entry, EpisodeDraws(5, 6))
    assert marshal.dumps(run.decoded, 2) == marshal.dumps(made.decoded, 2)
    assert (run.count, run.total, list(head)) == (made.count, made.total, made.words[:3])
    assert list(run.words) == list(made.words)  # worked out again through the table


def test_a_file_of_another_format_is_ignored(chunk: tuple[Path, bytes]) -> None:
    """A file another build wrote (draws format 1: every word, ticks one by one) costs the
    world the time to work its runs out, and changes nothing."""
    folder, _ = chunk
    workload = RetryCascade(PARAMS)
    episodes = []
    for cp in _checkpoints(folder):
        runs = prefix_with_runs(workload, SEED, cp["episode"])[1]
        episodes.append(
            (cp["episode"], tuple((r.start, r.stop, pack_words(r.words), r.decoded) for r in runs))
        )
    payload = marshal.dumps((1, draws_key("retry-cascade", PARAMS, SEED), episodes), 4)
    check = hashlib.blake2b(payload, digest_size=32).hexdigest().encode()
    older = b"forklab-draws\n" + check + b"\n" + payload
    with pytest.raises(DrawsFormatError, match="not in draws format 2"):
        read_draws(older, draws_key("retry-cascade", PARAMS, SEED))
    for world in WORLDS[:2]:
        assert canonical_json(_continue_in(folder, "retry-cascade", world, older)) == (
            canonical_json(_continue_in(folder, "retry-cascade", world, None))
        )


def test_checkpoint_lines_are_unchanged_by_shipping_runs(chunk: tuple[Path, bytes]) -> None:
    folder, _ = chunk
    workload = RetryCascade(PARAMS)
    for cp in _checkpoints(folder)[:5]:
        again, _ = prefix_with_runs(workload, SEED, cp["episode"])
        assert checkpoint_line(again) == checkpoint_line(cp)


async def test_a_runs_draws_are_its_scratch_and_its_cleanup_drops_only_them(
    tmp_path: Path,
) -> None:
    """Two runs of one spec ship the same draws bytes; each run keeps its own copy as
    scratch (not among the kept blobs), and one run's cleanup leaves the other's worlds
    able to read theirs."""
    store = LocalArtifactStore(tmp_path / "artifacts")
    backend = LocalSandboxBackend(tmp_path / "sandboxes")
    acts = SandboxActivities(backend, store, SharedSnapshots(backend, store))
    info = SharedSnapshots(backend, store).prepare(bundle_files("retry-cascade"))
    job = RunnerJob(workload="retry-cascade", params=PARAMS, seed=SEED, workspace=False)
    chunk = EpisodeChunk(index=0, first=0, stop=20)
    env = ActivityEnvironment()

    def common(run_key: str) -> dict[str, Any]:
        return {"experiment_id": "exp", "run_key": run_key, "job": job, "snapshot_id": info.id}

    prefixes = [
        await env.run(
            acts.run_prefixes, PrefixInput(**common(k), chunk=chunk, reservation_seconds=120)
        )
        for k in ("wf/run-1", "wf/run-2")
    ]
    draws = prefixes[0].draws_digest
    assert draws is not None and draws == prefixes[1].draws_digest
    assert not store.path(draws).exists()

    def batch(run_key: str) -> BatchInput:
        return BatchInput(
            **common(run_key),
            world=WORLDS[1],
            chunk=chunk,
            checkpoints_digest=prefixes[0].checkpoints_digest,
            draws_digest=draws,
            reservation_seconds=120,
        )

    cleaned = await env.run(
        acts.cleanup_sandboxes, CleanupInput(experiment_id="exp", run_key="wf/run-2")
    )
    store_draws = store.get_scratch("wf/run-1", draws)
    size = len(store_draws)
    assert (cleaned.scratch_dropped, cleaned.scratch_bytes) == (1, size)
    assert "1 scratch artifact (draws file, " in cleaned.summary()
    done = await env.run(acts.run_world_batch, batch("wf/run-1"))
    assert done.status is BatchStatus.completed, done.error
    cleaned = await env.run(
        acts.cleanup_sandboxes, CleanupInput(experiment_id="exp", run_key="wf/run-1")
    )
    assert (cleaned.left, cleaned.scratch_dropped) == (0, 1)
    assert not [p for p in store.root.joinpath("scratch").rglob("*") if p.is_file()]
    with pytest.raises(ArtifactError, match="of run wf/run-1 is missing"):
        await env.run(acts.run_world_batch, batch("wf/run-1"))
    # a run whose prefix ran on a worker from before the scratch kept the file among the
    # blobs: its worlds still find it there (a rolling upgrade fails no run under way)
    assert store.put_bytes(store_draws) == draws
    done = await env.run(acts.run_world_batch, batch("wf/run-1"))
    assert done.status is BatchStatus.completed, done.error
    assert backend.list({}) == []


class FarHint(RetryCascade):
    """Names one long run every world will draw (ticks 0..4,999: ~15,000 words an
    episode), so that working it out dwarfs the prefix itself."""

    def world_blocks(self, state: State) -> list[tuple[Block[Any], int, int]]:
        return [(self._shocks, 0, 5_000)]


def test_the_rehearsal_times_the_prefix_with_the_runs_it_ships() -> None:
    """The budget reserves each prefix chunk from the rehearsal's prefix rate, and the
    prefix's box works out the block runs its worlds will draw: the rate must include
    them, or a chunk is killed past its reservation (as a 4,000-episode chunk was). Timed
    without them, this prefix costs well under a millisecond; its runs, far more."""
    request = {
        "workload": f"{__name__}:FarHint",
        "params": PARAMS,
        "seed": SEED,
        "worlds": [WORLDS[0].to_json()],
        "episodes": 3,
        "all_episodes": 3,
    }
    workload = FarHint(PARAMS)
    start = time.perf_counter()
    for episode in range(3):
        run_prefix(workload, SEED, episode)
    plain = (time.perf_counter() - start) / 3
    answer = workload_inside.rehearse(request)
    assert answer["prefix_seconds_per_episode"] > max(2e-3, 4 * plain), (answer, plain)
