"""Structural difference of two runs' final states, as JSON paths."""

from __future__ import annotations

import json
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


def _value(value: Any, width: int) -> str:
    """``value`` as JSON, cut to ``width`` characters with an ellipsis (a model's answer
    can run to pages; the line must still read as one change)."""
    text = json.dumps(value, ensure_ascii=False, sort_keys=True)
    return text if len(text) <= width else text[: width - 1] + "…"


def change_lines(diff: StateDiff, width: int | None = None) -> list[str]:
    """One line per change with its values: ``added path: value``, ``removed path:
    value``, ``changed path: before -> after``; values cut to ``width`` if given."""
    w = width or 10**9
    lines = [f"{'added':>8} {c.path}: {_value(c.after, w)}" for c in diff.added]
    lines += [f"{'removed':>8} {c.path}: {_value(c.before, w)}" for c in diff.removed]
    lines += [
        f"{'changed':>8} {c.path}: {_value(c.before, w)} -> {_value(c.after, w)}"
        for c in diff.changed
    ]
    return lines
