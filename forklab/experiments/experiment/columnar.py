"""Per-episode columns as arrays, from the runner's lists to the analysis.

The runner (standard library only, it ships in every sandbox) returns a chunk of
episodes as Python lists. Millions of episodes must not stay in that form: a list of
``bool`` costs 8 bytes an entry, a list of fingerprint strings ~80. Each chunk is turned
into columns as soon as it is produced (in the process that ran it), and the chunks are
merged column by column:

- outcomes and intervened: numpy ``bool`` arrays (1 byte an episode);
- episodes, requested, resolved: ``int64`` arrays;
- checkpoints, inherited, shocks: :class:`StrColumn`, dictionary-coded strings (a
  ``uint32`` code an episode into the distinct values; the worlds of a batch share one
  table, so the CRN and checkpoint checks compare codes);
- features: :class:`FeatureRows`, the distinct feature dicts and a code an episode (a
  workload records a few distinct pre-decision states, not one per episode).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any, NotRequired, TypedDict, cast, overload

import numpy as np
import numpy.typing as npt

from forklab.runtime.file_format import Batch, WorldColumns
from forklab.runtime.workload import Feature

Bools = npt.NDArray[np.bool_]
Ints = npt.NDArray[np.int64]
Codes = npt.NDArray[np.uint32]


class _Table:
    """Distinct values in order of first appearance, each with its code."""

    __slots__ = ("index", "values")

    def __init__(self) -> None:
        self.index: dict[Any, int] = {}
        self.values: list[Any] = []

    def codes(self, keys: Iterable[Any], values: Iterable[Any] | None = None) -> Codes:
        """The code of every key (new keys get the next code; their value is the key, or
        the matching entry of ``values``)."""
        index, table = self.index, self.values
        if values is None:

            def code(key: Any) -> int:
                found = index.get(key)
                if found is None:
                    found = index[key] = len(table)
                    table.append(key)
                return found

            return np.fromiter(map(code, keys), dtype=np.uint32)

        def code_of(key: Any, value: Any) -> int:
            found = index.get(key)
            if found is None:
                found = index[key] = len(table)
                table.append(value)
            return found

        return np.fromiter(map(code_of, keys, values), dtype=np.uint32)


class StrColumn:
    """A column of strings: each entry's code into ``values`` (distinct, in order of first
    appearance). Compares equal to another column (or a list) holding the same strings."""

    __slots__ = ("codes", "values")

    def __init__(self, codes: Codes, values: list[str]) -> None:
        self.codes = codes
        self.values = values

    @classmethod
    def of(cls, strings: Iterable[str]) -> StrColumn:
        table = _Table()
        return cls(table.codes(strings), table.values)

    def __len__(self) -> int:
        return len(self.codes)

    @overload
    def __getitem__(self, i: int) -> str: ...
    @overload
    def __getitem__(self, i: slice) -> StrColumn: ...
    def __getitem__(self, i: int | slice) -> str | StrColumn:
        if isinstance(i, slice):
            return StrColumn(self.codes[i], self.values)
        return self.values[int(self.codes[i])]

    def __iter__(self) -> Iterator[str]:
        values = self.values
        return (values[c] for c in self.codes.tolist())

    def tolist(self) -> list[str]:
        return list(self)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, list):
            return self.tolist() == other
        if not isinstance(other, StrColumn):
            return NotImplemented
        if len(self) != len(other):
            return False
        if self.values is other.values or self.values == other.values:
            return bool(np.array_equal(self.codes, other.codes))
        # Other tables: translate this column's codes into the other's (unknown → -1).
        where = {v: i for i, v in enumerate(other.values)}
        into = np.fromiter(
            (where.get(v, -1) for v in self.values), dtype=np.int64, count=len(self.values)
        )
        return bool(np.array_equal(into[self.codes], other.codes))

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"StrColumn({len(self)} entries, {len(self.values)} distinct)"


def _feature_key(features: Mapping[str, Feature]) -> str:
    """Equal dicts share a row, but ``True`` and ``1`` (or ``-0.0`` and ``0.0``) do not: the
    report shows the value recorded, and ``repr`` tells them apart where ``==`` does not."""
    return repr(features)


class FeatureRows:
    """Every episode's pre-decision features: the distinct dicts (``rows``, in order of
    first appearance) and each episode's row (``codes``)."""

    __slots__ = ("codes", "rows")

    def __init__(self, codes: Codes, rows: list[dict[str, Feature]]) -> None:
        self.codes = codes
        self.rows = rows

    @classmethod
    def of(cls, features: Iterable[Mapping[str, Feature]]) -> FeatureRows:
        """Rows of a list of dicts; the runner shares equal dicts, so most are seen by id."""
        table = _Table()
        index, rows = table.index, table.values
        by_id: dict[int, int] = {}
        keep: list[Mapping[str, Feature]] = []  # keeps ids valid while coding

        def code(f: Mapping[str, Feature]) -> int:
            found = by_id.get(id(f))
            if found is None:
                keep.append(f)
                key = _feature_key(f)
                found = index.get(key)
                if found is None:  # (where every episode has its own row, most are new)
                    found = index[key] = len(rows)
                    rows.append(dict(f))
                by_id[id(f)] = found
            return found

        codes = np.fromiter(map(code, features), dtype=np.uint32)
        return cls(codes, table.values)

    def counts(self) -> npt.NDArray[np.intp]:
        """How many episodes stand in each row."""
        counts: npt.NDArray[np.intp] = np.bincount(self.codes, minlength=len(self.rows))
        return counts

    def __len__(self) -> int:
        return len(self.codes)

    @overload
    def __getitem__(self, i: int) -> dict[str, Feature]: ...
    @overload
    def __getitem__(self, i: slice) -> FeatureRows: ...
    def __getitem__(self, i: int | slice) -> dict[str, Feature] | FeatureRows:
        if isinstance(i, slice):
            return FeatureRows(self.codes[i], self.rows)
        return self.rows[int(self.codes[i])]

    def __iter__(self) -> Iterator[dict[str, Feature]]:
        rows = self.rows
        return (rows[c] for c in self.codes.tolist())

    def __eq__(self, other: object) -> bool:
        if isinstance(other, FeatureRows | list):
            return len(self) == len(other) and all(
                _feature_key(a) == _feature_key(b) for a, b in zip(self, other, strict=True)
            )
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"FeatureRows({len(self)} episodes, {len(self.rows)} distinct)"


