"""The twin's batched episode path: a chunk of episodes of one world at once, in numpy.

A workload opts in with its batch methods (``Workload.batch_ok`` and the ``batch_*``
methods, docs/workloads.md): the same run as its scalar methods, over columns (one array
per state field, one entry per episode). Every episode is still simulated, its prefix
and every world (each replicate of a majority vote too): the columns go through the
prefix in step, then each world gets its own copy of the boundary columns.

What the engine adds is bookkeeping per *distinct* boundary state, never a shortcut in
the simulation: the checkpoint text, its sha256, the read-back check and ``features``
are functions of the state alone, so they are worked out once per distinct row of the
boundary columns (grouped exactly: equal bits in every column) and every episode of the
group gets them — as the scalar runner keeps them per distinct ``marshal`` key. With the
memo on, a world also runs once per distinct boundary state (a batched run draws no
randomness, the condition under which the scalar runner reuses a continuation).

The batch methods are the workload's claim that they match its scalar methods; the
durable path runs only the scalar ones. So the batched result is only trusted as far as
it can be checked: ``SPOT_EPISODES`` episodes of every chunk are also run by the scalar
runner and compared column by column, and anything the batch path cannot vouch for (a
batch method raised, returned a column of the wrong shape or type, an episode missed its
boundary or a world its ``max_steps``, a state that is not JSON) reruns the chunk on the
scalar runner: its error, if it has one, is the error; if it has none, the batch methods
disagree with the scalar ones and the run stops, saying so. A batch method gets only its
own columns, params and masks — no shocks table, no other world's results, nothing of
the engine — so it can do nothing its scalar twin could not.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from forklab.experiments.experiment.columnar import (
    Bools,
    ColumnBatch,
    Columns,
    FeatureRows,
    Ints,
    StrColumn,
    _feature_key,
    _Table,
    to_columns,
)
from forklab.runtime.canon import canonical_json, parse_canonical, sha256_hex
from forklab.runtime.contract import (
    ContractViolation,
    check_features,
    feature_kinds,
    from_exception,
)
from forklab.runtime.crn import NO_SHOCKS
from forklab.runtime.file_format import WorldPlan
from forklab.runtime.runner import (
    continue_world,
    rule_fires,
    run_batch,
    run_prefix,
    world_params,
)
from forklab.runtime.vote import vote_decided
from forklab.runtime.workload import Workload

#: Episodes of every batched chunk that the scalar runner also runs, as a check.
SPOT_EPISODES = 8

#: The workload methods a batch stands for: a subclass overriding one of them below the
#: class that defines ``batch_ok`` has batch methods that no longer describe it.
_METHODS = (
    "initial_state",
    "boundary",
    "cursor",
    "step",
    "done",
    "outcome",
    "features",
    "intervene",
    "schedule_shocks",
    "batch_initial",
    "batch_boundary",
    "batch_cursor",
    "batch_done",
    "batch_step",
    "batch_intervene",
    "batch_outcome",
    "batch_state",
)

Cols = dict[str, npt.NDArray[Any]]


class _Unsure(Exception):
    """The batch path cannot vouch for this chunk; the scalar runner decides."""


def _owner(cls: type, method: str) -> type:
    return next(c for c in cls.__mro__ if method in vars(c))


def batchable(workload: Workload) -> bool:
    """Whether the twin may run ``workload`` batched: its class (or a base) defines the
    batch methods, no workload method is overridden below the class that defines
    ``batch_ok``, it keeps no files, and ``batch_ok()`` says yes for its params."""
    cls = type(workload)
    owner = _owner(cls, "batch_ok")
    if owner is Workload or cls.has_workspace:
        return False
    if any(_owner(cls, m) not in owner.__mro__ for m in _METHODS):
        return False
    try:
        return workload.batch_ok() is True
    except Exception as exc:
        raise from_exception(workload, exc, "batch_ok") from exc


def run_columns(
    workload: Workload,
    seed: int,
    episodes: Sequence[int],
    worlds: Sequence[WorldPlan],
    memo: bool = False,
) -> ColumnBatch:
    """``to_columns(run_batch(...))`` of a ``batchable`` workload, batched: the same
    columns, value for value and table for table."""
    if not episodes:
        return to_columns(run_batch(workload, seed, episodes, worlds, memo))
    try:
        batch = _run(workload, seed, episodes, worlds, memo)
    except Exception as exc:
        why = (
            exc
            if isinstance(exc, _Unsure | ContractViolation)
            else from_exception(workload, exc, "batched")
        )
        # The scalar runner's error, if it has one, is the error (its sentence names the
        # episode, world and step); if it has none, the batch methods are wrong.
        run_batch(workload, seed, episodes, worlds, memo)
        raise _disagree(
            workload, f"the batched run stopped ({why}), the scalar one did not"
        ) from exc
    _spot_check(workload, seed, episodes, worlds, batch)
    return batch


def _disagree(workload: Workload, what: str) -> ContractViolation:
    name = type(workload).__name__
    return ContractViolation(
        f"{name}'s batch methods disagree with its scalar methods: {what}; the durable path "
        f"runs the scalar ones (fix the batch methods, or return False from "
        f"{name}.batch_ok())"
    )


def _column(value: Any, n: int, kinds: str, method: str) -> npt.NDArray[Any]:
    """``value`` as a one-dimensional array of ``n`` entries of a dtype kind in ``kinds``
    (``b`` bool, ``i``/``u`` int, ``f`` float); one Python value stands for every episode."""
    array: npt.NDArray[Any] = np.asarray(value)
    if array.ndim == 0:
        array = np.full(n, array)
    if array.ndim != 1 or len(array) != n or array.dtype.kind not in kinds:
        raise _Unsure(
            f"{method}() gave {array.dtype} of shape {array.shape}, not {n} entries of "
            f"kind {kinds!r}"
        )
    return array


def _start(workload: Workload, seed: int, episodes: Sequence[int]) -> Cols:
    n = len(episodes)
    seeds = (
        range(seed + episodes.start, seed + episodes.stop, episodes.step)
        if isinstance(episodes, range)
        else [seed + e for e in episodes]
    )
    found = workload.batch_initial(seeds)
    if not isinstance(found, Mapping) or not all(isinstance(k, str) for k in found):
        raise _Unsure("batch_initial() did not return a mapping of field names")
    # Copies: a field must be its own writable array (np.full, np.asarray of a list are).
    return {k: np.array(_column(v, n, "biuf", "batch_initial")) for k, v in found.items()}


def _checked(cols: Cols, n: int, method: str) -> Cols:
    """The workload's columns after ``method``: still fields of ``n`` numbers each."""
    if not isinstance(cols, dict) or not all(isinstance(k, str) for k in cols):
        raise _Unsure(f"{method}() left something other than a dict of fields")
    return {k: _column(v, n, "biuf", method) for k, v in cols.items()}


