"""The runner: runs prefixes once, forks checkpoints into worlds and continues them.

The local twin calls these functions in-process; inside a sandbox ``forklab.runtime.box``
(the box's entry point) calls the same ones. Standard library only.
"""

from __future__ import annotations

import importlib
import marshal
from collections.abc import Iterable, Mapping, Sequence
from hashlib import sha256
from typing import TYPE_CHECKING, Any

from forklab.runtime.canon import (
    canonical_json,
    parse_canonical,
    sha256_hex,
)
from forklab.runtime.contract import (
    BoundaryMissingError,
    ContractViolation,
    StuckWorldError,
    check_features,
    check_outcome,
    check_state,
    feature_kinds,
    from_exception,
    method_place,
    violation,
    where,
)
from forklab.runtime.crn import Block, EpisodeDraws, Shocks, UntrackedShocks
from forklab.runtime.file_format import (
    Batch,
    Checkpoint,
    WorldColumns,
    WorldPlan,
    checkpoint_id,
    checkpoint_line,
    empty_columns,
)
from forklab.runtime.files import (
    FolderFork,
    WorkspaceContentError,
    checkpoint_digest,
    folder_digest,
)
from forklab.runtime.vote import vote_decided
from forklab.runtime.workload import Feature, State, Workload, WorkloadError

if TYPE_CHECKING:
    # Imported where a workspace needs them: every box runs this module, most without
    # files, and ``pathlib``, ``shutil`` and ``tempfile`` add to each box's start-up.
    from pathlib import Path

BUILTIN_WORKLOADS = {
    "counter-recovery": "forklab.workloads.counter_recovery:CounterRecovery",
    "retry-cascade": "forklab.workloads.retry_cascade:RetryCascade",
    "coding-fix": "forklab.workloads.coding_fix:CodingFix",
}


def workload_class(ref: str) -> type[Workload]:
    """Resolve a built-in name or a ``module:attribute`` import path to a workload class."""
    path = BUILTIN_WORKLOADS.get(ref, ref)
    if ":" not in path:
        known = ", ".join(sorted(BUILTIN_WORKLOADS))
        raise WorkloadError(
            "workload.name",
            f"unknown workload {ref!r}; use one of {known} or an import path 'module:attribute'",
        )
    module_name, _, attr = path.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise WorkloadError(
            "workload.name",
            f"cannot import module {module_name!r} ({exc}); put it beside the spec file, run "
            "forklab in the folder that holds it, or add that folder to PYTHONPATH",
        ) from exc
    except Exception as exc:  # the module's own code failed while importing
        raise WorkloadError(
            "workload.name", f"importing {module_name!r} raised {type(exc).__name__}: {exc}"
        ) from exc
    cls = getattr(module, attr, None)
    if not (isinstance(cls, type) and issubclass(cls, Workload)):
        raise WorkloadError(
            "workload.name", f"{path!r} is not a subclass of forklab.runtime.workload.Workload"
        )
    return cls


def rule_fires(rule: Mapping[str, Any], features: Mapping[str, Feature]) -> bool:
    """A guard rule is ``{"any": [clause, ...]}``; a clause maps feature → matcher and
    matches when every matcher does (``{"eq": v}``, ``{"ge": lo, "lt": hi}``, or
    ``{"not_in": [v, ...]}``: present and none of those values)."""
    for clause in rule["any"]:
        for feature, matcher in clause.items():
            value = features[feature]
            if "eq" in matcher:
                if value != matcher["eq"]:
                    break
                continue
            if "not_in" in matcher:
                if value is None or value in matcher["not_in"]:
                    break
                continue
            lo, hi = matcher.get("ge", float("-inf")), matcher.get("lt", float("inf"))
            if value is None or not lo <= value < hi:  # a missing value lies in no range
                break
        else:
            return True
    return False


