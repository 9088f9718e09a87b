"""Bad specs: exit code 2, one clear line naming the field and the fix, no traceback."""

from __future__ import annotations

import inspect
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from experiments.workloads.counter_recovery import CounterRecovery
from tests.helpers import ROOT, run_cli

GOOD = yaml.safe_load((ROOT / "experiments" / "recovery-counter.yaml").read_text())


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
    "unknown top-level field": (variant(sede=3), ["field sede", "Extra inputs are not permitted"]),
    "yaml syntax error": (
        "id: x\nworlds: [\n  - name: a\n",
        ["YAML/JSON syntax error at line", "fix the file's syntax"],
    ),
    "not a mapping": ("- just\n- a list\n", ["expected a mapping"]),
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
        f"ended at 9; boundary() is defined at experiments/workloads/counter_recovery.py:{line} "
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


def test_start_refuses_a_history_limit_out_of_bounds(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write(tmp_path, GOOD)
    code, _, err = run_cli(capsys, "start", str(path), "--history-events", "5")
    assert code == 2
    assert err == (
        "forklab: error: --history-events is 5; give a number from 100 to 40000 (default 3500)\n"
    )
