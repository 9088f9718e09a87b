"""The cohort spec: what it accepts, and one sentence naming the field for what it refuses."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from forklab.experiments.cohort.faults import Brownout, SchemaDrift
from forklab.experiments.cohort.fork_point import ForkPointKind
from forklab.experiments.cohort.spec import (
    MAX_CARRIED_BYTES,
    CohortExperimentSpec,
    parse_any_spec,
    parse_cohort_spec,
)
from forklab.experiments.experiment.spec import ExperimentSpec, SpecError, parse_spec
from forklab.experiments.runfork.policy import ToolPolicy

SPEC = """
id: support-fixes
hypothesis:
  text: A stronger model at the failed step rescues failed tickets without harming good ones.
  expected: {bigger: decrease, broken-search: increase}
seed: 7
cohort:
  query: "WorkflowType='SupportAgent' AND StartTime > '2026-11-26T00:00:00Z'"
  limit: 60
  fork_at: failed
  fork_at_succeeded: "tool:send_email#1"
  forks_per_world: 3
  outcome: mypkg.scoring:resolved
  features: mypkg.scoring:features
tools:
  lookup_order: auto
  search: live
worlds:
  - {name: baseline, role: baseline}
  - {name: bigger, role: treatment, model: slow}
  - name: careful
    role: treatment
    prompt_patch: {target: system, mode: append, text: Confirm the refund amount first.}
  - name: noop
    role: placebo
    prompt_patch: {text: "Be yourself."}
  - name: broken-search
    role: positive_control
    faults:
      - {kind: malformed_tool_response, rate: 0.5, tools: [search]}
      - {kind: brownout, rate: 0.2, error: timeout}
