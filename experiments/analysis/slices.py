"""Slices: the paired effect within groups of episodes that share a pre-decision feature.

Categorical features (booleans, strings) slice by value. Numeric features are binned
into quantiles of the values seen at the boundary, and each bin is a half-open range
``[lo, hi)`` whose outer ends are open, so that a value never seen in training still
falls into a bin. Every slice carries the guard-rule clause that selects exactly its
episodes (the runner's ``{"eq": v}`` / ``{"ge": lo, "lt": hi}`` matchers), so a guard
policy learned from slices is the same object the runner executes.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from pydantic import BaseModel

from experiments.analysis.columns import (
    Bools,
    Codes,
    FeatureColumn,
    FeatureColumns,
    feature_columns,
    pair_kinds,
)
from experiments.analysis.pairs import CONFIDENCE, PairedTable, paired_effect
from experiments.runtime.workload import Feature
from experiments.stats import bin_bounds, bin_label, quantile_edges

#: A clause of the runner's guard rule: feature → matcher; all matchers must hold.
Clause = dict[str, dict[str, Feature]]


class SliceEffect(BaseModel):
    feature: str
    value: Feature
    rescue: int
    harm: int
    unchanged: int
    net: int
    n: int
    difference: float
    ci_low: float
    ci_high: float
    clause: Clause


@dataclass(frozen=True)
class Dimension:
    """How one feature is sliced: by value, or by quantile bin edges."""

    name: str
    edges: tuple[float, ...] | None = None

    def cell(self, value: Feature) -> tuple[tuple[int, float, str], Feature, dict[str, Any]]:
        """(sort key, shown value, matcher) of the slice that holds ``value``."""
        if self.edges is None:
            return _order(value), value, {"eq": value}
        lo, hi = bin_bounds(float(value), self.edges)
        matcher: dict[str, Any] = {}
        if math.isfinite(lo):
            matcher["ge"] = lo
        if math.isfinite(hi):
            matcher["lt"] = hi
        key = (0, lo, "")
        return key, bin_label(float(value), self.edges), matcher


def _order(value: Feature) -> tuple[int, float, str]:
    """Numbers (and booleans) in numeric order before strings in text order."""
    if isinstance(value, str):
        return (1, 0.0, value)
    return (0, float(value), "")


Cell = tuple[tuple[int, float, str], Feature, dict[str, Any]]


def _cells(dim: Dimension, column: FeatureColumn) -> tuple[Codes, list[Cell]]:
    """Each episode's cell of ``dim`` and the cells: (sort key, shown value, matcher).

    Worked out once per distinct value; distinct values with one sort key share a cell."""
    by_key: dict[tuple[int, float, str], int] = {}
    cells: list[Cell] = []
    of_value = np.empty(len(column.values), dtype=np.intp)
    for i, value in enumerate(column.values):
        cell = dim.cell(value)
        k = by_key.get(cell[0])
        if k is None:
            k = by_key[cell[0]] = len(cells)
            cells.append(cell)
        of_value[i] = k
    return of_value[column.codes], cells


def dimensions(
    features: Sequence[dict[str, Feature]] | FeatureColumns, bins: int
) -> dict[str, Dimension]:
    """One dimension per recorded feature; numeric ones binned into ``bins`` quantiles."""
    columns = feature_columns(features)
    dims: dict[str, Dimension] = {}
    for name, column in columns.items():
        if column.numeric:
            dims[name] = Dimension(name, tuple(quantile_edges(column.floats(), bins)))
        else:
            dims[name] = Dimension(name)
    return dims


def slice_effects(
    reference: Sequence[bool] | Bools,
    world: Sequence[bool] | Bools,
    features: Sequence[dict[str, Feature]] | FeatureColumns,
    dims: Sequence[Dimension],
    confidence: float = CONFIDENCE,
) -> list[SliceEffect]:
    """Slices over the cells of ``dims`` jointly: one dimension gives the plain slices,
    two give their interaction. Sorted by cell; empty cells are left out."""
    columns = feature_columns(features)
    kinds = pair_kinds(reference, world)
    if len(kinds) != columns.episodes:
        raise ValueError(f"{len(kinds)} outcomes but features for {columns.episodes} episodes")
    label = " × ".join(d.name for d in dims)
    joint = np.zeros(len(kinds), dtype=np.intp)
    per_dim: list[list[Cell]] = []
    for dim in dims:
        codes, cells = _cells(dim, columns[dim.name])
        joint = joint * len(cells) + codes
        per_dim.append(cells)
    sizes = [len(c) for c in per_dim]
    total = int(np.prod(sizes)) if sizes else 1
    counts = np.bincount(joint * 4 + kinds, minlength=total * 4).reshape(total, 4)
    found = []
    for flat in np.flatnonzero(counts.sum(axis=1)):
        parts: list[Cell] = []
        rest = int(flat)
        for cells in reversed(per_dim):
            rest, k = divmod(rest, len(cells))
            parts.append(cells[k])
        parts.reverse()
        found.append((tuple(p[0] for p in parts), parts, counts[flat]))
    out = []
    for _, parts, c in sorted(found, key=lambda item: item[0]):
        shown = [p[1] for p in parts]
        value_out: Feature = shown[0] if len(shown) == 1 else " × ".join(map(feature_text, shown))
        clause: Clause = {dim.name: p[2] for dim, p in zip(dims, parts, strict=True)}
        table = PairedTable(n11=int(c[0]), n10=int(c[1]), n01=int(c[2]), n00=int(c[3]))
        effect = paired_effect(table, confidence)
        out.append(
            SliceEffect(
                feature=label,
                value=value_out,
                rescue=effect.rescue,
                harm=effect.harm,
                unchanged=effect.n - effect.rescue - effect.harm,
                net=effect.net,
                n=effect.n,
                difference=effect.difference,
                ci_low=effect.ci_low,
                ci_high=effect.ci_high,
                clause=clause,
            )
        )
    return out


def feature_text(value: Feature) -> str:
    """A feature value as the report shows it (``true``, not ``True``)."""
    return str(value).lower() if isinstance(value, bool) else str(value)