def run_prefix(
    workload: Workload, seed: int, episode: int, folder: Path | None = None
) -> Checkpoint:
    """Run one episode to its boundary, once, and take the checkpoint. A workload with
    ``has_workspace`` runs in ``folder`` (made empty here) and its checkpoint carries the
    digest of what the folder holds at the boundary."""
    if workload.has_workspace:
        if folder is None:
            name = type(workload).__name__
            raise ValueError(f"{name} has a workspace: run_prefix needs a folder")
        folder.mkdir(parents=True)
        workload.workspace = folder
    state, shocks = _start(workload, seed, episode)
    checkpoint = _prefix_from(workload, seed, episode, state, shocks, _Known(0))[0]
    if folder is not None and workload.has_workspace:
        checkpoint["workspace"] = _folder_digest(workload, folder, where(episode, None, 0))
    return checkpoint


def world_blocks(workload: Workload, state: State, at: str) -> list[tuple[Block[Any], int, int]]:
    """The block runs the workload says every world of the checkpoint ``state`` will draw
    (``Workload.world_blocks``), checked; ``at`` places an error."""
    try:
        hints = list(workload.world_blocks(state))
    except Exception as exc:
        raise from_exception(workload, exc, at) from exc
    for hint in hints:
        if not (
            type(hint) is tuple
            and len(hint) == 3
            and isinstance(hint[0], Block)
            and type(hint[1]) is int
            and type(hint[2]) is int
        ):
            raise violation(workload, "world_blocks", "returned no (Block, start, stop)", at)
    return hints


def _folder_digest(workload: Workload, folder: Path, at: str) -> str:
    try:
        return folder_digest(folder)
    except (WorkspaceContentError, OSError) as exc:
        what = f"left a workspace the runner cannot pin ({exc})"
        raise violation(workload, "step", what, at) from None


def _start(workload: Workload, seed: int, episode: int) -> tuple[State, Shocks]:
    """The episode's initial state, and the shocks its prefix draws from (no record of
    which: nothing compares a prefix's fingerprint)."""
    shocks = UntrackedShocks(seed, episode)
    try:
        state = workload.initial_state(seed + episode, shocks)
    except Exception as exc:
        raise from_exception(workload, exc, where(episode, None, 0)) from exc
    return state, shocks


class _Known:
    """What a batch has already worked out about the checkpoints it met, keyed by exact
    bytes (``marshal``: equal only for identical types and contents, so True is not 1,
    -0.0 is not 0.0, and key order counts):

    - ``features``: each distinct feature dict, checked against ``feature_types`` once
      and then shared by every episode that records an identical one;
    - ``states``: for up to ``keep`` distinct checkpoint states, the canonical text, its
      sha256, the state read back from it, whether it is flat and its checked features.
      All are functions of the state alone (``features`` only reads the state, the
      workload contract), so an identical state met again is neither encoded, hashed,
      parsed nor asked for its features again (it passed the JSON and feature checks when
      first met). Every episode still runs its prefix and every world in full.

    Each table counts its lookups and hits; ``review`` (after the batch's first
    ``PROBE_EPISODES``) stops keying a table that does not pay: where every episode's
    state is its own, a key is work that never saves any.
    """

    __slots__ = ("feature_hits", "feature_lookups", "features", "keep", "state_hits", "states")

    def __init__(self, keep: int) -> None:
        self.keep = keep
        self.features: dict[bytes, dict[str, Feature]] | None = {}
        self.states: dict[bytes, tuple[str, str, State, bool, dict[str, Feature]]] = {}
        self.state_hits = self.feature_hits = self.feature_lookups = 0

    def review(self, episodes: int) -> None:
        """Turn off what paid too little over the first ``episodes`` (one state lookup
        each; a feature lookup each when the feature dict could be keyed)."""
        if self.keep and not pays(self.state_hits, episodes):
            self.keep = 0
            self.states = {}
        if self.features is not None and not pays(self.feature_hits, self.feature_lookups):
            self.features = None


#: How many distinct checkpoint states a batch keeps (a few MB at most).
STATES_KEPT = 4096

#: Episodes a batch watches its caches (the memo, the checkpoint texts, the checked
#: feature dicts) over before it decides which of them pay; see ``pays``.
PROBE_EPISODES = 256


def pays(hits: int, lookups: int) -> bool:
    """Whether a cache that hit ``hits`` times in ``lookups`` pays for its keys: a hit
    saves a whole run (or encoding, or check) and a key costs a small part of one, so one
    hit in eight lookups is ample; none in many is a cache of distinct states."""
    return hits * 8 >= lookups


