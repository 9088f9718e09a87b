"""The one strict reader for JSON that comes from outside: specs, CLI arguments, request
bodies of the HTTP stand-ins, workflow and activity payloads.

Python's ``json`` reads ``NaN``, ``Infinity`` and ``-Infinity`` (which JSON does not have)
and turns ``1e999`` into ``inf``; pydantic's JSON parser does the same. Such a number has no
canonical JSON form: a receipt, a digest or a report would record it as ``null`` or
fail later, far from where it came in. YAML has them too (``.nan``, ``.inf``). Here every
non-finite number is refused where it enters, with the path to it, and so is nesting
deeper than :data:`MAX_DEPTH` (which would otherwise end in a ``RecursionError``).
Standard library only: the runtime layer is the one every other layer may import.
"""

from __future__ import annotations

import dataclasses
import json
import math
from typing import Any

#: Deeper nesting than any legitimate spec, argument or payload holds.
MAX_DEPTH = 200


class StrictJsonError(ValueError):
    """Text that is not strict JSON, or a value holding a non-finite number or nested too
    deeply; the message is one line naming what and where."""


def _constant(name: str) -> Any:
    raise StrictJsonError(f"{name} is not a finite number")


def _float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise StrictJsonError(f"{text[:40]} is not a finite number")
    return value


def loads(data: str | bytes, what: str) -> Any:
    """``json.loads(data)``, refusing non-finite numbers, numbers too long to read and
    nesting deeper than :data:`MAX_DEPTH`; ``StrictJsonError`` names ``what``."""
    try:
        value = json.loads(data, parse_constant=_constant, parse_float=_float)
    except StrictJsonError as exc:
        raise StrictJsonError(f"{what}: {exc}") from None
    except RecursionError:
        raise StrictJsonError(f"{what}: nested too deeply") from None
    except UnicodeDecodeError:
        raise StrictJsonError(f"{what}: not UTF-8 text") from None
    except ValueError as exc:  # JSONDecodeError, or an integer past 4300 digits
        raise StrictJsonError(f"{what}: not valid JSON ({str(exc)[:120]})") from None
    check_finite(value, what)
    return value


def _where(path: list[Any]) -> str:
    return "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in path).lstrip(".")


def check_finite(value: Any, what: str) -> None:
    """Raise ``StrictJsonError`` naming the path of the first non-finite number in
    ``value`` (a tree of dicts and lists, as JSON or YAML loads it, or of the objects a
    payload converter builds from one: pydantic models, dataclasses), or where it nests
    deeper than :data:`MAX_DEPTH`. Iterative: any depth is walked without recursion."""
    stack: list[tuple[Any, list[Any]]] = [(value, [])]
    while stack:
        node, path = stack.pop()
        if len(path) > MAX_DEPTH:
            raise StrictJsonError(f"{what}: nested deeper than {MAX_DEPTH} levels")
        if isinstance(node, float) and not math.isfinite(node):
            at = f": field {_where(path)}" if path else ""
            raise StrictJsonError(f"{what}{at}: {node} is not a finite number")
        if isinstance(node, dict):
            stack.extend((v, [*path, k]) for k, v in node.items())
        elif isinstance(node, list | tuple):
            stack.extend((v, [*path, i]) for i, v in enumerate(node))
        else:
            stack.extend((v, [*path, k]) for k, v in _fields(node).items())


def _fields(node: Any) -> dict[str, Any]:
    """The values an object decoded from JSON holds: a dataclass's fields, a pydantic
    model's fields and extra fields (found by duck typing: this module imports no
    pydantic); nothing for any other value."""
    if dataclasses.is_dataclass(node) and not isinstance(node, type):
        return {f.name: getattr(node, f.name, None) for f in dataclasses.fields(node)}
    if hasattr(type(node), "__pydantic_fields__") and not isinstance(node, type):
        extra = getattr(node, "__pydantic_extra__", None) or {}
        return {**getattr(node, "__dict__", {}), **extra}
    return {}
