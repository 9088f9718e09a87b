"""The workload contract: each newcomer mistake stops ``forklab plan`` with one exact sentence
(exit 2, no traceback unless ``--debug``), and the durable path with the same sentence,
before approval, without retrying, and restartable under the same id."""

from __future__ import annotations

import inspect
import os
from pathlib import Path
from typing import Any

import newcomer_workloads as nw
import pytest
import yaml
from orchestration_lab import Lab, make_spec
from temporalio.client import WorkflowFailureError
from temporalio.exceptions import ApplicationError

from forklab.cli.experiment.experiment_commands import start_experiment
from forklab.runtime.contract import ContractViolation
from forklab.runtime.file_format import WorldPlan
from forklab.runtime.runner import continue_world, run_prefix
from forklab.workflows.experiment.messages import Stage, Status, workflow_id
from tests.helpers import plan_json, run_cli

FILE = os.path.relpath(inspect.getfile(nw))
JSON_RULE = (
    "state must be plain JSON (dicts with str keys, lists, str, int, finite float, bool, None) "
    "so that every world forks from the same bytes"
)


def marker_line(cls: type, method: str) -> int:
    """The line of ``cls.method`` that carries the ``MISTAKE`` marker."""
    lines, first = inspect.getsourcelines(getattr(cls, method))
    (offset,) = [i for i, line in enumerate(lines) if "MISTAKE" in line]
    return first + offset


def def_line(cls: type, method: str) -> int:
    return inspect.getsourcelines(getattr(cls, method))[1]


def spec_file(tmp_path: Path, workload: str, **params: Any) -> Path:
    spec = {
        "id": "support",
        "hypothesis": {"text": "escalating rescues tickets", "expected": {"escalate": "decrease"}},
        "seed": 3,
        "episodes": 40,
        "workload": {"name": f"newcomer_workloads:{workload}", "params": params},
        "worlds": [
            {"name": "baseline", "role": "baseline"},
            {"name": "escalate", "role": "treatment", "intervention": {"name": "escalate"}},
        ],
    }
    path = tmp_path / "support.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


MISTAKES: dict[str, tuple[str, dict[str, Any], str]] = {
    "outcome returns a count": (
        "OutcomeCount",
        {"p_fail": 1.0},
        f"OutcomeCount.outcome() returned int 5, not a bool (return True when the episode "
        f"succeeded) at {FILE}:{def_line(nw.OutcomeCount, 'outcome')} "
        "(episode 0, world baseline, step 3 after the fork)",
    ),
    "outcome returns None": (
        "OutcomeMaybe",
        {"p_fail": 1.0},
        f"OutcomeMaybe.outcome() returned NoneType None, not a bool (return True when the "
        f"episode succeeded) at {FILE}:{def_line(nw.OutcomeMaybe, 'outcome')} "
        "(episode 0, world baseline, step 3 after the fork)",
    ),
    "outcome returns a label": (
        "OutcomeLabel",
        {"p_fail": 1.0},
        f"OutcomeLabel.outcome() returned str 'open', not a bool (return True when the "
        f"episode succeeded) at {FILE}:{def_line(nw.OutcomeLabel, 'outcome')} "
        "(episode 0, world baseline, step 3 after the fork)",
    ),
    "a set in the state": (
        "SetInState",
        {"p_fail": 1.0},
        f"SetInState.step() left a set at state['seen']; {JSON_RULE} at "
        f"{FILE}:{def_line(nw.SetInState, 'step')} (episode 0, prefix, step 2)",
    ),
    "step raises": (
        "StepRaises",
        {},
        f"StepRaises.step() raised KeyError: 'consec_fails' at "
        f"{FILE}:{marker_line(nw.StepRaises, 'step')} (episode 0, prefix, step 2)",
    ),
    "a feature in some episodes only": (
        "FeatureSometimes",
        {"p_fail": 0.0, "fork_at": 1},
        "FeatureSometimes.features() returned no 'last_error', which feature_types declares "
        "(return every declared feature in every episode; declare it e.g. 'str | None' and "
        "return None when it has no value) at "
        f"{FILE}:{def_line(nw.FeatureSometimes, 'features')} (episode 0, prefix, step 1)",
    ),
    "a feature that is None": (
        "FeatureNone",
        {"p_fail": 0.0, "fork_at": 1},
        "FeatureNone.features() returned 'last_error' = None (NoneType) but feature_types "
        "declares str; declare it 'str | None' if it may be missing at "
        f"{FILE}:{def_line(nw.FeatureNone, 'features')} (episode 0, prefix, step 1)",
    ),
}


