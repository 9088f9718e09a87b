"""``forklab --help`` and ``forklab status`` answer before the heavy modules load: the listing
comes from ``forklab.cli.catalogue`` (no command's module), and ``status`` against an address
where nothing listens says so before Temporal's SDK or the experiment's models are imported.
The catalogue's help lines are the ones the modules register, and every command has one."""

from __future__ import annotations

import argparse
import importlib
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from forklab.cli.catalogue import CATALOGUE
from forklab.cli.main import COMMANDS, REGISTRARS

ROOT = Path(__file__).resolve().parent.parent

#: What ``forklab --help`` must not load: the SDK, pydantic (and so every model), numpy, and
#: any command's module.
NOT_FOR_HELP = (
    "temporalio",
    "pydantic",
    "pydantic_core",
    "numpy",
    "scipy",
    "yaml",
    "cryptography",
    *sorted({module for module, _, _ in REGISTRARS}),
)
#: What ``forklab status EXP`` against no server must not load.
NOT_FOR_STATUS = ("temporalio", "numpy", "scipy", "forklab.workflows.experiment.messages")

#: Runs ``main.dispatch`` in a fresh interpreter and prints its exit code, what it wrote to
#: stdout and stderr, and which of the given modules are then loaded.
_PROBE = """
import contextlib, io, json, sys
from forklab.cli.main import dispatch
words, watched = json.loads(sys.argv[1]), json.loads(sys.argv[2])
out, err = io.StringIO(), io.StringIO()
code = None
with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
    try:
        code = dispatch(words)
    except SystemExit as exc:
        code = exc.code
loaded = sorted(n for n in watched if n in sys.modules)
print(json.dumps({"code": code, "out": out.getvalue(), "err": err.getvalue(), "loaded": loaded}))
"""


def probe(words: list[str], watched: tuple[str, ...], env: dict[str, str]) -> dict[str, object]:
    done = subprocess.run(
        [sys.executable, "-c", _PROBE, json.dumps(words), json.dumps(list(watched))],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT), **env},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    result: dict[str, object] = json.loads(done.stdout)
    return result


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_help_lists_every_command_and_loads_none_of_the_heavy_modules() -> None:
    result = probe(["--help"], NOT_FOR_HELP, {})
    assert result["code"] == 0
    out = str(result["out"])
    assert out.startswith("usage: forklab")
    for name in COMMANDS:
        assert f"    {name}" in out, name
    assert result["loaded"] == [], "forklab --help imported these"


def test_status_against_no_server_answers_before_the_sdk_loads(tmp_path: Path) -> None:
    env = {"FORKLAB_ADDRESS": f"127.0.0.1:{closed_port()}", "FORKLAB_HOME": str(tmp_path)}
    result = probe(["status", "some-experiment"], NOT_FOR_STATUS, env)
    assert result["code"] == 1
    assert "cannot reach Temporal at 127.0.0.1:" in str(result["err"])
    assert result["out"] == ""
    assert result["loaded"] == [], "forklab status imported these before failing"


def test_status_without_an_id_shows_the_services_and_loads_no_sdk(tmp_path: Path) -> None:
    env = {"FORKLAB_ADDRESS": f"127.0.0.1:{closed_port()}", "FORKLAB_HOME": str(tmp_path)}
    result = probe(["status", "--json"], NOT_FOR_STATUS, env)
    assert result["code"] == 0, result["err"]
    view = json.loads(str(result["out"]))
    assert view["temporal_reachable"] is False
    assert view["home"] == str(tmp_path.resolve())
    assert set(view["services"]) == {
        "server",
        "worker",
        "agent-worker",
        "model-server",
        "effects-service",
    }
    assert all(pid is None for pid in view["services"].values())
    assert result["loaded"] == []


def test_version_prints_the_installed_version() -> None:
    from importlib.metadata import version

    result = probe(["--version"], ("temporalio", "pydantic"), {})
    assert result["code"] == 0
    assert result["out"] == f"forklab {version('forklab')}\n"
    assert result["loaded"] == []


def test_every_command_has_a_catalogue_entry_with_the_help_its_module_registers() -> None:
    assert set(CATALOGUE) >= set(COMMANDS), "add these to forklab/cli/catalogue.py"
    for module, function, names in REGISTRARS:
        parser = argparse.ArgumentParser(prog="forklab")
        sub = parser.add_subparsers(dest="command", metavar="COMMAND")
        getattr(importlib.import_module(module), function)(sub)
        helps = {action.dest: action.help for action in sub._choices_actions}
        for name in names:
            assert helps[name] == CATALOGUE[name].help, name


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_each_commands_help_ends_with_its_example(command: str) -> None:
    from forklab.cli.main import build_parser

    parser = build_parser(command)
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    text = action.choices[command].format_help()
    assert text.rstrip().endswith(f"example:\n  {CATALOGUE[command].example}")
    assert CATALOGUE[command].example.startswith(("forklab ", "eval ", "FORKLAB_"))


def test_plan_runs_and_reports_without_importing_scipy() -> None:
    """A plan without a sequential design computes every statistic it reports without
    ``scipy`` (its import alone was a quarter of a second of every ``forklab plan``);
    a sequential design imports it where it computes its boundaries."""
    result = probe(["plan", "examples/flaky-tool.yaml", "--json"], ("scipy",), {})
    assert result["code"] == 0, result["err"]
    report = json.loads(str(result["out"]))
    assert report["valid"] is True
    assert result["loaded"] == [], "forklab plan imported these"