def as_features(features: FeatureRows | Iterable[Mapping[str, Feature]]) -> FeatureRows:
    return features if isinstance(features, FeatureRows) else FeatureRows.of(features)


class Columns(TypedDict):
    """One world's columns over a run of episodes (``WorldColumns`` as arrays)."""

    outcomes: Bools
    intervened: Bools
    shocks: StrColumn
    inherited: StrColumn


class ColumnBatch(TypedDict):
    """The twin's result for a run of episodes (``Batch`` as arrays), in episode order."""

    episodes: Ints
    requested: Ints
    resolved: Ints
    checkpoints: StrColumn
    features: FeatureRows
    worlds: dict[str, Columns]
    #: forks each world's decided majority votes did not run (``Batch``)
    forks_saved: NotRequired[dict[str, int]]


def bools(values: Sequence[bool] | Bools) -> Bools:
    """A boolean array of ``values`` (itself when it already is one)."""
    if isinstance(values, np.ndarray) and values.dtype == np.bool_:
        return values
    return np.fromiter(values, dtype=np.bool_, count=len(values))


def ints(values: Sequence[int] | Ints) -> Ints:
    return np.asarray(values, dtype=np.int64)


def to_columns(batch: Batch) -> ColumnBatch:
    """The runner's lists as columns. The worlds share one table of checkpoint digests
    (``inherited`` that *is* the checkpoint list stays one object) and one of shocks."""
    shas, shocks = _Table(), _Table()
    checkpoint_codes = shas.codes(batch["checkpoints"])
    checkpoints = StrColumn(checkpoint_codes, shas.values)
    worlds: dict[str, Columns] = {}
    for name, cols in batch["worlds"].items():
        inherited = (
            checkpoints
            if cols["inherited"] is batch["checkpoints"]
            else StrColumn(shas.codes(cols["inherited"]), shas.values)
        )
        worlds[name] = {
            "outcomes": bools(cols["outcomes"]),
            "intervened": bools(cols["intervened"]),
            "shocks": StrColumn(shocks.codes(cols["shocks"]), shocks.values),
            "inherited": inherited,
        }
    columns: ColumnBatch = {
        "episodes": ints(batch["episodes"]),
        "requested": ints(batch["requested"]),
        "resolved": ints(batch["resolved"]),
        "checkpoints": checkpoints,
        "features": FeatureRows.of(batch["features"]),
        "worlds": worlds,
    }
    if "forks_saved" in batch:
        columns["forks_saved"] = dict(batch["forks_saved"])
    return columns


