"""The runner's start-up in a box: its command line, and what importing it costs.

Every world batch starts a box that imports the runner, so what the runner imports is
paid once per batch (docs/scaling.md, *per-box start-up*)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from forklab.runtime.box import parse_args

ROOT = Path(__file__).resolve().parent.parent


def test_the_command_line_in_any_order() -> None:
    argv = ["--out", "o.json", "continue", "--request=r.json", "--checkpoints", "c.jsonl"]
    mode, options = parse_args(argv)
    assert mode == "continue"
    assert options == {"out": "o.json", "request": "r.json", "checkpoints": "c.jsonl"}


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["prefix", "--request", "r", "--checkpoints", "c"], "required: --out"),
        (["run", "--request", "r", "--checkpoints", "c", "--out", "o"], "not run"),
        (["prefix", "continue", "--request", "r", "--checkpoints", "c", "--out", "o"], "one mode"),
        (["prefix", "--request", "r", "--checkpoints", "c", "--out"], "expected one argument"),
        (["prefix", "--request", "r", "--checkpoints", "c", "--out", "o", "--x", "1"], "--x"),
    ],
)
def test_a_bad_command_line_exits_2_with_the_usage(
    argv: list[str], says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        parse_args(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: forklab-runner") and says in err


def test_a_box_imports_no_more_than_the_runner_needs() -> None:
    """A workload without files needs none of these; each adds to every box's start."""
    code = (
        "import sys; import forklab.runtime.box, forklab.workloads.retry_cascade; "
        "print(' '.join(sorted(sys.modules)))"
    )
    out = subprocess.run(
        [sys.executable, "-S", "-c", code],
        cwd=ROOT,
        env={"PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert {"argparse", "pathlib", "shutil", "tempfile"}.isdisjoint(out)