def _exact_key(value: Any) -> bytes | None:
    """``marshal`` bytes of ``value``, or None for what marshal cannot write (a subclass
    of a builtin type, an object): such values are simply never shared."""
    try:
        return marshal.dumps(value)
    except ValueError:
        return None


def _is_flat(text: str) -> bool:
    """Whether a canonical text is one JSON object of scalars: one ``{`` and no ``[`` (a
    brace inside a string only makes this False, which is always safe)."""
    return text.count("{") == 1 and "[" not in text


def _prefix_from(
    workload: Workload,
    seed: int,
    episode: int,
    state: State,
    shocks: Shocks,
    known: _Known,
) -> tuple[Checkpoint, bool, State, bool, bool]:
    """Step ``state`` to its boundary and check what the contract promises there (state
    is JSON, features as declared).

    Returns the checkpoint, whether the prefix drew randomness, the state read back from
    the checkpoint text (what the worlds fork from), whether that state is shared (kept
    in ``known``: the worlds must copy it, never change it) and whether it is flat.
    """
    requested, resolved, steps = _to_boundary(workload, episode, state, shocks)
    entry, shared = _checked_checkpoint(workload, episode, state, steps, known)
    text, digest, parsed, flat, features = entry
    checkpoint: Checkpoint = {
        "episode": episode,
        "requested": requested,
        "resolved": resolved,
        "sha256": digest,
        "state": text,
        "features": features,
    }
    return checkpoint, shocks.drawn, parsed, shared, flat


def _to_boundary(
    workload: Workload, episode: int, state: State, shocks: Shocks
) -> tuple[int, int, int]:
    """Step ``state`` to its boundary: (the cursor requested, the cursor reached, the steps
    taken); a run that ended or jumped elsewhere is a ``BoundaryMissingError``."""
    steps = 0
    try:
        requested = workload.boundary(state)
        cursor, done, step = workload.cursor, workload.done, workload.step
        while cursor(state) < requested and not done(state):
            steps += 1  # counted first, so a failing step reports its own number
            step(state, shocks)
        resolved = cursor(state)
        ended = resolved != requested and done(state)
    except Exception as exc:
        raise from_exception(workload, exc, where(episode, None, steps)) from exc
    if resolved != requested:
        raise BoundaryMissingError(
            f"{type(workload).__name__}.boundary() asked for cursor {requested} but the run "
            f"{'ended' if ended else 'jumped'} at {resolved}; boundary() is defined at "
            f"{method_place(workload, 'boundary')} ({where(episode, None, steps)})"
        )
    return requested, resolved, steps


#: What a batch works out once per distinct checkpoint state: its canonical text, the
#: text's sha256, the state read back from it, whether it is flat, its checked features.
_Entry = tuple[str, str, State, bool, dict[str, Feature]]


def _checked_checkpoint(
    workload: Workload, episode: int, state: State, steps: int, known: _Known
) -> tuple[_Entry, bool]:
    """The checkpoint of ``state`` (reached after ``steps`` prefix steps), checked: its
    text reads back equal and its features are as declared, worked out once per distinct
    state while ``known`` keeps them. Also whether the entry is shared (kept in
    ``known``: the worlds must copy its state, never change it)."""
    key = _exact_key(state) if known.keep else None
    entry = known.states.get(key) if key is not None else None
    if entry is not None:
        known.state_hits += 1
        return entry, True
    # The text is the checkpoint. Reading it back once both checks the contract (the
    # state is JSON that reads back equal) and gives the state the worlds fork from.
    try:
        text: str | None = canonical_json(state)
    except (TypeError, ValueError):
        text = None
    parsed = None if text is None else parse_canonical(text)
    if parsed is None or text is None or parsed != state:
        method = "step" if steps else "initial_state"
        check_state(workload, state, text, method, where(episode, None, steps))
    assert text is not None and parsed is not None  # check_state raised otherwise
    features = _checked_features(workload, state, known, episode, steps)
    entry = (text, sha256(text.encode()).hexdigest(), parsed, _is_flat(text), features)
    if key is not None and len(known.states) < known.keep:
        known.states[key] = entry
        return entry, True
    return entry, False