class _Recode:
    """Merges string columns of many chunks into one table, each chunk's table once."""

    def __init__(self) -> None:
        self.table = _Table()
        self._maps: dict[int, tuple[list[str], Codes]] = {}

    def codes(self, column: StrColumn) -> Codes:
        found = self._maps.get(id(column.values))
        if found is None or found[0] is not column.values:
            found = (column.values, self.table.codes(column.values))
            self._maps[id(column.values)] = found
        recoded: Codes = found[1][column.codes]
        return recoded


def concat_strings(parts: Sequence[StrColumn]) -> StrColumn:
    """One string column of many, in the order given (one table of their distinct values)."""
    recode = _Recode()
    codes = [recode.codes(p) for p in parts]
    return StrColumn(
        np.concatenate(codes) if codes else np.zeros(0, np.uint32), recode.table.values
    )


def merge_columns(parts: Sequence[ColumnBatch]) -> ColumnBatch:
    """Concatenate column batches of consecutive episode ranges, in the order given."""
    if len(parts) == 1:
        return parts[0]
    shas, shocks, rows = _Recode(), _Recode(), _Table()
    checkpoint_codes = np.concatenate([shas.codes(p["checkpoints"]) for p in parts])
    feature_codes = np.concatenate(
        [
            rows.codes(map(_feature_key, p["features"].rows), p["features"].rows)[
                p["features"].codes
            ]
            for p in parts
        ]
    )
    checkpoints = StrColumn(checkpoint_codes, shas.table.values)
    worlds: dict[str, Columns] = {}
    for name in parts[0]["worlds"]:
        cols = [p["worlds"][name] for p in parts]
        same = all(c["inherited"] is p["checkpoints"] for c, p in zip(cols, parts, strict=True))
        worlds[name] = {
            "outcomes": np.concatenate([c["outcomes"] for c in cols]),
            "intervened": np.concatenate([c["intervened"] for c in cols]),
            "shocks": StrColumn(
                np.concatenate([shocks.codes(c["shocks"]) for c in cols]), shocks.table.values
            ),
            "inherited": checkpoints
            if same
            else StrColumn(
                np.concatenate([shas.codes(c["inherited"]) for c in cols]), shas.table.values
            ),
        }
    merged: ColumnBatch = {
        "episodes": np.concatenate([p["episodes"] for p in parts]),
        "requested": np.concatenate([p["requested"] for p in parts]),
        "resolved": np.concatenate([p["resolved"] for p in parts]),
        "checkpoints": checkpoints,
        "features": FeatureRows(feature_codes, rows.values),
        "worlds": worlds,
    }
    saved = [p["forks_saved"] for p in parts if "forks_saved" in p]
    if saved:
        merged["forks_saved"] = {k: sum(s.get(k, 0) for s in saved) for k in saved[0]}
    return merged


def to_lists(batch: ColumnBatch) -> Batch:
    """The runner's list form of a column batch (to compare with a plain reference)."""
    worlds: dict[str, WorldColumns] = {
        name: {
            "outcomes": cols["outcomes"].tolist(),
            "intervened": cols["intervened"].tolist(),
            "shocks": cols["shocks"].tolist(),
            "inherited": cols["inherited"].tolist(),
        }
        for name, cols in batch["worlds"].items()
    }
    lists: Batch = {
        "episodes": cast(list[int], batch["episodes"].tolist()),
        "requested": cast(list[int], batch["requested"].tolist()),
        "resolved": cast(list[int], batch["resolved"].tolist()),
        "checkpoints": batch["checkpoints"].tolist(),
        "features": list(batch["features"]),
        "worlds": worlds,
    }
    if "forks_saved" in batch:
        lists["forks_saved"] = dict(batch["forks_saved"])
    return lists
