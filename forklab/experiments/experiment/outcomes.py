"""Per-episode outcomes of an experiment, wherever they were produced.

The local twin and the durable path (sandboxes) both reduce to these models, so the
analysis and the report cannot tell — and need not care — where the worlds ran.
"""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Sequence
from typing import Annotated, Any, cast

import numpy as np
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, PlainSerializer

from forklab.experiments.experiment.columnar import (
    Bools,
    Codes,
    ColumnBatch,
    FeatureRows,
    Ints,
    StrColumn,
    bools,
    concat_strings,
    ints,
    to_columns,
)
from forklab.experiments.experiment.results import WorldStatus
from forklab.runtime.canon import canonical_json
from forklab.runtime.file_format import Batch

# --- the columns at the boundary: lists in, compact encodings out ---------------------
# A column validates from a plain JSON list (what a person or a sandbox writes) or from
# its compact encoding (what ``model_dump`` writes: a base64 bitset for booleans, base64
# little-endian integers, and dictionary-coded strings), and holds arrays in between.


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _unb64(field: str, value: Any) -> bytes:
    if not isinstance(value, str):
        raise ValueError(f"{field} must be a base64 string")
    try:
        return base64.b64decode(value, validate=True)
    except ValueError:
        raise ValueError(f"{field} is not valid base64") from None


def _bool_column(value: Any) -> Bools:
    if isinstance(value, np.ndarray):
        if value.dtype != np.bool_ or value.ndim != 1:
            raise ValueError("a boolean column must be a 1-d numpy bool array")
        return value
    if isinstance(value, dict) and sorted(value) == ["bits", "n"]:
        n = value["n"]
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise ValueError("'n' must be a count of entries")
        packed = np.frombuffer(_unb64("bits", value["bits"]), dtype=np.uint8)
        if len(packed) != (n + 7) // 8:
            raise ValueError(f"'bits' holds {len(packed)} bytes, {n} entries need {(n + 7) // 8}")
        unpacked: Bools = np.unpackbits(packed, count=n).astype(np.bool_)
        return unpacked
    if isinstance(value, list | tuple) and all(isinstance(v, bool) for v in value):
        return bools(value)
    raise ValueError("expected a list of booleans or {'n': count, 'bits': base64 bitset}")


def _bool_json(column: Bools) -> dict[str, Any]:
    return {"n": len(column), "bits": _b64(np.packbits(column).tobytes())}


def _int_column(value: Any) -> Ints:
    if isinstance(value, np.ndarray):
        if value.dtype != np.int64 or value.ndim != 1:
            raise ValueError("an integer column must be a 1-d numpy int64 array")
        return value
    if isinstance(value, dict) and sorted(value) == ["int64"]:
        data = _unb64("int64", value["int64"])
        if len(data) % 8:
            raise ValueError("'int64' must hold 8 bytes an entry")
        return np.frombuffer(data, dtype="<i8").astype(np.int64)
    if isinstance(value, list | tuple | range) and all(
        isinstance(v, int) and not isinstance(v, bool) for v in value
    ):
        return ints(list(value))
    raise ValueError("expected a list of integers or {'int64': base64 little-endian}")


def _int_json(column: Ints) -> dict[str, Any]:
    return {"int64": _b64(column.astype("<i8").tobytes())}


def _codes(value: Any, size: int, table: str) -> Codes:
    """Base64 little-endian uint32 codes into a table of ``size`` entries."""
    data = _unb64("codes", value)
    if len(data) % 4:
        raise ValueError("'codes' must hold 4 bytes an entry")
    codes: Codes = np.frombuffer(data, dtype="<u4").astype(np.uint32)
    if len(codes) and int(codes.max()) >= size:
        raise ValueError(f"'codes' point past the end of {table!r}")
    return codes


def _str_column(value: Any) -> StrColumn:
    if isinstance(value, StrColumn):
        return value
    if isinstance(value, dict) and sorted(value) == ["codes", "values"]:
        table = value["values"]
        if not (isinstance(table, list) and all(isinstance(v, str) for v in table)):
            raise ValueError("'values' must be a list of strings")
        return StrColumn(_codes(value["codes"], len(table), "values"), table)
    if isinstance(value, list | tuple) and all(isinstance(v, str) for v in value):
        return StrColumn.of(value)
    raise ValueError("expected a list of strings or {'values': [...], 'codes': base64 uint32}")


def _str_json(column: StrColumn) -> dict[str, Any]:
    return {"values": column.values, "codes": _b64(column.codes.astype("<u4").tobytes())}


def _feature_rows(rows: list[dict[str, Any]]) -> None:
    for row in rows:
        for name, v in row.items():
            if not (
                isinstance(name, str) and (v is None or isinstance(v, bool | int | float | str))
            ):
                raise ValueError(
                    f"feature {name!r} = {v!r}: features map names to a bool, int, float, "
                    "string or null"
                )


def _feature_column(value: Any) -> FeatureRows:
    if isinstance(value, FeatureRows):
        return value
    if isinstance(value, dict) and sorted(value) == ["codes", "rows"]:
        rows = value["rows"]
        if not (isinstance(rows, list) and all(isinstance(r, dict) for r in rows)):
            raise ValueError("'rows' must be a list of feature objects")
        _feature_rows(rows)
        return FeatureRows(_codes(value["codes"], len(rows), "rows"), rows)
    if isinstance(value, list | tuple) and all(isinstance(v, dict) for v in value):
        table = FeatureRows.of(value)
        _feature_rows(table.rows)
        return table
    raise ValueError("expected a list of feature objects or {'rows': [...], 'codes': base64}")