def _checked_features(
    workload: Workload, state: State, known: _Known, episode: int, steps: int
) -> dict[str, Feature]:
    """``features(state)`` at the checkpoint of ``episode`` (after ``steps`` prefix
    steps), checked against ``feature_types`` (once per distinct feature dict while
    ``known`` keeps them)."""
    try:
        found = workload.features(state)
    except Exception as exc:
        raise from_exception(workload, exc, where(episode, None, steps)) from exc
    table = known.features
    fkey = _exact_key(found) if table is not None and type(found) is dict else None
    if fkey is not None:
        assert table is not None
        known.feature_lookups += 1
        features = table.get(fkey)
        if features is not None:
            known.feature_hits += 1
            return features
    check_features(workload, found, feature_kinds(type(workload)), where(episode, None, steps))
    if fkey is not None:
        assert table is not None
        table[fkey] = found
    return found


class _Fork:
    """Hands out copies of one checkpoint's state, each equal to ``json.loads`` of it.

    The last copy asked for is the parsed state itself (unless it is ``shared``), so one
    world of an episode needs no copy at all. A ``flat`` state (see :func:`_is_flat`) is
    copied with ``dict.copy``, exact because its values are immutable; any other with
    ``marshal`` (a C copy of plain JSON values that keeps the sorted key order of the
    parse).
    """

    __slots__ = ("_blob", "_flat", "_left", "_own", "_state")

    def __init__(self, parsed: State, copies: int, shared: bool, flat: bool) -> None:
        self._state = parsed
        self._left = copies
        self._own = not shared
        self._flat = flat
        self._blob = marshal.dumps(parsed) if (copies > 1 or shared) and not flat else b""

    def take(self) -> State:
        self._left -= 1
        if self._left == 0 and self._own:
            return self._state
        if self._left < 0:
            raise RuntimeError("more copies taken than announced")
        if self._flat:
            return self._state.copy()
        state: State = marshal.loads(self._blob)
        return state


def world_params(workload: Workload, world: WorldPlan) -> dict[str, Any]:
    """What ``intervene`` receives: the intervention's declared defaults overlaid with the
    world's params."""
    name = world.intervention
    return {**workload.interventions.get(name, {}), **world.params} if name else {}


def _finish(
    workload: Workload,
    fork: _Fork,
    seed: int,
    episode: int,
    world: WorldPlan,
    params: dict[str, Any],
    prefix: Shocks,
    folders: FolderFork | None = None,
    tracked: bool = True,
) -> tuple[bool, bool, str, bool, int]:
    """Fork into ``world`` and finish it: (success, intervened, fingerprint, drew, forks
    run).

    With ``forks`` > 1 the world runs up to that many replicates from the same checkpoint
    (distinct agent streams) and the outcome is their majority vote, which stops forking
    once it is decided (``vote_decided``: the same outcome as every fork's vote), except
    in a workload with files, whose last fork leaves the world's files; the fingerprint
    is the first replicate's (the same whichever fork decided). ``folders`` hands
    each replicate its folder (workloads with a workspace). Every replicate shares the
    table of random words of ``prefix`` (the episode's prefix run, or a stand-in).
    Without ``tracked`` the world keeps no record of its draws and its fingerprint is
    ``UNCHECKED``.
    """
    votes = 0
    intervened = drawn = False
    fingerprint = ""
    forks = world.forks
    ran = 0
    for replicate in range(forks):
        state = fork.take()
        if folders is not None:
            workload.workspace = folders.take()
        ok, did, shocks = _replicate(
            workload, state, seed, episode, replicate, world, params, prefix, tracked
        )
        votes += ok
        intervened = intervened or did
        if not replicate:
            fingerprint = shocks.fingerprint()
        drawn = drawn or shocks.drawn
        ran += 1
        if forks > 1 and folders is None and vote_decided(votes, ran - votes, forks) is not None:
            break  # (a workload with files runs every fork: the last one leaves its files)
    return votes * 2 > forks, intervened, fingerprint, drawn, ran


