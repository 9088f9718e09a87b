"""Structural difference of two runs' final states, as JSON paths."""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict, Field


class Change(BaseModel):
    model_config = ConfigDict(frozen=True)

    path: str
    before: Any = None
    after: Any = None


class StateDiff(BaseModel):
    model_config = ConfigDict(frozen=True)

    added: list[Change] = Field(default_factory=list)
    removed: list[Change] = Field(default_factory=list)
    changed: list[Change] = Field(default_factory=list)

    @property
    def paths(self) -> list[str]:
        return sorted(c.path for c in (*self.added, *self.removed, *self.changed))


def _walk(a: Any, b: Any, path: str, out: dict[str, list[Change]]) -> None:
    if isinstance(a, dict) and isinstance(b, dict):
        for key in sorted(set(a) | set(b), key=str):
            sub = f"{path}.{key}" if path else str(key)
            if key not in a:
                out["added"].append(Change(path=sub, after=b[key]))
            elif key not in b:
                out["removed"].append(Change(path=sub, before=a[key]))
            else:
                _walk(a[key], b[key], sub, out)
        return
    if isinstance(a, list) and isinstance(b, list):
        for i in range(max(len(a), len(b))):
            sub = f"{path}[{i}]"
            if i >= len(a):
                out["added"].append(Change(path=sub, after=b[i]))
            elif i >= len(b):
                out["removed"].append(Change(path=sub, before=a[i]))
            else:
                _walk(a[i], b[i], sub, out)
        return
    if a != b or type(a) is not type(b):
        out["changed"].append(Change(path=path or "$", before=a, after=b))


def diff_states(a: Any, b: Any) -> StateDiff:
    """Paths added in ``b``, removed from ``a``, and changed between them (leaf values)."""
    out: dict[str, list[Change]] = {"added": [], "removed": [], "changed": []}
    _walk(a, b, "", out)
    return StateDiff(**out)


def divergence_step(a: Sequence[Hashable], b: Sequence[Hashable]) -> int | None:
    """The first step (1-based) where two runs' step signatures (call and outcome)
    differ; None when the sequences are equal."""
    for i, (x, y) in enumerate(zip(a, b, strict=False), start=1):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b)) + 1
