"""A misspelt spec key is named first, with the field it was meant to be: ``episods:`` used
to say "field episodes: Field required (and 1 more)" and hide the typo that caused it."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from forklab.experiments.experiment.spec import SpecError, parse_spec

ROOT = Path(__file__).resolve().parent.parent
SPEC = yaml.safe_load((ROOT / "forklab" / "workloads" / "retry-cascade.yaml").read_text())


def refusal(spec: dict[str, object]) -> str:
    with pytest.raises(SpecError) as refused:
        parse_spec(yaml.safe_dump(spec), "s.yaml")
    return str(refused.value)


def test_a_misspelt_required_field_is_named_before_the_field_it_leaves_missing() -> None:
    spec = dict(SPEC)
    spec["episods"] = spec.pop("episodes")
    assert refusal(spec) == (
        "s.yaml: field episods: unknown field; did you mean episodes? (and 1 more)"
    )


def test_a_misspelt_nested_field_is_named_with_its_path() -> None:
    spec = dict(SPEC)
    budget = dict(spec["budget"])  # type: ignore[call-overload]
    budget["max_world_secs"] = budget.pop("max_world_seconds")
    spec["budget"] = budget
    assert refusal(spec) == (
        "s.yaml: field budget.max_world_secs: unknown field; did you mean max_world_seconds?"
    )


def test_a_misspelt_field_in_a_list_item_is_found_through_the_list() -> None:
    spec = dict(SPEC)
    worlds = [dict(w) for w in spec["worlds"]]  # type: ignore[attr-defined]
    worlds[1]["rol"] = worlds[1].pop("role")
    spec["worlds"] = worlds
    message = refusal(spec)
    assert message.startswith("s.yaml: field worlds[1].rol: unknown field; did you mean role?")


def test_a_key_like_no_field_lists_the_fields_there() -> None:
    spec = dict(SPEC)
    spec["budget"] = {**spec["budget"], "zzzz": 1}  # type: ignore[dict-item]
    message = refusal(spec)
    assert message.startswith("s.yaml: field budget.zzzz: unknown field; the fields here are ")
    assert "max_world_seconds" in message
