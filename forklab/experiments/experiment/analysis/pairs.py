"""Pairs a world with a reference world episode by episode, and the statistics of it.

The 2×2 table counts each episode by (reference succeeded?, world succeeded?):
``n10`` is a harm (the reference succeeded, the world failed) and ``n01`` a rescue.
Only the discordant pairs carry information about the difference, which is why the
test is McNemar's (exact, two-sided) and the interval is Newcombe's for paired data.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from pydantic import BaseModel

from forklab.experiments.experiment.analysis.columns import (
    MISSING,
    FeatureColumns,
    feature_columns,
    pair_kinds,
)
from forklab.experiments.experiment.columnar import Bools, FeatureRows
from forklab.experiments.experiment.stats import mcnemar_exact_p, paired_difference_ci
from forklab.runtime.workload import Feature

#: Confidence level of every interval in the report.
CONFIDENCE = 0.95


class PairedTable(BaseModel):
    """Episodes by (reference outcome, world outcome); 1 = success."""

    n11: int
    n10: int
    n01: int
    n00: int

    @property
    def n(self) -> int:
        return self.n11 + self.n10 + self.n01 + self.n00

    @property
    def rescue(self) -> int:
        return self.n01

    @property
    def harm(self) -> int:
        return self.n10

    @property
    def unchanged(self) -> int:
        return self.n11 + self.n00

    @property
    def net(self) -> int:
        return self.n01 - self.n10


def paired_table(reference: Sequence[bool] | Bools, world: Sequence[bool] | Bools) -> PairedTable:
    """rescue (``n01``): the reference failed and the world succeeded; harm: the other way."""
    n11, n10, n01, n00 = (int(c) for c in np.bincount(pair_kinds(reference, world), minlength=4))
    return PairedTable(n11=n11, n10=n10, n01=n01, n00=n00)


class PairedEffect(BaseModel):
    """What a world changed against its reference, with the uncertainty of it.

    ``difference`` is the world's success rate minus the reference's, i.e.
    (rescues − harms) / n; a positive difference means fewer failures.
    """

    n: int
    rescue: int
    harm: int
    net: int
    difference: float
    ci_low: float
    ci_high: float
    confidence: float
    mcnemar_p: float


def paired_effect(table: PairedTable, confidence: float = CONFIDENCE) -> PairedEffect:
    if table.n == 0:
        return PairedEffect(
            n=0,
            rescue=0,
            harm=0,
            net=0,
            difference=0.0,
            ci_low=-1.0,
            ci_high=1.0,
            confidence=confidence,
            mcnemar_p=1.0,
        )
    est, low, high = paired_difference_ci(table.n11, table.n10, table.n01, table.n00, confidence)
    return PairedEffect(
        n=table.n,
        rescue=table.rescue,
        harm=table.harm,
        net=table.net,
        difference=est,
        ci_low=low,
        ci_high=high,
        confidence=confidence,
        mcnemar_p=mcnemar_exact_p(table.harm, table.rescue),
    )


def crosses_zero(effect: PairedEffect) -> bool:
    """True when the interval admits no change at all: such an effect is never a win."""
    return effect.ci_low <= 0.0 <= effect.ci_high


class SliceCounts(BaseModel):
    feature: str
    value: Feature
    rescue: int
    harm: int
    unchanged: int


def slice_counts(
    reference: Sequence[bool] | Bools,
    world: Sequence[bool] | Bools,
    features: FeatureRows | Sequence[dict[str, Feature]] | FeatureColumns,
) -> list[SliceCounts]:
    """Counts per (feature, value), features as recorded at the boundary, sorted."""
    columns = feature_columns(features)
    # per episode: 0 rescue, 1 harm, 2 unchanged (from the table cells n11 n10 n01 n00)
    kind = np.array([2, 1, 0, 2], dtype=np.intp)[pair_kinds(reference, world)]
    out: list[SliceCounts] = []
    for name, column in columns.items():
        counts = np.bincount(column.codes * 3 + kind, minlength=len(column.values) * 3)
        for value, c in sorted(
            zip(column.values, counts.reshape(-1, 3), strict=True), key=lambda vc: _order(vc[0])
        ):
            if c.sum() and value is not MISSING:
                out.append(
                    SliceCounts(
                        feature=name,
                        value=value,
                        rescue=int(c[0]),
                        harm=int(c[1]),
                        unchanged=int(c[2]),
                    )
                )
    return out


def _order(value: Feature) -> tuple[int, float, str]:
    """Numbers (and booleans) in numeric order, then strings in text order, then missing."""
    if value is None:
        return (2, 0.0, "")
    if isinstance(value, str):
        return (1, 0.0, value)
    return (0, float(value), "")
