"""The workload contract, enforced: every violation becomes one sentence a person can act on.

The runner calls a workload's methods; when one raises, or returns something the contract
forbids, the run stops with a ``ContractViolation`` whose message names the method, the
``file:line``, the episode, the world (or the prefix), the step, and what went wrong. The
same sentence reaches ``forklab plan`` (exit 2), the durable path's status, the UI and the
ledger. Standard library only: this file ships inside every sandbox bundle.

The contract (``docs/workloads.md`` states it for workload authors):

- ``outcome`` returns a bool;
- ``features`` returns exactly the names declared in ``feature_types``, each with its
  declared type (bool, int, float or str; ``None`` only where declared optional, e.g.
  ``str | None``), in every episode;
- the state is JSON and survives canonical JSON unchanged (no sets, tuples, non-string
  keys, NaN);
- any exception a workload method raises stops the run (it is deterministic: retrying
  cannot help).
"""

from __future__ import annotations

import json
import math
import os
import sys
import types
from collections.abc import Mapping
from typing import Any

#: Exit code of the runner when the workload broke its contract (its last stderr line is
#: the sentence). Distinct from crashes, which the workload's own code may cause.
CONTRACT_EXIT = 65
#: Exception messages are cut here, so a sentence stays one readable line.
_MESSAGE_CHARS = 200
_FEATURE_TYPES = (bool, int, float, str)
_STDLIB = os.path.dirname(os.__file__)
_HERE = os.path.dirname(os.path.abspath(__file__))
#: Where the base class lives: its ``NotImplementedError`` means "override this method".
_BASE_FILE = os.path.join(_HERE, "workload.py")


class ContractViolation(Exception):
    """A workload broke its contract or raised; ``str(exc)`` is the one sentence."""


class BoundaryMissingError(ContractViolation):
    """The episode never stood exactly at the requested boundary: no silent substitute."""


class StuckWorldError(ContractViolation):
    """A world kept stepping past the workload's ``max_steps``."""


def _cls(workload: object) -> type:
    """The workload's class (callers pass an instance, or the class while it loads)."""
    return workload if isinstance(workload, type) else type(workload)


