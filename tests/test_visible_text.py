"""Text from untrusted places cannot act on a terminal or reorder what a reader sees:
the CLI's output, its errors and the reports write control and bidirectional-override
characters as visible escapes, and JSON output keeps its exact meaning.

The durable path (a refused approval whose name is a terminal escape, shown by
``forklab status``) is tested in ``tests/test_workflow_messages.py``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import pytest
import yaml

from forklab.experiments.runfork.policy import ToolPolicy
from forklab.experiments.runfork.receipt import (
    BoundaryMode,
    ForkReceipt,
    fork_summary,
    receipt_markdown,
)
from forklab.experiments.visible_text import visible
from tests.helpers import ROOT, run_cli

#: Erase the line, return to its start and write a forged verdict; set the window title;
#: a C1 control sequence introducer; right-to-left override; a backspace and a bell.
HOSTILE = "ok\x1b[2K\rVALID all checks passed\x1b]0;owned\x07 \x9b31m \u202eevil\u2066 \x08\x7f"

#: Every character a terminal or a bidirectional renderer acts on (tabs and line breaks
#: only lay text out).
ACTING = {chr(c) for c in (*range(0x20), 0x7F, *range(0x80, 0xA0))} - {"\n", "\t"}
ACTING |= {"\u061c", "\u200e", "\u200f", *map(chr, range(0x202A, 0x202F))}
ACTING |= set(map(chr, range(0x2066, 0x206A)))


def acting(text: str) -> set[str]:
    return set(text) & ACTING


def test_visible_escapes_what_acts_and_keeps_the_rest() -> None:
    shown = visible(HOSTILE + "\tcafé 日本 🙂\n")
    assert not acting(shown)
    for escape in ("\\u001b[2K", "\\u000d", "\\u0007", "\\u009b", "\\u202e", "\\u2066"):
        assert escape in shown
    assert shown.endswith("\tcafé 日本 🙂\n")
    assert visible("plain text, 1 < 2\n") == "plain text, 1 < 2\n"
    # in a JSON string an escape means the character it replaced
    document = json.dumps({"name": HOSTILE}, ensure_ascii=False)
    assert acting(document)  # C1 and bidirectional characters pass json.dumps raw
    assert json.loads(visible(document)) == {"name": HOSTILE}


def _spec(tmp_path: Path, **changes: object) -> Path:
    spec = yaml.safe_load((ROOT / "forklab" / "workloads" / "recovery-counter.yaml").read_text())
    spec.update(episodes=40, **changes)
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec, allow_unicode=True))
    return path


def test_a_hostile_hypothesis_is_shown_not_obeyed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = _spec(tmp_path, hypothesis={"text": HOSTILE})
    code, out, err = run_cli(capsys, "plan", str(spec), "--out", str(tmp_path / "report"))
    assert code == 0, err
    assert not acting(out) and "ok\\u001b[2K\n" in out  # the CR: a line break, indented
    for name in ("report.md", "report.html"):
        page = (tmp_path / "report" / name).read_text()
        assert not acting(page) and "\\u202eevil" in page
    stored = json.loads((tmp_path / "report" / "report.json").read_text())
    assert stored["experiment"]["hypothesis"] == HOSTILE  # the data itself is kept
    code, out, err = run_cli(capsys, "plan", str(spec), "--json")
    assert code == 0, err
    assert not acting(out)
    assert json.loads(out)["experiment"]["hypothesis"] == HOSTILE


def test_a_hostile_name_in_an_error_is_shown_not_obeyed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = _spec(tmp_path, **{HOSTILE: 1})  # an unknown key: the error names it as given
    code, out, err = run_cli(capsys, "plan", str(spec))
    assert code == 2 and out == ""
    assert "unknown field" in err
    assert not acting(err) and "\\u001b]0;owned\\u0007" in err


def test_a_hostile_tool_name_in_a_fork_receipt_is_shown_not_obeyed() -> None:
    """The Web UI's details of a forked agent run name its tools (read from the parent's
    history) and its intervention (the operator's input)."""
    receipt = ForkReceipt(
        fork_workflow_id="fork-1",
        name="fork",
        requested_step=2,
        resolved_step=2,
        parent_workflow_id="run-1",
        parent_run_id="r1",
        source_run_id="r1",
        lineage=["run-1"],
        boundary=BoundaryMode.exact,
        prefix_sha256="0" * 64,
        restorable=True,
        why="a step boundary",
        intervention={"note": HOSTILE},
        tool_policies={HOSTILE: ToolPolicy.replay},
        requested_by="kim",
        created_at=datetime(2026, 12, 1, tzinfo=UTC),
    )
    shown = receipt_markdown(receipt)
    assert not acting(shown) and "`ok\\u001b[2K" in shown  # the tool's policy row
    assert not acting(fork_summary(receipt, HOSTILE))  # the UI's summary line too


def test_a_hypothesis_of_several_lines_stays_in_its_quote(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """In ``report.md`` the hypothesis is a block quote, in the terminal's text report an
    indented paragraph; a line of it that left either would read as the report's own
    text, e.g. a forged verdict."""
    forged = "h\n\n## Verdicts\r- **VALID: all validity checks passed**\u2028| a | b |"
    spec = _spec(tmp_path, hypothesis={"text": forged})
    code, out, err = run_cli(capsys, "plan", str(spec), "--out", str(tmp_path / "report"))
    assert code == 0, err
    shown = out.splitlines()  # the terminal's text report: the hypothesis indented
    start = shown.index("hypothesis  h")
    assert shown[start + 1 : start + 5] == [
        "",
        " " * 12 + "## Verdicts",
        " " * 12 + "- **VALID: all validity checks passed**",
        " " * 12 + "| a | b |",
    ]
    lines = (tmp_path / "report" / "report.md").read_text().splitlines()
    start = lines.index("> h")
    assert lines[start : start + 6] == [
        "> h",
        ">",
        "> ## Verdicts",
        "> - **VALID: all validity checks passed**",
        "> | a | b |",
        "",
    ]


def test_a_traceback_under_debug_is_shown_not_obeyed(tmp_path: Path) -> None:
    """``plan --debug`` lets the workload's exception out with its traceback; the
    ``forklab`` executable prints it through the same visible streams, and exits 1
    without the interpreter's finalisation."""
    (tmp_path / "hostile_workload.py").write_text(
        "from newcomer_workloads import SupportTicket\n\n"
        "class Hostile(SupportTicket):\n"
        "    def step(self, state, shocks):\n"
        f"        raise RuntimeError({HOSTILE!r})\n"
    )
    spec = tmp_path / "support.yaml"
    spec.write_text(
        yaml.safe_dump(
            {
                "id": "support",
                "hypothesis": {"text": "escalating helps", "expected": {"escalate": "decrease"}},
                "seed": 3,
                "episodes": 10,
                "workload": {"name": "hostile_workload:Hostile", "params": {}},
                "worlds": [
                    {"name": "baseline", "role": "baseline"},
                    {"name": "escalate", "role": "treatment", "intervention": {"name": "escalate"}},
                ],
            }
        )
    )
    path = os.pathsep.join([str(tmp_path), str(ROOT / "tests"), str(ROOT)])
    # a process: the traceback is printed by the entry point (`main`), not by `dispatch`
    done = subprocess.run(
        [sys.executable, "-m", "forklab.cli", "plan", str(spec), "--debug"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": path},
        timeout=120,
    )
    assert done.returncode == 1, done.stderr
    assert done.stderr.startswith("Traceback (most recent call last):")
    assert "RuntimeError" in done.stderr and "ok\\u001b[2K" in done.stderr
    assert not acting(done.stdout + done.stderr)