def _replicate(
    workload: Workload,
    state: State,
    seed: int,
    episode: int,
    replicate: int,
    world: WorldPlan,
    params: dict[str, Any],
    prefix: Shocks,
    tracked: bool,
) -> tuple[bool, bool, Shocks]:
    """One replicate of ``world`` from ``state`` (its own copy) to the end: (success,
    intervened, the shocks it drew). A world of one fork is one replicate, which the
    twin's loop calls directly."""
    if tracked:
        shocks: Shocks = Shocks(seed, episode, replicate, source=prefix)
    else:
        shocks = UntrackedShocks(seed, episode, replicate, prefix)
    name = world.intervention
    intervened = False
    steps = 0
    try:
        workload.schedule_shocks(state, shocks)
        guard = world.guard
        if name is not None and (guard is None or rule_fires(guard, workload.features(state))):
            workload.intervene(state, name, params, shocks)
            intervened = True
        done, step, limit = workload.done, workload.step, workload.max_steps
        while not done(state):
            steps += 1  # counted first, so a failing step reports its own number
            if steps > limit:
                raise StuckWorldError(
                    f"{type(workload).__name__}.done() was still False after max_steps = "
                    f"{limit} steps at {method_place(workload, 'done')} "
                    f"({where(episode, world.name, steps)})"
                )
            step(state, shocks)
        ok = workload.outcome(state)
    except ContractViolation:
        raise
    except Exception as exc:
        raise from_exception(workload, exc, where(episode, world.name, steps)) from exc
    if ok is not True and ok is not False:
        check_outcome(workload, ok, where(episode, world.name, steps))
    return ok, intervened, shocks


def continue_world(
    workload: Workload,
    checkpoint: str,
    seed: int,
    episode: int,
    world: WorldPlan,
    folder: Path | None = None,
    own: bool = False,
) -> tuple[bool, bool, str, bool]:
    """Fork ``checkpoint`` (its canonical text) into ``world`` and finish it; see
    ``continue_state``."""
    state = parse_canonical(checkpoint)
    flat = _is_flat(checkpoint)
    return continue_state(workload, state, seed, episode, world, None, folder, own, flat)


def continue_state(
    workload: Workload,
    state: State,
    seed: int,
    episode: int,
    world: WorldPlan,
    draws: EpisodeDraws | None = None,
    folder: Path | None = None,
    own: bool = False,
    flat: bool = False,
) -> tuple[bool, bool, str, bool]:
    """Fork a checkpoint's ``state`` (read back from its text; the last replicate works
    on it) into ``world`` and finish it.

    A workload with a workspace continues from the episode's ``folder``: each replicate
    works in a copy of it, except that with ``own`` (the folder is this world's own
    copy-on-write view, as in a world's sandbox) the last one works in it directly.
    ``draws``: the episode's draw table to start from (e.g. with the block runs every
    world draws already worked out); ``flat``: the state holds scalars only (its copies
    are shallow). Returns (success, intervened, shock fingerprint, drew randomness).
    """
    fork = _Fork(state, world.forks, False, flat)
    params = world_params(workload, world)
    prefix = Shocks(seed, episode, draws=draws)  # holds the table the replicates share
    if not workload.has_workspace:
        return _finish(workload, fork, seed, episode, world, params, prefix)[:4]
    if folder is None:
        name = type(workload).__name__
        raise ValueError(f"{name} has a workspace: continuing it needs a folder")
    import tempfile
    from pathlib import Path

    folders = FolderFork(folder, world.forks, Path(tempfile.gettempdir()), own)
    try:
        return _finish(workload, fork, seed, episode, world, params, prefix, folders)[:4]
    finally:
        folders.close()


def continue_checkpoints(
    workload: Workload,
    seed: int,
    checkpoints: Iterable[Checkpoint],
    world: WorldPlan,
    root: Path | None = None,
    own: bool = False,
) -> WorldColumns:
    """Continue one world from many checkpoints.

    ``inherited`` is recomputed from the checkpoint text this world actually received
    and, for a workload with a workspace, from the files it found in ``root/<episode>``
    before it touched them (see ``continue_state`` for ``own``).
    """
    cols = empty_columns()
    for cp in checkpoints:
        episode = cp["episode"]
        folder = None if root is None else root / str(episode)
        files = None
        if workload.has_workspace:
            if folder is None or not folder.is_dir():
                raise ValueError(f"episode {episode} has no workspace folder under {root}")
            files = _folder_digest(workload, folder, where(episode, world.name, 0))
        ok, did, fp, _ = continue_world(workload, cp["state"], seed, episode, world, folder, own)
        cols["outcomes"].append(ok)
        cols["intervened"].append(did)
        cols["shocks"].append(fp)
        cols["inherited"].append(checkpoint_digest(sha256_hex(cp["state"]), files))
    return cols