def _short(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= _MESSAGE_CHARS else text[: _MESSAGE_CHARS - 1] + "…"


def _place(filename: str, line: int) -> str:
    """``file:line``: relative to the working directory when the file lies beneath it, else
    to the import path entry that holds it (inside a sandbox: the bundle), else absolute."""
    path = os.path.abspath(filename)
    for root in [os.getcwd(), *sorted(filter(None, sys.path), key=len, reverse=True)]:
        base = os.path.abspath(root)
        if path.startswith(base + os.sep):
            return f"{os.path.relpath(path, base)}:{line}"
    return f"{path}:{line}"


def where(episode: int, world: str | None, step: int) -> str:
    """The run coordinates of a violation: episode, world (or prefix), step."""
    if world is None:
        return f"episode {episode}, prefix, step {step}"
    return f"episode {episode}, world {world}, step {step} after the fork"


def method_place(workload: object, method: str) -> str:
    """``file:line`` of the definition of ``method`` as the workload's class resolves it."""
    fn = getattr(_cls(workload), method, None)
    code = getattr(fn, "__code__", None)
    if code is None:
        return "?"
    return _place(code.co_filename, code.co_firstlineno)


def violation(workload: object, method: str, what: str, at: str) -> ContractViolation:
    name = _cls(workload).__name__
    return ContractViolation(f"{name}.{method}() {what} at {method_place(workload, method)} ({at})")


def from_exception(workload: object, exc: BaseException, at: str) -> ContractViolation:
    """The sentence for an exception a workload method raised.

    The method is the frame the runner called (the second of the traceback); the place is
    the deepest frame outside the standard library, where the workload's own code failed.
    """
    tb = exc.__traceback__
    called = tb.tb_next if tb is not None else None
    name = _cls(workload).__name__
    detail = f"{type(exc).__name__}: {_short(str(exc))}".rstrip(": ")
    if called is None:  # raised by the runner itself, on a value the workload returned
        return ContractViolation(f"{name} returned a value the runner cannot use ({detail}) ({at})")
    method = called.tb_frame.f_code.co_name
    called_file = called.tb_frame.f_code.co_filename
    if os.path.dirname(called_file) == _HERE and called_file != _BASE_FILE:
        return ContractViolation(f"the runner's {method}() raised {detail} on {name} ({at})")
    deepest: types.TracebackType | None = None
    frame_tb: types.TracebackType | None = called
    while frame_tb is not None:
        if not frame_tb.tb_frame.f_code.co_filename.startswith(_STDLIB):
            deepest = frame_tb
        frame_tb = frame_tb.tb_next
    base = deepest is not None and deepest.tb_frame.f_code.co_filename == _BASE_FILE
    if isinstance(exc, NotImplementedError) and base:
        return ContractViolation(
            f"{name} does not implement {method}(); override it (see docs/workloads.md) ({at})"
        )
    place = (
        _place(deepest.tb_frame.f_code.co_filename, deepest.tb_lineno)
        if deepest is not None
        else method_place(workload, method)
    )
    return ContractViolation(f"{name}.{method}() raised {detail} at {place} ({at})")


# --- outcome ---------------------------------------------------------------------------
def check_outcome(workload: object, value: object, at: str) -> bool:
    if value is True or value is False:
        return value
    raise violation(
        workload,
        "outcome",
        f"returned {type(value).__name__} {_short(repr(value))}, not a bool "
        "(return True when the episode succeeded)",
        at,
    )


# --- features --------------------------------------------------------------------------
_KINDS: dict[type, dict[str, tuple[tuple[type, ...], bool]]] = {}


#: The longest feature name: it labels slices, rules and charts.
MAX_FEATURE_NAME = 100
#: The most features a workload may declare: each is sliced, charted and searched by the
#: guard, so the report grows with their number.
MAX_FEATURES = 32


def _is_text(value: object) -> bool:
    """A str that prints as one line: no line break, control character or lone surrogate
    (which no report, JSON file or terminal can write), so a workload's text cannot forge
    a line of a report."""
    return isinstance(value, str) and value.isprintable()


def feature_kinds(cls: type) -> dict[str, tuple[tuple[type, ...], bool]]:
    """``feature_types`` as (allowed types, optional) per name, worked out once per class;
    a bad declaration is a violation too, named after the class attribute."""
    known = _KINDS.get(cls)
    if known is not None:
        return known
    declared: Mapping[str, Any] = getattr(cls, "feature_types", {})
    name = cls.__name__
    if len(declared) > MAX_FEATURES:
        raise ContractViolation(
            f"{name}.feature_types declares {len(declared)} features; declare at most "
            f"{MAX_FEATURES} (each is sliced, charted and searched by the guard)"
        )
    kinds: dict[str, tuple[tuple[type, ...], bool]] = {}
    for feature, kind in declared.items():
        if not _is_text(feature) or not 0 < len(feature) <= MAX_FEATURE_NAME:
            raise ContractViolation(
                f"{name}.feature_types has the name {_short(repr(feature))}; name a feature "
                f"with 1 to {MAX_FEATURE_NAME} printable characters on one line"
            )
        args = kind.__args__ if isinstance(kind, types.UnionType) else (kind,)
        optional = type(None) in args
        allowed = tuple(a for a in args if a is not type(None))
        if len(allowed) != 1 or allowed[0] not in _FEATURE_TYPES:
            raise ContractViolation(
                f"{name}.feature_types[{feature!r}] is {kind!r}; declare bool, int, float or "
                f"str, or one of them '| None' for a feature that may be missing"
            )
        kinds[feature] = (allowed, optional)
    _KINDS[cls] = kinds
    return kinds


def check_features(
    workload: object,
    features: object,
    kinds: Mapping[str, tuple[tuple[type, ...], bool]],
    at: str,
) -> None:
    """Exactly the declared names, each of its declared type, in this episode."""
    if not isinstance(features, dict):
        raise violation(workload, "features", f"returned {type(features).__name__}, not a dict", at)
    if features.keys() != kinds.keys():
        missing = sorted(set(kinds) - set(features))
        extra = sorted(set(features) - set(kinds), key=str)
        if missing:
            what = (
                f"returned no {missing[0]!r}, which feature_types declares (return every "
                "declared feature in every episode; declare it e.g. 'str | None' and "
                "return None when it has no value)"
            )
        else:
            what = (
                f"returned {extra[0]!r}, which feature_types does not declare (add it to "
                "feature_types with its type)"
            )
        raise violation(workload, "features", what, at)
    for feature, value in features.items():
        allowed, optional = kinds[feature]
        if type(value) in allowed:
            if type(value) is float and not math.isfinite(value):
                what = f"returned {feature!r} = {value!r}; a float feature must be finite"
                raise violation(workload, "features", what, at)
            if type(value) is int and not -(2**63) <= value < 2**63:
                what = (  # (no repr: past 4,300 digits Python refuses to print an int)
                    f"returned {feature!r} = an int of {value.bit_length()} bits; an int "
                    "feature must fit in 64 bits"
                )
                raise violation(workload, "features", what, at)
            if type(value) is str and not _is_text(value):
                what = (
                    f"returned {feature!r} = {_short(repr(value))}; a str feature must be "
                    "printable text on one line (no line breaks, control characters or lone "
                    "surrogates): it is a slice's label in every report"
                )
                raise violation(workload, "features", what, at)
            continue
        if value is None and optional:
            continue
        expected = allowed[0].__name__ + (" or None" if optional else "")
        hint = (
            f"; declare it '{allowed[0].__name__} | None' if it may be missing"
            if value is None
            else ""
        )
        what = (
            f"returned {feature!r} = {_short(repr(value))} ({type(value).__name__}) but "
            f"feature_types declares {expected}{hint}"
        )
        raise violation(workload, "features", what, at)


# --- state -----------------------------------------------------------------------------
def _json_problem(value: Any, path: str) -> str | None:
    """What canonical JSON cannot carry unchanged in ``value``, and where (first found)."""
    if value is None or type(value) in (bool, int, str):
        return None
    if type(value) is float:
        return None if math.isfinite(value) else f"{value!r} at {path}, which JSON cannot hold"
    if type(value) is list:
        for i, item in enumerate(value):
            found = _json_problem(item, f"{path}[{i}]")
            if found:
                return found
        return None
    if type(value) is dict:
        for key, item in value.items():
            if not isinstance(key, str):
                return f"the {type(key).__name__} key {key!r} in {path}"
            found = _json_problem(item, f"{path}[{key!r}]")
            if found:
                return found
        return None
    return f"a {type(value).__name__} at {path}"


def check_state(workload: object, state: Any, text: str | None, method: str, at: str) -> None:
    """``text`` is the canonical JSON of ``state`` (None when it could not be made): the
    state must be JSON and read back equal, or a fork would not continue the same run."""
    if text is not None and json.loads(text) == state:
        return
    problem = _json_problem(state, "state") or "a state that does not read back equal from JSON"
    what = (
        f"left {problem}; state must be plain JSON (dicts with str keys, lists, str, int, "
        "finite float, bool, None) so that every world forks from the same bytes"
    )
    raise violation(workload, method, what, at)


def exit_with(violation_: ContractViolation) -> int:
    """The sandbox runner's way out: the sentence as the last stderr line."""
    print(str(violation_), file=sys.stderr)
    return CONTRACT_EXIT
