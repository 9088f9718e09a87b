"""``forklab <command>`` imports what that command needs, not every command's modules: the
operator commands (``start``, ``approve``, ``status``, ``watch``…) used to import the
worker, the analysis stack (scipy, matplotlib), Braintrust and the store clients at start,
about two seconds before they did anything. And ``forklab.cli.main.COMMANDS``, which says which
module registers each command, says what the modules register."""

from __future__ import annotations

import argparse
import importlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from forklab.cli.main import COMMANDS, REGISTRARS, build_parser

ROOT = Path(__file__).resolve().parent.parent

#: Modules an operator command must not import to parse its words: the worker and its
#: workflow (every activity), the analysis and its rendering, the eval and agent SDKs, the
#: S3 and PostgreSQL clients.
HEAVY = (
    "forklab.workers.experiment.worker",
    "forklab.workflows.experiment.workflow",
    "forklab.experiments.experiment.analysis.build",
    "scipy",
    "matplotlib",
    "braintrust",
    "agents",
    "boto3",
    "botocore",
    "psycopg",
)

#: Runs ``forklab <command> --help`` through the CLI's own entry (``dispatch``) in a fresh
#: interpreter, and prints which of the heavy modules are then imported.
_PROBE = """
import contextlib, io, json, sys
from forklab.cli.main import dispatch
words, heavy = json.loads(sys.argv[1]), json.loads(sys.argv[2])
out = io.StringIO()
with contextlib.redirect_stdout(out), contextlib.suppress(SystemExit):
    dispatch(words)
assert out.getvalue().startswith("usage: forklab " + words[0]), out.getvalue()[:300]
print(json.dumps(sorted(name for name in heavy if name in sys.modules)))
"""


def _choices(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    actions = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    assert len(actions) == 1
    choices: dict[str, argparse.ArgumentParser] = actions[0].choices
    return choices


def _subcommands(parser: argparse.ArgumentParser) -> list[str]:
    return list(_choices(parser))


@pytest.mark.parametrize(
    ("command", "also_light"),
    [
        ("approve", ()),
        ("reject", ()),
        ("start", ()),
        ("status", ("numpy", "temporalio", "forklab.workflows.experiment.messages")),
        ("report", ()),
        # the agent-run commands need neither the experiment's models nor numpy
        ("watch", ("numpy", "forklab.workflows.experiment.messages")),
        ("fork", ("numpy", "forklab.workflows.experiment.messages")),
        ("plan", ("numpy",)),
    ],
)
def test_an_operator_command_imports_neither_the_worker_nor_the_analysis(
    command: str, also_light: tuple[str, ...]
) -> None:
    heavy = [*HEAVY, *also_light]
    done = subprocess.run(
        [sys.executable, "-c", _PROBE, json.dumps([command, "--help"]), json.dumps(heavy)],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},  # this tree's forklab, whatever is installed
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == [], f"forklab {command} --help imported these"


def test_the_command_table_names_every_command_the_full_parser_has_in_its_order() -> None:
    assert _subcommands(build_parser()) == list(COMMANDS)
    assert len(COMMANDS) == sum(len(names) for _, _, names in REGISTRARS)  # no name twice


@pytest.mark.parametrize(("module", "function", "names"), REGISTRARS)
def test_each_module_registers_exactly_the_commands_the_table_gives_it(
    module: str, function: str, names: tuple[str, ...]
) -> None:
    parser = argparse.ArgumentParser(prog="forklab")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    getattr(importlib.import_module(module), function)(sub)
    assert _subcommands(parser) == list(names)
    for name in names:
        assert COMMANDS[name] == (module, function)
        assert _subcommands(build_parser(name)) == list(names)


@pytest.mark.parametrize("words", [[], ["--help"], ["-h"], ["appr"], ["--", "approve"]])
def test_anything_but_a_command_gets_the_full_listing(words: list[str]) -> None:
    """``forklab``, ``--help``, a misspelt or abbreviated command: argparse lists every
    command, in its help and in its "invalid choice" error, as before (from the catalogue,
    ``tests/test_cli_startup.py``)."""
    first = words[0] if words else None
    assert _subcommands(build_parser(first)) == list(COMMANDS)