def run_batch(
    workload: Workload,
    seed: int,
    episodes: Sequence[int],
    worlds: Sequence[WorldPlan],
    memo: bool = True,
    fingerprint_every: int = 1,
) -> Batch:
    """The local twin's inner loop: each prefix once, then every world from it.

    All the runs of one episode share one table of random words (each coordinate is
    hashed once per episode). With ``memo``, a prefix or continuation that drew no
    randomness is reused for every episode that reaches an identical state: it is a pure
    function of the state it started from (the workload contract: state, params and
    shock draws decide everything). Continuations that drew anything are always run.
    The memo pays only where states repeat: each of its two tables (prefixes by start
    state, continuations by checkpoint and world) counts its hits over the batch's first
    ``PROBE_EPISODES`` and turns itself off for the rest of the batch when it does not
    pay (``pays``), as do the checkpoint caches of ``_Known``. Turning a cache off changes
    no result, only what is worked out again. ``memo=False`` runs every episode in full
    (what the engine benchmark also reports). A workload with a workspace takes
    ``_run_batch_files`` (files are not memoised).

    ``fingerprint_every``: the worlds of episode ``e`` fingerprint their shocks when
    ``e`` is a multiple of it (every episode by default); in the others they keep no
    record of their draws and report ``UNCHECKED`` (``NO_SHOCKS`` if they drew nothing;
    either way the same in every world of a faithful workload, so the common-random-numbers
    check still compares every episode, and compares fingerprints in the others).
    """
    if workload.has_workspace:
        return _run_batch_files(workload, seed, episodes, worlds)
    # Only the columns are kept (never the checkpoint text), appended to as the episodes
    # run, and equal feature dicts are shared: memory per episode is a few pointers.
    # The columns are the caller's to read, not to change in place (lists are shared).
    requested: list[int] = []
    resolved: list[int] = []
    shas: list[str] = []
    features: list[dict[str, Feature]] = []
    known = _Known(STATES_KEPT)
    columns = [empty_columns() for _ in worlds]
    plans = [
        (
            index,
            world,
            world_params(workload, world),
            cols["outcomes"].append,
            cols["intervened"].append,
            cols["shocks"].append,
        )
        for index, (world, cols) in enumerate(zip(worlds, columns, strict=True))
    ]
    # copies[i]: how many states worlds i.. need (the count a fork made at world i hands out)
    copies = [sum(w.forks for w in worlds[i:]) for i in range(len(worlds))]
    # a reused prefix: its checkpoint's entry (``_Entry``; its state only when kept in
    # ``known``, else None: read back again, since the last world changes the state it is
    # given) and its requested and resolved cursors
    prefixes: dict[str, tuple[_Entry, bool, int, int]] | None = {} if memo else None
    continuations: dict[tuple[str, int], tuple[bool, bool, str]] | None = {} if memo else None
    prefix_hits = continuation_hits = continuation_lookups = 0
    saved = [0] * len(worlds)  # forks each world's decided votes did not run
    for count, episode in enumerate(episodes):
        if count == PROBE_EPISODES:  # the probe is over: keep only the caches that paid
            known.review(count)
            if prefixes is not None and not pays(prefix_hits, count):
                prefixes = None
            if continuations is not None and not pays(continuation_hits, continuation_lookups):
                continuations = None
        state, shocks = _start(workload, seed, episode)
        hit: tuple[_Entry, bool, int, int] | None = None
        if prefixes is not None:
            key = repr(state)  # exact for JSON values; only needs to be stable in-process
            hit = prefixes.get(key)
        if hit is None:
            at, to, steps = _to_boundary(workload, episode, state, shocks)
            entry, shared = _checked_checkpoint(workload, episode, state, steps, known)
            if prefixes is not None and not shocks.drawn:
                prefixes[key] = (entry, shared, at, to)
            text, sha, parsed, flat, feats = entry
        else:
            prefix_hits += 1
            entry, shared, at, to = hit
            text, sha, parsed, flat, feats = entry
            if not shared:
                parsed = parse_canonical(text)
        tracked = not episode % fingerprint_every
        requested.append(at)
        resolved.append(to)
        shas.append(sha)
        features.append(feats)
        fork: _Fork | None = None
        for index, world, params, add_outcome, add_intervened, add_shocks in plans:
            result = None
            if continuations is not None:
                continuation_lookups += 1
                result = continuations.get((sha, index))
            if result is None:
                if fork is None:
                    fork = _Fork(parsed, copies[index], shared, flat)
                if world.forks == 1:  # one replicate, no vote: called directly
                    ok, did, ran_shocks = _replicate(
                        workload, fork.take(), seed, episode, 0, world, params, shocks, tracked
                    )
                    fp, drawn = ran_shocks.fingerprint(), ran_shocks.drawn
                else:
                    ok, did, fp, drawn, ran = _finish(
                        workload, fork, seed, episode, world, params, shocks, None, tracked
                    )
                    saved[index] += world.forks - ran
                result = (ok, did, fp)
                if continuations is not None and not drawn:
                    continuations[(sha, index)] = result
            else:
                continuation_hits += 1
            add_outcome(result[0])
            add_intervened(result[1])
            add_shocks(result[2])
    for cols in columns:
        cols["inherited"] = shas  # one list for every world (the twin forks them all)
    return {
        "episodes": list(episodes),
        "requested": requested,
        "resolved": resolved,
        "checkpoints": shas,
        "features": features,
        "worlds": {world.name: cols for world, cols in zip(worlds, columns, strict=True)},
        "forks_saved": {w.name: n for w, n in zip(worlds, saved, strict=True) if w.forks > 1},
    }