def _feature_json(column: FeatureRows) -> dict[str, Any]:
    return {"rows": column.rows, "codes": _b64(column.codes.astype("<u4").tobytes())}


BoolColumn = Annotated[Bools, BeforeValidator(_bool_column), PlainSerializer(_bool_json)]
IntColumn = Annotated[Ints, BeforeValidator(_int_column), PlainSerializer(_int_json)]
TextColumn = Annotated[StrColumn, BeforeValidator(_str_column), PlainSerializer(_str_json)]
FeatureColumn = Annotated[
    FeatureRows, BeforeValidator(_feature_column), PlainSerializer(_feature_json)
]


def _no_bools() -> Bools:
    return np.zeros(0, dtype=np.bool_)


def _no_strings() -> StrColumn:
    return StrColumn.of([])


class WorldOutcomes(BaseModel):
    """One world's columns, in episode order (empty when the world did not complete)."""

    model_config = ConfigDict(extra="forbid", arbitrary_types_allowed=True)

    name: str
    status: WorldStatus = WorldStatus.completed
    error: str | None = None
    outcomes: BoolColumn = Field(default_factory=_no_bools)
    intervened: BoolColumn = Field(default_factory=_no_bools)
    shocks: TextColumn = Field(default_factory=_no_strings)
    inherited: TextColumn = Field(default_factory=_no_strings)
    code_digest: str = ""
    snapshot: str = ""
    world_seconds: float = 0.0

    @property
    def successes(self) -> int:
        return int(np.count_nonzero(self.outcomes))


class StoredColumns(BaseModel):
    """One world's columns over one chunk, as the durable path stores them (the artifact a
    ``BatchOutcome`` names): validated once from the runner's lists, written compactly."""

    model_config = ConfigDict(extra="forbid", arbitrary_types_allowed=True)

    outcomes: BoolColumn
    intervened: BoolColumn
    shocks: TextColumn
    inherited: TextColumn

    @property
    def successes(self) -> int:
        return int(np.count_nonzero(self.outcomes))


def concat_stored(parts: Sequence[StoredColumns]) -> dict[str, Any]:
    """A world's chunks in the order given, as ``WorldOutcomes`` columns."""
    if not parts:
        return {}
    return {
        "outcomes": np.concatenate([p.outcomes for p in parts]),
        "intervened": np.concatenate([p.intervened for p in parts]),
        "shocks": concat_strings([p.shocks for p in parts]),
        "inherited": concat_strings([p.inherited for p in parts]),
    }


class ExperimentOutcomes(BaseModel):
    """Every world's columns over the experiment's episodes (see
    ``forklab.experiments.experiment.columnar``)."""

    model_config = ConfigDict(extra="forbid", arbitrary_types_allowed=True)

    episodes: IntColumn
    requested: IntColumn
    resolved: IntColumn
    checkpoints: TextColumn
    features: FeatureColumn
    worlds: list[WorldOutcomes]

    def world(self, name: str) -> WorldOutcomes:
        for w in self.worlds:
            if w.name == name:
                return w
        raise KeyError(name)


def from_batch(
    batch: ColumnBatch | Batch, code_digest: str, snapshot: str, seconds: float
) -> ExperimentOutcomes:
    """Wrap a local-twin batch (the runner's lists become columns); compute time is shared
    out by world count.

    Not validated again: the twin built every column itself (``model_construct``), and
    checking each of millions of entries would cost more than the analysis."""
    columnar = isinstance(batch["features"], FeatureRows)
    cols = cast(ColumnBatch, batch) if columnar else to_columns(cast(Batch, batch))
    per_world = seconds / max(1, len(cols["worlds"]))
    return ExperimentOutcomes.model_construct(
        episodes=cols["episodes"],
        requested=cols["requested"],
        resolved=cols["resolved"],
        checkpoints=cols["checkpoints"],
        features=cols["features"],
        worlds=[
            WorldOutcomes.model_construct(
                name=name,
                status=WorldStatus.completed,
                error=None,
                **world,
                code_digest=code_digest,
                snapshot=snapshot,
                world_seconds=per_world,
            )
            for name, world in cols["worlds"].items()
        ],
    )


_DIGITS = bytes.maketrans(b"\x00\x01", b"01")


def _outcome_digits(outcomes: Sequence[bool] | Bools) -> bytes:
    """``0,1,1,…``: the inside of the canonical JSON list of the outcomes as integers.

    Byte operations in C (the array's bytes, ``translate``, a strided slice assignment)."""
    if not len(outcomes):
        return b""
    digits = bools(outcomes).tobytes().translate(_DIGITS)
    text = bytearray(b"," * (2 * len(digits) - 1))
    text[::2] = digits
    return bytes(text)


def outcomes_digest(outcomes: ExperimentOutcomes, world_names: list[str]) -> str:
    """sha256 over the ordered per-episode outcomes of the named worlds, in that order.

    The digest of ``canonical_json([[name, [0, 1, …]], …])``, written out column by column
    (a JSON list of millions of Python ints would cost more than the whole analysis).
    """
    h = hashlib.sha256(b"[")
    for i, name in enumerate(world_names):
        h.update(b"," if i else b"")
        h.update(b"[" + canonical_json(name).encode() + b",[")
        h.update(_outcome_digits(outcomes.world(name).outcomes))
        h.update(b"]]")
    h.update(b"]")
    return h.hexdigest()