def _digits(column: npt.NDArray[Any]) -> tuple[Ints, int]:
    """Each entry's code in ``[0, size)``, equal exactly when the entries' bits are."""
    if column.dtype.kind == "b":
        return column.astype(np.int64), 2
    if column.dtype.kind in "iu":
        lo, hi = int(column.min()), int(column.max())
        if hi - lo < 1 << 31:
            return (column - lo).astype(np.int64), hi - lo + 1
    bits = column.astype(np.float64).view(np.int64) if column.dtype.kind == "f" else column
    values, codes = np.unique(bits, return_inverse=True)
    return codes.astype(np.int64), len(values)


def _groups(cols: Cols, n: int) -> tuple[npt.NDArray[np.intp], npt.NDArray[np.intp]]:
    """The distinct rows of ``cols``: each episode's group (groups numbered in order of
    first appearance) and the first episode of each group."""
    key = np.zeros(n, dtype=np.int64)
    span = 1
    for name in sorted(cols):
        digits, size = _digits(cols[name])
        if span * size >= 1 << 62:  # compact the key so far to its distinct values
            values, key = np.unique(key, return_inverse=True)
            span = len(values)
        key = key * size + digits
        span *= size
    _, first, inverse = np.unique(key, return_index=True, return_inverse=True)
    order = np.argsort(first, kind="stable")
    rank = np.empty(len(order), dtype=np.intp)
    rank[order] = np.arange(len(order))
    return rank[inverse.ravel()], first[order]


