"""Pairs a world with a reference world episode by episode: rescue / harm / unchanged."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

from pydantic import BaseModel

from experiments.runtime.workload import Feature


class PairCounts(BaseModel):
    rescue: int
    harm: int
    unchanged: int

    @property
    def net(self) -> int:
        return self.rescue - self.harm


def pair_counts(reference: Sequence[bool], world: Sequence[bool]) -> PairCounts:
    """rescue: the reference failed and the world succeeded; harm: the other way round."""
    rescue = harm = 0
    for ref, w in zip(reference, world, strict=True):
        if w and not ref:
            rescue += 1
        elif ref and not w:
            harm += 1
    return PairCounts(rescue=rescue, harm=harm, unchanged=len(reference) - rescue - harm)


class SliceCounts(BaseModel):
    feature: str
    value: Feature
    rescue: int
    harm: int
    unchanged: int


def slice_counts(
    reference: Sequence[bool],
    world: Sequence[bool],
    features: Sequence[dict[str, Feature]],
) -> list[SliceCounts]:
    """Counts per (feature, value), features as recorded at the boundary, sorted."""
    groups: dict[tuple[str, Feature], list[int]] = defaultdict(lambda: [0, 0, 0])
    for ref, w, feats in zip(reference, world, features, strict=True):
        idx = 0 if (w and not ref) else 1 if (ref and not w) else 2
        for name, value in feats.items():
            groups[(name, value)][idx] += 1
    return [
        SliceCounts(feature=f, value=v, rescue=c[0], harm=c[1], unchanged=c[2])
        for (f, v), c in sorted(groups.items(), key=lambda kv: (kv[0][0], _order(kv[0][1])))
    ]


def _order(value: Feature) -> tuple[int, float, str]:
    """Numbers (and booleans) in numeric order before strings in text order."""
    if isinstance(value, str):
        return (1, 0.0, value)
    return (0, float(value), "")