"""


def _with(**changes: Any) -> str:
    import yaml

    raw = yaml.safe_load(SPEC)
    for key, value in changes.items():
        node = raw
        *path, last = key.split("__")
        for part in path:
            node = node[int(part)] if part.isdigit() else node[part]
        if value is None:
            del node[last]
        else:
            node[last] = value
    return json.dumps(raw)


def test_a_cohort_spec_reads_and_describes_each_world_in_one_line() -> None:
    spec = parse_cohort_spec(SPEC, "spec.yaml")
    assert spec.cohort.fork_at.kind is ForkPointKind.failed
    assert spec.cohort.fork_at_succeeded is not None
    assert spec.cohort.fork_at_succeeded.text == "tool:send_email#1"
    assert spec.policy("search") is ToolPolicy.live
    assert spec.policy("charge_card") is ToolPolicy.block  # unlisted tools are blocked
    lines = [w.describe() for w in spec.worlds]
    assert lines[0] == "baseline (baseline): the unchanged fork, continued live"
    assert lines[1] == "bigger (treatment): model slow from the fork point"
    assert "50% of calls of search return a malformed response (truncated)" in lines[4]
    assert "20% of model calls fail with timeout" in lines[4]
    assert all("\n" not in line for line in lines)
    assert isinstance(spec.worlds[4].faults[1], Brownout)
    # the digest is stable and changes with the cohort
    again = parse_cohort_spec(SPEC, "spec.yaml")
    assert again.digest() == spec.digest()
    other = parse_cohort_spec(_with(cohort__limit=61), "spec.yaml")
    assert other.digest() != spec.digest()


def test_parse_any_spec_dispatches_and_parse_spec_points_to_the_cohort_reader() -> None:
    assert isinstance(parse_any_spec(SPEC, "s.yaml"), CohortExperimentSpec)
    with pytest.raises(SpecError, match="names a cohort of recorded runs, not a workload"):
        parse_spec(SPEC, "s.yaml")
    workload = Path("forklab/workloads/recovery-counter.yaml").read_text()
    assert isinstance(parse_any_spec(workload, "w.yaml"), ExperimentSpec)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        (
            {"cohort__workflow_ids": ["a", "b"]},
            "field cohort: name either a visibility 'query' or 'workflow_ids', not both",
        ),
        ({"cohort__query": None}, "field cohort: name either a visibility 'query'"),
        (
            {"cohort__query": None, "cohort__workflow_ids": ["a", "a"]},
            "field cohort.workflow_ids: workflow ids must be unique; repeated: a",
        ),
        (
            {"cohort__query": None, "cohort__workflow_ids": ["a", "b", "c"], "cohort__limit": 2},
            "lists 3 workflow ids, over its limit 2",
        ),
        ({"cohort__query": "A\nB"}, "field cohort.query: the query holds a control character"),
        ({"cohort__fork_at": "step:x"}, "field cohort.fork_at: 'step:x' is no fork point"),
        ({"cohort__fork_at": "tool:search#0"}, "field cohort.fork_at.occurrence"),
        ({"cohort__fork_at_succeeded": "failed"}, "a run without a failed step has no such"),
        ({"cohort__forks_per_world": 4}, "forks_per_world must be odd"),
        ({"cohort__forks_per_world": 1}, "field cohort.forks_per_world: Input should be"),
        ({"cohort__outcome": "os.system"}, "field cohort.outcome: String should match"),
        ({"workload": {"name": "recovery-counter"}}, "a spec names a workload or a cohort"),
        ({"worlds__0__model": "slow"}, "the baseline is the unchanged fork (an A/A world)"),
        (
            {"worlds__3__model": "slow"},
            "a placebo is an inert change: a prompt_patch or an intervention descriptor only",
        ),
        ({"worlds__4__faults": []}, "a positive control is a fault known to harm"),
        (
            {"worlds__4__faults": [{"kind": "brownout", "rate": 0.5, "tools": ["x"]}]},
            "a brownout hits model calls; remove 'tools'",
        ),
        ({"worlds__4__faults": [{"kind": "meteor", "rate": 0.5}]}, "faults[0]"),
        ({"worlds__4__faults": [{"kind": "stale_data", "rate": 0}]}, "greater than 0"),
        (
            {"worlds__1__tool_policies": {"charge_card": "live"}},
            "'charge_card' may run live only if the experiment's signed 'tools' list",
        ),
        ({"budget": {"max_forks": 100}}, "the cohort's limit allows up to 900 forks"),
        ({"analysis": {"forks_per_checkpoint": 3}}, "cohort.forks_per_world; remove it"),
        (
            {"analysis": {"sequential": {"looks": 50}}, "cohort__limit": 40},
            "analysis.sequential.looks: 50 looks need at least as many runs",
        ),
        ({"hypothesis__expected": {"nope": "decrease"}}, "names unknown world 'nope'"),
        (
            # 5 worlds' outcomes of 100,000 runs would not fit a continue-as-new
            {"cohort__limit": 100_000, "budget": {"max_forks": 1_500_000}},
            "field cohort.limit: 100000 runs x 5 worlds x 3 forks would carry about 3.0 MB "
            "through each continue-as-new",
        ),
        ({"seed": "7"}, "field seed: Input should be a valid integer, not the string '7'"),
    ],
)
def test_a_bad_cohort_spec_is_one_sentence_naming_the_field(
    changes: dict[str, Any], message: str
) -> None:
    with pytest.raises(SpecError) as info:
        parse_cohort_spec(_with(**changes), "spec.yaml")
    text = str(info.value)
    assert message in text
    assert text.startswith("spec.yaml: ")
    assert "\n" not in text


def test_a_cohort_that_fits_a_continue_as_new_is_accepted_up_to_its_limit() -> None:
    """The bound is on what is carried, not on the runs: 100,000 runs in two worlds fit."""
    spec = parse_cohort_spec(
        _with(
            cohort__limit=100_000,
            budget={"max_forks": 600_000},
            worlds=[
                {"name": "baseline", "role": "baseline"},
                {"name": "bigger", "role": "treatment", "model": "slow"},
            ],
            hypothesis__expected={"bigger": "decrease"},
        ),
        "spec.yaml",
    )
    assert 1_200_000 < spec.carried_bytes() <= MAX_CARRIED_BYTES


def test_a_long_list_of_ids_given_as_a_workflow_input_is_refused_by_what_it_carries() -> None:
    """A spec file stops at 256 KiB; a spec given as a workflow's input does not, and a
    list of ids counts with the outcomes in what each continue-as-new carries."""
    raw = json.loads(
        _with(
            cohort__query=None,
            cohort__workflow_ids=[f"support-run-{i:08d}" for i in range(70_000)],
            cohort__limit=70_000,
            budget={"max_forks": 1_050_000},
        )
    )
    with pytest.raises(ValueError) as info:
        CohortExperimentSpec.model_validate(raw)
    assert (
        "cohort.workflow_ids: 70000 runs x 5 worlds x 3 forks would carry about 3.7 MB "
        "through each continue-as-new (the spec and the outcome of every fork), over the "
        "1.5 MB an experiment may carry under Temporal's 2 MB payload limit; split the "
        "cohort into several experiments, or name it by a query"
    ) in str(info.value)


def test_a_schema_drift_fault_reads_with_its_params() -> None:
    spec = parse_cohort_spec(
        _with(
            worlds__4__faults=[
                {"kind": "schema_drift", "rate": 1, "field": "price", "rename_to": "cost"}
            ]
        ),
        "s.yaml",
    )
    fault = spec.worlds[4].faults[0]
    assert isinstance(fault, SchemaDrift)
    assert fault.rename_to == "cost"
    assert "rename 'price' to 'cost'" in spec.worlds[4].describe()
