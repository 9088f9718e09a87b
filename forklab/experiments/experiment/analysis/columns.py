"""Per-episode data as columns: outcome arrays and coded feature columns.

The analysis counts millions of episodes. Outcomes become numpy boolean arrays and every
feature becomes one column of small integer codes into its distinct values (built in one
pass), so that a slice, a 2×2 table or an interaction is a ``bincount`` rather than a
Python loop over episodes.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from forklab.experiments.experiment.columnar import Bools, FeatureRows, as_features, bools
from forklab.runtime.workload import Feature

#: The value of a feature an episode did not record (counted in no slice).
MISSING: Any = object()
Codes = npt.NDArray[np.intp]


def as_bools(values: Sequence[bool] | Bools) -> Bools:
    """A boolean array of ``values`` (itself when it already is one)."""
    return bools(values)


def pair_kinds(reference: Sequence[bool] | Bools, world: Sequence[bool] | Bools) -> Codes:
    """Per episode the cell of the paired table: 0 = n11, 1 = n10 (harm), 2 = n01 (rescue),
    3 = n00 — the order of ``PairedTable``'s fields."""
    ref, w = as_bools(reference), as_bools(world)
    if ref.shape != w.shape:
        raise ValueError(f"paired columns differ in length: {ref.shape[0]} and {w.shape[0]}")
    kinds: Codes = (~ref).astype(np.intp) * 2 + (~w).astype(np.intp)
    return kinds


class FeatureColumn:
    """One feature over the episodes: its distinct values and each episode's code.

    Values that compare equal (``True`` and ``1``) share a code, as they share a slice.
    """

    __slots__ = ("codes", "name", "values")

    def __init__(self, name: str, values: list[Feature], codes: Codes) -> None:
        self.name = name
        self.values = values
        self.codes = codes

    @property
    def numeric(self) -> bool:
        return all(
            isinstance(v, int | float) and not isinstance(v, bool)
            for v in self.values
            if v is not MISSING
        )

    def floats(self) -> npt.NDArray[np.float64]:
        """Every episode's value as a float (numeric features only)."""
        table: npt.NDArray[np.float64] = np.asarray(self.values, dtype=np.float64)
        return table[self.codes]


class FeatureColumns(Mapping[str, FeatureColumn]):
    """Every recorded feature as a column, built once per analysis."""

    def __init__(self, features: FeatureRows | Sequence[Mapping[str, Feature]]) -> None:
        # Coded once per distinct features dict (the rows), then spread to the episodes.
        table = as_features(features)
        self.episodes = len(table)
        rows = table.rows
        names = sorted({name for f in rows for name in f})
        self._columns: dict[str, FeatureColumn] = {}
        for name in names:
            index: dict[Feature, int] = {}
            values: list[Feature] = []
            row_codes = np.empty(len(rows), dtype=np.intp)
            for i, f in enumerate(rows):
                value = f.get(name, MISSING)
                code = index.get(value)
                if code is None:
                    code = index[value] = len(values)
                    values.append(value)
                row_codes[i] = code
            self._columns[name] = FeatureColumn(name, values, row_codes[table.codes])

    def __getitem__(self, name: str) -> FeatureColumn:
        return self._columns[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._columns)

    def __len__(self) -> int:
        return len(self._columns)


def feature_columns(
    features: FeatureRows | Sequence[Mapping[str, Feature]] | FeatureColumns,
) -> FeatureColumns:
    return features if isinstance(features, FeatureColumns) else FeatureColumns(features)