def _run(
    workload: Workload, seed: int, episodes: Sequence[int], worlds: Sequence[WorldPlan], memo: bool
) -> ColumnBatch:
    n = len(episodes)
    cols = _start(workload, seed, episodes)
    requested = _column(workload.batch_boundary(cols), n, "iu", "batch_boundary").astype(np.int64)

    def cursor(c: Cols) -> Ints:
        return _column(workload.batch_cursor(c), n, "iu", "batch_cursor").astype(np.int64)

    def done(c: Cols) -> Bools:
        return _column(workload.batch_done(c), n, "b", "batch_done").copy()

    # The prefix, as the runner's loop: step while below the boundary and not done.
    position = cursor(cols)
    active = (position < requested) & ~done(cols)
    # A cursor grows by at least one a step, so no episode needs more steps than this.
    limit = int((requested - position).max(initial=0))
    steps = 0
    while active.any():
        steps += 1
        if steps > limit:
            raise _Unsure(f"an episode's cursor did not reach its boundary in {limit} steps")
        workload.batch_step(cols, active.copy())
        active &= (cursor(cols) < requested) & ~done(cols)
    resolved = cursor(cols)
    if not np.array_equal(resolved, requested):
        raise _Unsure("an episode ended or jumped past its boundary")
    cols = _checked(cols, n, "batch_step")

    # Per distinct boundary state: the checkpoint text, its sha256, the read-back check
    # and the features (functions of the state alone), as the scalar runner keeps them.
    group, firsts = _groups(cols, n)
    kinds = feature_kinds(type(workload))
    shas, rows = _Table(), _Table()
    sha_of: list[int] = []
    row_of: list[int] = []
    for index in firsts.tolist():
        state = workload.batch_state(cols, index)
        text = canonical_json(state)
        if parse_canonical(text) != state:
            raise _Unsure("batch_state() gave a state that does not read back equal from JSON")
        features = workload.features(state)
        check_features(workload, features, kinds, "batched")
        sha_of.append(int(shas.codes([sha256_hex(text)])[0]))
        row_of.append(int(rows.codes([_feature_key(features)], [dict(features)])[0]))
    checkpoints = StrColumn(np.asarray(sha_of, dtype=np.uint32)[group], shas.values)
    feature_rows = FeatureRows(np.asarray(row_of, dtype=np.uint32)[group], rows.values)

    # With the memo, each world runs once per distinct boundary state (a batched run
    # draws nothing); without it, once per episode.
    base = {k: v[firsts] for k, v in cols.items()} if memo else cols
    size = len(firsts) if memo else n
    spread = group if memo else slice(None)
    row_codes = feature_rows.codes[firsts] if memo else feature_rows.codes
    no_shocks = StrColumn(np.zeros(n, dtype=np.uint32), [NO_SHOCKS])
    out: dict[str, Columns] = {}
    saved = {w.name: 0 for w in worlds if w.forks > 1}
    for world in worlds:
        where = _fires(world, feature_rows.rows, row_codes, size)
        votes = np.zeros(size, dtype=np.int64)
        forks = world.forks
        for ran in range(1, forks + 1):
            state = {k: v.copy() for k, v in base.items()}
            votes += _finish(workload, state, world, world_params(workload, world), where, size)
            tallies = set(votes.tolist())  # at most forks + 1 distinct counts of successes
            if forks > 1 and all(vote_decided(v, ran - v, forks) is not None for v in tallies):
                saved[world.name] = (forks - ran) * n  # every episode's vote was decided
                break
        out[world.name] = {
            "outcomes": (votes * 2 > world.forks)[spread],
            "intervened": where[spread],
            "shocks": no_shocks,
            "inherited": checkpoints,
        }
    batch: ColumnBatch = {
        "episodes": np.asarray(episodes, dtype=np.int64),
        "requested": requested,
        "resolved": resolved,
        "checkpoints": checkpoints,
        "features": feature_rows,
        "worlds": out,
    }
    if saved:
        batch["forks_saved"] = saved
    return batch


