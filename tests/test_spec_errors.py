"""Bad specs: exit code 2, one clear line naming the field and the fix, no traceback."""

from __future__ import annotations

import inspect
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError
from temporalio.api.common.v1 import Payload
from temporalio.contrib.pydantic import pydantic_data_converter

from forklab.experiments.experiment.spec import Role, parse_spec
from forklab.workflows.experiment.messages import ExperimentInput
from forklab.workloads.counter_recovery import CounterRecovery
from tests.helpers import ROOT, run_cli

GOOD = yaml.safe_load((ROOT / "forklab" / "workloads" / "recovery-counter.yaml").read_text())


def write(tmp_path: Path, data: object, name: str = "spec.yaml") -> Path:
    path = tmp_path / name
    path.write_text(data if isinstance(data, str) else yaml.safe_dump(data))
    return path


def variant(**changes: object) -> dict[str, object]:
    spec = yaml.safe_load(yaml.safe_dump(GOOD))
    spec.update(changes)
    return spec


CASES = {
    "unknown workload": (
        variant(workload={"name": "counter-recovry"}),
        ["workload.name", "unknown workload 'counter-recovry'", "counter-recovery"],
    ),
    "unknown intervention": (
        variant(
            worlds=[
                {"name": "baseline", "role": "baseline"},
                {"name": "r", "role": "treatment", "intervention": {"name": "refesh"}},
            ],
            hypothesis={"text": "h"},
            analysis={},
        ),
        ["worlds[1].intervention.name", "unknown intervention 'refesh'", "null-refresh, refresh"],
    ),
    "two baselines": (
        variant(
            worlds=[{"name": "a", "role": "baseline"}, {"name": "b", "role": "baseline"}],
            hypothesis={"text": "h"},
            analysis={},
        ),
        ["field worlds", "exactly one world must have role 'baseline' (found 2: a, b)"],
    ),
    "negative episodes": (variant(episodes=-5), ["field episodes", "greater than or equal to 1"]),
    "unknown workload param": (
        variant(workload={"name": "counter-recovery", "params": {"targt": 6}}),
        ["workload.params.targt", "known params:"],
    ),
    "bad workload param": (
        variant(workload={"name": "counter-recovery", "params": {"noise": 2}}),
        ["workload.params.noise", "probability"],
    ),
    "baseline with intervention": (
        variant(
            worlds=[
                {"name": "baseline", "role": "baseline", "intervention": {"name": "refresh"}},
                {"name": "r", "role": "treatment", "intervention": {"name": "refresh"}},
            ],
            hypothesis={"text": "h"},
            analysis={},
        ),
        ["worlds[0]", "takes no intervention"],
    ),
    "unknown top-level field": (
        variant(sede=3),
        ["field sede", "unknown field; did you mean seed?"],
    ),
    "yaml syntax error": (
        "id: x\nworlds: [\n  - name: a\n",
        ["YAML/JSON syntax error at line", "fix the file's syntax"],
    ),
    "not a mapping": ("- just\n- a list\n", ["expected a mapping"]),
    # Wrong types are refused, not coerced (true is not 1, "300" is not 300).
    "boolean episodes": (
        variant(episodes=True),
        ["field episodes", "valid integer", "not the boolean true"],
    ),
    "quoted episodes": (
        variant(episodes="300"),
        ["field episodes", "valid integer", "not the string '300'", "without quotes"],
    ),
    "fractional episodes": (variant(episodes=300.5), ["field episodes", "valid integer"]),
    "boolean seed": (variant(seed=False), ["field seed", "valid integer"]),
    "boolean float field": (
        variant(budget={"max_world_seconds": True}),
        ["field budget.max_world_seconds", "valid number", "not the boolean true"],
    ),
    "quoted float field": (
        variant(analysis={"alpha": "0.05"}),
        ["field analysis.alpha", "valid number", "without quotes"],
    ),
    "quoted boolean": (
        variant(approval={"required": "false"}),
        ["field approval.required", "valid boolean", "not the string 'false'"],
    ),
    "boolean workload param list": (
        variant(
            workload={"name": "counter-recovery", "params": {"slack_choices": [True]}},
        ),
        ["field workload.params.slack_choices", "integers ≥ 0"],
    ),
    "boolean workload param null list": (
        variant(
            workload={"name": "counter-recovery", "params": {"freeze_choices": [None, True]}},
        ),
        ["field workload.params.freeze_choices", "integers or null"],
    ),
    "boolean workload param number": (
        variant(workload={"name": "counter-recovery", "params": {"noise": False}}),
        ["field workload.params.noise", "probability"],
    ),
    "boolean coding-fix param": (
        variant(workload={"name": "coding-fix", "params": {"p_optional": True}}),
        ["field workload.params.p_optional", "probability"],
    ),
    "unhashable coding-fix bug": (
        variant(workload={"name": "coding-fix", "params": {"bugs": [["sub"]]}}),
        ["field workload.params.bugs", "non-empty list drawn from"],
    ),
    "boolean retry-cascade param": (
        variant(workload={"name": "retry-cascade", "params": {"agents": True}}),
        ["field workload.params.agents", "integer in"],
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_spec_exits_2_with_one_clear_line(
    case: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data, needles = CASES[case]
    path = write(tmp_path, data)
    code, out, err = run_cli(capsys, "plan", str(path))
    assert code == 2
    assert out == ""
    assert err.count("\n") == 1, err
    assert err.startswith(f"forklab: error: {path}")
    for needle in needles:
        assert needle in err, err


def test_missing_file_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_cli(capsys, "plan", str(tmp_path / "nope.yaml"))
    assert code == 2
    assert "no such spec file" in err


def test_boundary_that_no_episode_reaches_is_an_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = variant(workload={"name": "counter-recovery", "params": {"fork_step": 20}})
    path = write(tmp_path, spec)
    code, _, err = run_cli(capsys, "plan", str(path))
    assert code == 2
    line = inspect.getsourcelines(CounterRecovery.boundary)[1]
    assert err == (
        f"forklab: error: {path}: CounterRecovery.boundary() asked for cursor 20 but the run "
        f"ended at 9; boundary() is defined at forklab/workloads/counter_recovery.py:{line} "
        "(episode 0, prefix, step 10)\n"
    )


def test_json_spec_is_accepted(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import json

    path = tmp_path / "spec.json"
    path.write_text(json.dumps(GOOD))
    code, out, _ = run_cli(capsys, "plan", str(path), "--json")
    assert code == 0
    assert json.loads(out)["experiment"]["id"] == "recovery-counter"


def test_console_script_prints_no_traceback(tmp_path: Path) -> None:
    path = write(tmp_path, variant(episodes=0))
    # a process: the subject is what the entry point itself prints
    proc = subprocess.run(
        [sys.executable, "-m", "forklab.cli", "plan", str(path)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=False,
    )
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    assert "field episodes" in proc.stderr


def test_schema_lists_the_spec_fields(capsys: pytest.CaptureFixture[str]) -> None:
    import json

    code, out, _ = run_cli(capsys, "schema")
    assert code == 0
    schema = json.loads(out)
    for field in ("id", "hypothesis", "seed", "episodes", "workload", "worlds", "budget"):
        assert field in schema["properties"]
    assert set(schema["required"]) >= {"id", "hypothesis", "seed", "episodes", "workload"}


@pytest.mark.parametrize(
    ("flag", "value", "message"),
    [
        ("--batch-episodes", "0", "--batch-episodes is 0; give a number from 1 to 10000000"),
        (
            "--rehearsal-episodes",
            "-1",
            "--rehearsal-episodes is -1; give a number from 0 to 10000000",
        ),
    ],
)
def test_start_refuses_episode_flags_out_of_bounds_before_anything_is_written(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    flag: str,
    value: str,
    message: str,
) -> None:
    """These ended in a pydantic traceback, after the approver key had been written."""
    monkeypatch.setenv("FORKLAB_HOME", str(tmp_path / "home"))
    path = write(tmp_path, GOOD)
    code, out, err = run_cli(capsys, "start", str(path), flag, value)
    assert (code, out) == (2, "")
    assert err.startswith(f"forklab: error: {message} (default ") and err.count("\n") == 1, err
    assert not (tmp_path / "home").exists()  # no approver key, no bundle


def test_start_refuses_a_history_limit_out_of_bounds(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write(tmp_path, GOOD)
    code, _, err = run_cli(capsys, "start", str(path), "--history-events", "5")
    assert code == 2
    assert err == (
        "forklab: error: --history-events is 5; give a number from 100 to 40000 (default 3500)\n"
    )


@pytest.mark.parametrize("value", [True, "300", 300.0])
def test_a_json_spec_is_read_as_strictly(
    value: object, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write(tmp_path, json.dumps({**GOOD, "episodes": value}), "spec.json")
    code, out, err = run_cli(capsys, "plan", str(path))
    assert (code, out, err.count("\n")) == (2, "", 1), err
    assert f"{path}: field episodes: Input should be a valid integer" in err


def test_the_workflow_input_reads_the_spec_as_plan_does() -> None:
    """``temporal workflow start --input '{"spec": …}'`` goes through the workers' pydantic
    converter (JSON, not YAML): the same spec is valid, the same wrong types refused."""

    def start_input(spec: dict[str, object]) -> ExperimentInput:
        payload = Payload(
            metadata={"encoding": b"json/plain"}, data=json.dumps({"spec": spec}).encode()
        )
        [value] = pydantic_data_converter.payload_converter.from_payloads(
            [payload], [ExperimentInput]
        )
        assert isinstance(value, ExperimentInput)
        return value

    spec = start_input(GOOD).spec
    assert spec == parse_spec(yaml.safe_dump(GOOD), "spec.yaml")
    assert spec.worlds[1].role is Role.treatment
    analysis = {**GOOD["analysis"], "interactions": [["obs_repeated", "cursor"]]}
    assert start_input({**GOOD, "analysis": analysis}).spec.analysis.interactions == [
        ("obs_repeated", "cursor")
    ]
    for field, value in [
        ("episodes", True),
        ("episodes", "300"),
        ("seed", 0.0),
        ("budget", {"max_world_seconds": True}),
        ("approval", {"required": "false"}),
    ]:
        with pytest.raises(ValidationError) as info:
            start_input({**GOOD, field: value})
        assert info.value.errors()[0]["loc"][:2] == ("spec", field)
    budget = start_input({**GOOD, "budget": {"max_world_seconds": 300}}).spec.budget
    assert budget.max_world_seconds == 300.0
