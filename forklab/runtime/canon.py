"""Canonical JSON and digests: the one way ForkLab turns values into bytes it hashes."""

from __future__ import annotations

import hashlib
import json
import json.decoder
import json.encoder
import json.scanner
from collections.abc import Callable
from typing import Any

#: The options of every canonical text: sorted keys, no whitespace, no NaN.
_CANONICAL = json.JSONEncoder(sort_keys=True, separators=(",", ":"), allow_nan=False)
# The C encoder and scanner, made once: ``JSONEncoder.encode`` builds a new C encoder on
# every call and ``json.loads`` adds two regex matches; both dominate for small values.
# The text is exactly ``_CANONICAL.encode(value)`` (the same C encoder, same options),
# except that the encoder keeps no circular-reference markers: a shared markers dict would
# be state shared between threads, and a fresh one per call is what made ``encode`` slow.
# A value that contains itself ends in ``RecursionError`` instead, which
# :func:`canonical_json` turns into the ``ValueError`` ``json`` raises for it.
_C_ENCODER: Any = getattr(json.encoder, "c_make_encoder", None)  # None without the C module
_SCANNER: Any = json.scanner.make_scanner  # the C scanner when there is one
_ENCODE: Callable[[Any, int], Any] | None = (
    _C_ENCODER(
        None,
        _CANONICAL.default,
        json.encoder.encode_basestring_ascii,
        None,
        ":",
        ",",
        True,
        False,
        False,
    )
    if _C_ENCODER is not None
    else None
)
_SCAN: Callable[[str, int], tuple[Any, int]] = _SCANNER(json.decoder.JSONDecoder())


def canonical_json(value: Any) -> str:
    """Serialise ``value`` deterministically: sorted keys, no whitespace, no NaN."""
    if _ENCODE is None or isinstance(value, str):
        return _CANONICAL.encode(value)
    try:
        return "".join(_ENCODE(value, 0))
    except RecursionError:
        raise ValueError("Circular reference detected (or nesting deeper than the limit)") from None


def parse_canonical(text: str) -> Any:
    """``json.loads(text)`` for a text :func:`canonical_json` wrote (one value, no
    whitespace), without ``json.loads``'s per-call wrapper; anything after the value is an
    error as in ``json.loads``."""
    value, end = _SCAN(text, 0)
    if end != len(text):
        raise ValueError(f"extra data after the JSON value at character {end}")
    return value


def sha256_hex(data: str | bytes) -> str:
    if isinstance(data, str):
        data = data.encode()
    return hashlib.sha256(data).hexdigest()


def digest(value: Any) -> str:
    """sha256 of the canonical JSON of ``value``."""
    return sha256_hex(canonical_json(value))