@pytest.mark.parametrize("mistake", list(MISTAKES))
def test_plan_stops_with_one_sentence(
    mistake: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    workload, params, sentence = MISTAKES[mistake]
    path = spec_file(tmp_path, workload, **params)
    code, out, err = run_cli(capsys, "plan", str(path))
    assert (code, out) == (2, "")
    assert err == f"forklab: error: {path}: {sentence}\n"


def test_plan_with_two_processes_gives_the_same_sentence(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    workload, params, sentence = MISTAKES["step raises"]
    path = spec_file(tmp_path, workload, **params)
    code, _, err = run_cli(capsys, "plan", str(path), "--processes", "2")
    assert code == 2 and err == f"forklab: error: {path}: {sentence}\n"


def test_debug_shows_the_traceback(tmp_path: Path) -> None:
    workload, params, sentence = MISTAKES["step raises"]
    from forklab.cli.main import dispatch

    with pytest.raises(ContractViolation) as caught:
        dispatch(["plan", str(spec_file(tmp_path, workload, **params)), "--debug"])
    assert str(caught.value) == sentence
    assert isinstance(caught.value.__cause__, KeyError)  # the workload's own traceback


def test_intervene_gets_its_declared_defaults_under_the_spec_params() -> None:
    workload = nw.RecordsParams({"p_fail": 1.0})
    cp = run_prefix(workload, 0, 0)
    seen = []
    for params in ({}, {"factor": 0.25}):
        plan = WorldPlan(name="escalate", intervention="escalate", params=params)

        class Keep(nw.RecordsParams):
            def outcome(self, state: dict[str, Any]) -> bool:
                seen.append(state["got"])
                return False

        continue_world(Keep({"p_fail": 1.0}), cp["state"], 0, 0, plan)
    assert seen == [{"factor": 0.5}, {"factor": 0.25}]


def test_a_correct_workload_with_an_optional_feature_plans(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    report = plan_json(capsys, spec_file(tmp_path, "SupportTicket"))
    (row,) = report["comparisons"]
    values = {s["value"] for s in row["slices"] if s["feature"] == "last_error"}
    assert values == {"timeout", None}  # the missing value is a slice of its own
    assert report["worlds"][1]["failures"] < report["worlds"][0]["failures"]


# --- the durable path ----------------------------------------------------------------------
async def test_durable_path_refuses_before_approval_with_the_same_sentence(lab: Lab) -> None:
    workload, params, sentence = MISTAKES["step raises"]
    # The rehearsal runs in a box, where the file lies in the bundle's root.
    sentence = sentence.replace(FILE, os.path.basename(FILE))
    spec = make_spec(
        workload={"name": f"newcomer_workloads:{workload}", "params": params},
        hypothesis={"text": "escalating rescues tickets", "expected": {}},
        worlds=[
            {"name": "baseline", "role": "baseline"},
            {"name": "escalate", "role": "treatment", "intervention": {"name": "escalate"}},
        ],
    )
    await start_experiment(lab.settings, spec)
    handle = lab.client.get_workflow_handle(workflow_id(spec.id))
    with pytest.raises(WorkflowFailureError) as failed:
        await handle.result()
    cause = failed.value.cause  # the workflow's failure, whose message the Temporal UI shows
    assert isinstance(cause, ApplicationError) and cause.message == sentence
    view = await lab.status(handle)
    assert view.status is Status.failed and view.stage is Stage.done
    assert view.error == sentence
    root = lab.ledger.experiment(spec.id)
    assert root is not None and root.status == "failed" and root.error == sentence
    history = await handle.fetch_history()
    attempts = [
        e.activity_task_started_event_attributes.attempt
        for e in history.events
        if e.HasField("activity_task_started_event_attributes")
    ]
    assert attempts and max(attempts) == 1  # a deterministic failure is never retried
    assert "run_prefixes" not in await lab.activity_types(handle)  # no compute was spent
    # Failed before approval: the same id can be started again (and fails the same way).
    await start_experiment(lab.settings, spec)
    with pytest.raises(WorkflowFailureError):
        await handle.result()
    assert (await lab.status(handle)).error == sentence


def test_a_method_left_to_the_base_class_says_to_override_it() -> None:
    class NoIntervene(nw.SupportTicket):
        intervene = nw.Workload.intervene  # as if never overridden

    cp = run_prefix(NoIntervene({"p_fail": 1.0}), 0, 0)
    plan = WorldPlan(name="escalate", intervention="escalate")
    with pytest.raises(ContractViolation) as caught:
        continue_world(NoIntervene({"p_fail": 1.0}), cp["state"], 0, 0, plan)
    assert str(caught.value) == (
        "NoIntervene does not implement intervene(); override it (see docs/workloads.md) "
        "(episode 0, world escalate, step 0 after the fork)"
    )
