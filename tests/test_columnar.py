"""Columnar outcomes: chunks merge to what one run gives, and the boundary encodings
round-trip (and refuse what is not one)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from pydantic import ValidationError

from forklab.experiments.experiment.columnar import (
    StrColumn,
    concat_strings,
    merge_columns,
    to_columns,
    to_lists,
)
from forklab.experiments.experiment.outcomes import (
    ExperimentOutcomes,
    StoredColumns,
    from_batch,
    outcomes_digest,
)
from forklab.runtime.file_format import WorldPlan
from forklab.runtime.runner import run_batch
from forklab.workloads.retry_cascade import RetryCascade

WORLDS = [WorldPlan("baseline"), WorldPlan("restart", "restart"), WorldPlan("placebo", "placebo")]


def test_chunks_merge_to_the_columns_of_one_run() -> None:
    whole = run_batch(RetryCascade(), 2, range(60), WORLDS)
    parts = [
        to_columns(run_batch(RetryCascade(), 2, range(a, a + 20), WORLDS)) for a in (0, 20, 40)
    ]
    merged = merge_columns(parts)
    assert to_lists(merged) == whole
    # the worlds share one table of shocks and inherit the checkpoint column itself
    tables = {id(c["shocks"].values) for c in merged["worlds"].values()}
    assert len(tables) == 1
    assert all(c["inherited"] is merged["checkpoints"] for c in merged["worlds"].values())
    assert len(merged["checkpoints"].values) == 60  # one distinct digest per episode


def test_string_columns_compare_by_value_across_tables() -> None:
    a = StrColumn.of(["x", "y", "x", "z"])
    b = StrColumn.of(["z", "y"])
    joined = concat_strings([StrColumn.of(["x", "y"]), StrColumn.of(["x", "z"])])
    assert joined == a and joined.values == ["x", "y", "z"]
    assert a != b and a[2:] != StrColumn.of(["x", "y"]) and a[2:] == StrColumn.of(["x", "z"])
    assert a == ["x", "y", "x", "z"]


def test_the_boundary_encoding_round_trips_and_is_compact() -> None:
    batch = run_batch(RetryCascade(), 4, range(300), WORLDS)
    out = from_batch(batch, "code", "snap", 1.0)
    dumped = out.model_dump(mode="json")
    back = ExperimentOutcomes.model_validate(json.loads(json.dumps(dumped)))
    names = [w.name for w in WORLDS]
    assert outcomes_digest(back, names) == outcomes_digest(out, names)
    for w, v in zip(out.worlds, back.worlds, strict=True):
        assert np.array_equal(w.outcomes, v.outcomes) and w.shocks == v.shocks
    assert back.features == list(batch["features"]) and back.checkpoints == batch["checkpoints"]
    bits = dumped["worlds"][0]["outcomes"]
    assert bits["n"] == 300 and len(bits["bits"]) == 4 * -(-38 // 3)  # 38 bytes, base64
    stored = StoredColumns.model_validate(batch["worlds"]["restart"])
    assert StoredColumns.model_validate(stored.model_dump(mode="json")).shocks == stored.shocks


@pytest.mark.parametrize(
    ("column", "why"),
    [
        ({"n": 9, "bits": "AA=="}, "'bits' holds 1 bytes, 9 entries need 2"),
        ({"n": 2, "bits": "not base64!"}, "bits is not valid base64"),
        ([1, 0], "expected a list of booleans"),
    ],
)
def test_a_bad_encoding_names_the_field(column: object, why: str) -> None:
    good = {"outcomes": [True], "intervened": [False], "shocks": ["s"], "inherited": ["c"]}
    with pytest.raises(ValidationError, match=why) as err:
        StoredColumns.model_validate(good | {"outcomes": column})
    assert "outcomes" in str(err.value)
    codes = {"values": ["a"], "codes": "AQAAAA=="}  # code 1 into a table of one
    with pytest.raises(ValidationError, match="point past the end of 'values'"):
        StoredColumns.model_validate(good | {"shocks": codes})