def _run_batch_files(
    workload: Workload, seed: int, episodes: Sequence[int], worlds: Sequence[WorldPlan]
) -> Batch:
    """``run_batch`` for a workload with a workspace, in a temporary folder: each prefix
    once in its own folder, then every world replicate in a copy of it (the last one in
    the folder itself). The copies stand in for the overlay layers of the durable path;
    the checkpoint identities are the same, because they digest content only."""
    import shutil
    import tempfile
    from pathlib import Path

    batch: Batch = {
        "episodes": list(episodes),
        "requested": [],
        "resolved": [],
        "checkpoints": [],
        "features": [],
        "worlds": {world.name: empty_columns() for world in worlds},
    }
    params = [world_params(workload, world) for world in worlds]
    total = sum(w.forks for w in worlds)
    scratch = Path(tempfile.mkdtemp(prefix="forklab-files-"))
    try:
        for episode in episodes:
            folder = scratch / "prefix"
            shutil.rmtree(folder, ignore_errors=True)
            cp = run_prefix(workload, seed, episode, folder)
            identity = checkpoint_id(cp)
            batch["requested"].append(cp["requested"])
            batch["resolved"].append(cp["resolved"])
            batch["checkpoints"].append(identity)
            batch["features"].append(cp["features"])
            fork = _Fork(parse_canonical(cp["state"]), total, False, _is_flat(cp["state"]))
            folders = FolderFork(folder, total, scratch, own=True)
            prefix = Shocks(seed, episode)  # holds the table the replicates share
            try:
                for world, plan_params in zip(worlds, params, strict=True):
                    ok, did, fp, _, _ = _finish(
                        workload, fork, seed, episode, world, plan_params, prefix, folders
                    )
                    cols = batch["worlds"][world.name]
                    cols["outcomes"].append(ok)
                    cols["intervened"].append(did)
                    cols["shocks"].append(fp)
                    cols["inherited"].append(identity)
            finally:
                folders.close()
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
        workload.workspace = None
    return batch


def write_prefixes(
    workload: Workload,
    seed: int,
    episodes: Sequence[int],
    root: Path | None,
    checkpoints: str,
) -> None:
    """The prefix of every episode in ``episodes``: its checkpoint line to the file
    ``checkpoints``. The prefix sandbox's runner and the rehearsal that hands its
    prefixes over both write through here: the same checkpoint bytes."""
    with open(checkpoints, "w", encoding="utf-8") as fh:
        for episode in episodes:
            folder = None if root is None else root / str(episode)
            fh.write(checkpoint_line(run_prefix(workload, seed, episode, folder)))
