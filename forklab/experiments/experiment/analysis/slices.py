"""Slices: the paired effect within groups of episodes that share a pre-decision feature.

Categorical features (booleans, strings) slice by value. Numeric features are binned
into quantiles of the values seen at the boundary, and each bin is a half-open range
``[lo, hi)`` whose outer ends are open, so that a value never seen in training still
falls into a bin; a bin of an integer feature is named by the integers it holds (``0``,
``1..2``), not by its range. A string feature with more than ``MAX_CATEGORIES`` values (an id, a
free-text message) keeps a slice for each of its commonest values and folds the rest into
one slice, "other", which also holds values never seen in training: a slice per value
would be one episode each (nothing a guard could learn from) and would grow the tables,
the charts and the report with the episodes. Every slice carries the guard-rule clause
that selects exactly its episodes (the runner's ``{"eq": v}``, ``{"ge": lo, "lt": hi}``
and ``{"not_in": [v, ...]}`` matchers), so a guard policy learned from slices is the same
object the runner executes.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from pydantic import BaseModel

from forklab.experiments.experiment.analysis.columns import pair_kinds
from forklab.experiments.experiment.analysis.pairs import CONFIDENCE, PairedTable, paired_effect
from forklab.experiments.experiment.columnar import Bools, FeatureRows, as_features
from forklab.experiments.experiment.stats import (
    bin_bounds,
    bin_label,
    integer_bin_label,
    quantile_edges,
)
from forklab.runtime.workload import Feature

#: A clause of the runner's guard rule: feature → matcher; all matchers must hold.
Clause = dict[str, dict[str, Feature | list[Feature]]]

#: The most slices of one categorical feature, "other" included.
MAX_CATEGORIES = 20


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
    """How one feature is sliced: by value (``kept``: when not ``None``, only those values
    have a slice of their own, and every other present value is in "other", which stood
    for ``folded`` distinct values in training), or by quantile bin edges."""

    name: str
    edges: tuple[float, ...] | None = None
    kept: tuple[Feature, ...] | None = None
    folded: int = 0
    #: (lowest, highest) value of a binned feature whose values are all integers: its
    #: bins are named by the integers they hold (``integer_bin_label``)
    integers: tuple[int, int] | None = None

    def cell(self, value: Feature) -> tuple[tuple[int, float, str], Feature, dict[str, Any]]:
        """(sort key, shown value, matcher) of the slice that holds ``value``; a missing
        value (``None``, for an optional feature) is a slice of its own."""
        if self.edges is None or value is None:
            if self.kept is None or value is None or value in self.kept:
                return _order(value), value, {"eq": value}
            shown = f"other ({self.folded:,} values)"
            return (1, 1.0, ""), shown, {"not_in": list(self.kept)}
        lo, hi = bin_bounds(float(value), self.edges)
        matcher: dict[str, Any] = {}
        if math.isfinite(lo):
            matcher["ge"] = lo
        if math.isfinite(hi):
            matcher["lt"] = hi
        key = (0, lo, "")
        if self.integers is not None and isinstance(value, int):
            return key, integer_bin_label(value, self.edges, self.integers), matcher
        return key, bin_label(float(value), self.edges), matcher


def _order(value: Feature) -> tuple[int, float, str]:
    """Numbers (and booleans) in numeric order, then strings in text order (then "other"),
    then missing."""
    if value is None:
        return (2, 0.0, "")
    if isinstance(value, str):
        return (1, 0.0, value)
    return (0, float(value), "")


def _numeric(values: Sequence[Feature]) -> bool:
    """Numbers only (missing values aside, which slice on their own)."""
    present = [v for v in values if v is not None]
    return bool(present) and all(
        isinstance(v, int | float) and not isinstance(v, bool) for v in present
    )


def dimensions(
    features: FeatureRows | Sequence[Mapping[str, Feature]], bins: int
) -> dict[str, Dimension]:
    """One dimension per recorded feature; numeric ones binned into ``bins`` quantiles
    (of the episodes' values: each distinct row counts as often as episodes stand in it);
    categorical ones with more than ``MAX_CATEGORIES`` values capped (``_capped``)."""
    table = as_features(features)
    counts = table.counts().tolist()  # (read once per row and feature: Python ints)
    names = sorted({name for feats in table.rows for name in feats})
    dims: dict[str, Dimension] = {}
    for name in names:
        present = [(feats[name], k) for k, feats in enumerate(table.rows) if name in feats]
        values = [v for v, k in present if counts[k]]
        if _numeric(values):
            numbered = [(float(v), counts[k]) for v, k in present if isinstance(v, int | float)]
            numbers = np.repeat([v for v, _ in numbered], [c for _, c in numbered])
            edges = quantile_edges(numbers, bins)
            given = [v for v in values if v is not None]
            whole = [v for v in given if isinstance(v, int)]
            integers = (min(whole), max(whole)) if whole and len(whole) == len(given) else None
            dims[name] = Dimension(name, tuple(edges), integers=integers)
        else:
            dims[name] = _capped(name, [(v, int(counts[k])) for v, k in present if counts[k]])
    return dims


def _capped(name: str, seen: Sequence[tuple[Feature, int]]) -> Dimension:
    """A categorical dimension: a slice per value, or, past ``MAX_CATEGORIES``, a slice
    for each of the ``MAX_CATEGORIES - 1`` commonest values (most episodes first, then in
    slice order) and "other" for the rest. A missing value is never folded."""
    episodes: dict[Feature, int] = {}
    for value, count in seen:
        if value is not None:
            episodes[value] = episodes.get(value, 0) + count
    if len(episodes) <= MAX_CATEGORIES:
        return Dimension(name)
    ranked = sorted(episodes, key=lambda v: (-episodes[v], _order(v)))
    kept = tuple(sorted(ranked[: MAX_CATEGORIES - 1], key=_order))
    return Dimension(name, kept=kept, folded=len(ranked) - len(kept))


def slice_effects(
    reference: Sequence[bool] | Bools,
    world: Sequence[bool] | Bools,
    features: FeatureRows | Sequence[Mapping[str, Feature]],
    dims: Sequence[Dimension],
    confidence: float = CONFIDENCE,
) -> list[SliceEffect]:
    """Slices over the cells of ``dims`` jointly: one dimension gives the plain slices,
    two give their interaction. Sorted by cell; empty cells are left out.

    Each distinct features row is placed in its cell once; the episodes are then counted
    per (cell, table cell) with one ``bincount``. A cell shows the value (and clause) of
    its first episode, as the rows are in order of first appearance."""
    table = as_features(features)
    label = " × ".join(d.name for d in dims)
    cells: dict[tuple[Any, ...], int] = {}
    shown_of: list[tuple[Feature, Clause]] = []
    cell_of_row = [0] * len(table.rows)
    seen = (table.counts() > 0).tolist()  # a row no episode stands in must not name a cell
    places = [(_cells(dim), dim.name) for dim in dims]
    for k, feats in enumerate(table.rows):
        if not seen[k]:
            continue
        got = [place(feats[name]) for place, name in places]  # (rank, shown, matcher)
        order = tuple([rank for rank, _, _ in got])
        cell = cells.get(order)
        if cell is None:
            shown = [value for _, value, _ in got]
            value_out: Feature = (
                shown[0] if len(shown) == 1 else " × ".join(map(feature_text, shown))
            )
            cell = cells[order] = len(shown_of)
            # (a value's matcher is shared by its rows: the clause gets copies)
            clause: Clause = {
                name: dict(m) for (_, _, m), (_, name) in zip(got, places, strict=True)
            }
            shown_of.append((value_out, clause))
        cell_of_row[k] = cell
    kinds = pair_kinds(reference, world)  # 0 n11, 1 n10, 2 n01, 3 n00
    if len(kinds) != len(table):
        raise ValueError(f"{len(kinds)} outcomes but {len(table)} episodes of features")
    row_cells = np.asarray(cell_of_row, dtype=np.intp)
    counts = np.bincount(row_cells[table.codes] * 4 + kinds, minlength=len(shown_of) * 4).reshape(
        -1, 4
    )
    out = []
    for key in sorted(cells):
        cell = cells[key]
        c = [int(x) for x in counts[cell]]
        if not sum(c):
            continue
        value_out, clause = shown_of[cell]
        effect = paired_effect(PairedTable(n11=c[0], n10=c[1], n01=c[2], n00=c[3]), confidence)
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


Cell = tuple[tuple[int, float, str], Feature, dict[str, Any]]


def _cells(dim: Dimension) -> Callable[[Feature], Cell]:
    """``dim.cell``, worked out once per distinct value: where every episode records
    its own features (a float such as a mood), the distinct rows are as many as the
    episodes, but each feature has far fewer distinct values. Keyed by type and value
    (``True`` is not ``1``); values equal as keys (``-0.0`` and ``0.0``) already share a
    cell by its sort key, and the cell keeps what its first row showed. Its matcher is
    shared by the rows of that value: a cell's clause takes copies."""
    known: dict[tuple[type, Feature], Cell] = {}

    def place(value: Feature) -> Cell:
        key = (type(value), value)
        found = known.get(key)
        if found is None:
            found = known[key] = dim.cell(value)
        return found

    return place


def feature_text(value: Feature) -> str:
    """A feature value as the report shows it (``true``, not ``True``; ``missing``)."""
    if value is None:
        return "missing"
    return str(value).lower() if isinstance(value, bool) else str(value)


def identical_partitions(
    features: FeatureRows | Sequence[Mapping[str, Feature]], dims: Mapping[str, Dimension]
) -> list[list[str]]:
    """Groups of two or more features whose slices hold exactly the same episodes (each
    slice of one is a slice of the other: ``agents_in_retry`` and ``queue_depth`` when
    every agent in retry adds one to the queue). Their slices carry the same counts and
    intervals under other names, so a report shows them once and names both; the guard
    still sees every feature. A group's names are in ``dims`` order."""
    table = as_features(features)
    seen = (table.counts() > 0).tolist()
    groups: dict[tuple[int, ...], list[str]] = {}
    for name, dim in dims.items():
        first: dict[Any, int] = {}  # the cell's order key → its number in order of first use
        place = _cells(dim)
        shape = tuple(
            first.setdefault(place(feats.get(name))[0], len(first))
            for k, feats in enumerate(table.rows)
            if seen[k]
        )
        groups.setdefault(shape, []).append(name)
    return [names for names in groups.values() if len(names) > 1]