def _fires(
    world: WorldPlan, rows: list[dict[str, Any]], codes: npt.NDArray[np.uint32], size: int
) -> Bools:
    """Where ``world`` intervenes: everywhere, nowhere, or where its guard rule fires on
    the episode's features (decided once per distinct features row)."""
    if world.intervention is None:
        return np.zeros(size, dtype=np.bool_)
    if world.guard is None:
        return np.ones(size, dtype=np.bool_)
    guard = world.guard
    by_row = np.fromiter((rule_fires(guard, row) for row in rows), dtype=np.bool_, count=len(rows))
    fired: Bools = by_row[codes]
    return fired


def _finish(
    workload: Workload,
    cols: Cols,
    world: WorldPlan,
    params: dict[str, Any],
    where: Bools,
    n: int,
) -> Ints:
    """One replicate of ``world`` from the boundary columns: 1 where it succeeded."""
    if world.intervention is not None and where.any():
        workload.batch_intervene(cols, world.intervention, params, where.copy())
    active = ~_column(workload.batch_done(cols), n, "b", "batch_done")
    steps = 0
    while active.any():
        steps += 1
        if steps > workload.max_steps:
            raise _Unsure(f"a world was still not done after max_steps = {workload.max_steps}")
        workload.batch_step(cols, active.copy())
        active &= ~_column(workload.batch_done(cols), n, "b", "batch_done")
    outcome = _column(workload.batch_outcome(cols), n, "b", "batch_outcome")
    return outcome.astype(np.int64)


def _spot_check(
    workload: Workload,
    seed: int,
    episodes: Sequence[int],
    worlds: Sequence[WorldPlan],
    batch: ColumnBatch,
) -> None:
    """Run ``SPOT_EPISODES`` episodes (spread over the chunk) through the scalar runner's
    own functions — what a sandbox runs — and compare every column."""
    n = len(episodes)
    picks = sorted({round(i * (n - 1) / max(1, SPOT_EPISODES - 1)) for i in range(SPOT_EPISODES)})
    for i in picks:
        episode = episodes[i]
        cp = run_prefix(workload, seed, episode)
        expected: list[tuple[str, Any, Any]] = [
            ("requested", cp["requested"], int(batch["requested"][i])),
            ("resolved", cp["resolved"], int(batch["resolved"][i])),
            ("checkpoint sha256", cp["sha256"], batch["checkpoints"][i]),
            ("features", _feature_key(cp["features"]), _feature_key(batch["features"][i])),
        ]
        for world in worlds:
            ok, did, fingerprint, _ = continue_world(workload, cp["state"], seed, episode, world)
            cols = batch["worlds"][world.name]
            expected += [
                (f"world {world.name} outcome", ok, bool(cols["outcomes"][i])),
                (f"world {world.name} intervened", did, bool(cols["intervened"][i])),
                (f"world {world.name} shocks", fingerprint, cols["shocks"][i]),
            ]
        for what, scalar, batched in expected:
            if scalar != batched:
                raise _disagree(
                    workload,
                    f"episode {episode}'s {what} is {batched!r} batched but {scalar!r} by the "
                    "scalar methods",
                )
