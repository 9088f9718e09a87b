"""The ``forklab`` command: one entry point, one sub-command per operator action."""

from __future__ import annotations

import argparse
import contextlib
import importlib
import io
import os
import sys
import traceback
from collections.abc import Sequence
from typing import NoReturn

from forklab.cli.catalogue import CATALOGUE, epilog
from forklab.cli.errors import CliError
from forklab.cli.terminal import visible_output

#: Every module that registers sub-commands: the module, its function that registers them,
#: and the commands it registers, in the order ``forklab --help`` lists them.
#: ``tests/test_cli_imports.py`` checks that this says what the modules register.
REGISTRARS: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("forklab.cli.experiment.plan_commands", "register", ("schema", "plan")),
    ("forklab.cli.experiment.experiment_commands", "register", ("start", "bundle", "report")),
    ("forklab.cli.experiment.status_commands", "register", ("status", "cancel")),
    ("forklab.cli.experiment.approval_commands", "register", ("approve", "sign", "reject")),
    ("forklab.cli.experiment.keys_command", "register", ("keys",)),
    ("forklab.cli.experiment.cohort_commands", "register", ("cohort",)),
    ("forklab.cli.service_commands", "register", ("server", "worker", "up", "down")),
    ("forklab.cli.experiment.demo_command", "register", ("demo",)),
    (
        "forklab.cli.runfork.fork_commands",
        "register",
        ("fork", "steps", "diff", "trail", "outcome", "promote", "watch"),
    ),
    ("forklab.cli.runfork.agent_services", "register", ("agent-worker",)),
    ("forklab.cli.runfork.team_commands", "register", ("team", "team-worker", "langgraph-worker")),
    ("forklab.cli.runfork.team_fork_commands", "register", ("fork-team",)),
    ("forklab.cli.doctor_command", "register", ("doctor",)),
    ("forklab.cli.evals_command", "register", ("evals",)),
    ("forklab.cli.runfork.workspace_command", "register_layers", ("layers",)),
    ("forklab.cli.list_command", "register", ("list",)),
    ("forklab.cli.habits", "register", ("config", "completion", "temporal")),
)
#: Sub-command → the module and function that register it. ``forklab approve …`` imports
#: ``forklab.cli.experiment.approval_commands`` and what it needs, and none of the other commands'
#: modules (the worker, the analysis stack, the agent framework, the store clients): importing
#: them all took longer than most commands take to run.
COMMANDS: dict[str, tuple[str, str]] = {
    name: (module, function) for module, function, names in REGISTRARS for name in names
}


class _Version(argparse.Action):
    """``forklab --version``: the installed distribution's version, looked up only when
    asked (``importlib.metadata`` reads the installed files)."""

    def __init__(self, option_strings: Sequence[str], dest: str, **kwargs: object) -> None:
        super().__init__(option_strings, dest, nargs=0, help="print ForkLab's version and exit")

    def __call__(self, parser: argparse.ArgumentParser, *_: object) -> NoReturn:
        from importlib.metadata import PackageNotFoundError, version

        try:
            found = version("forklab")
        except PackageNotFoundError:
            found = "unknown (not installed; run from a source tree)"
        print(f"forklab {found}")
        parser.exit()


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The ``forklab`` parser: for a ``command`` named in ``COMMANDS``, with the
    sub-commands its module registers; otherwise with every command listed from
    ``forklab.cli.catalogue`` and none of their modules imported (``forklab --help``,
    a misspelt command, none at all). Help, usage and errors of a command come from its
    own module either way: ``_dispatch`` builds its parser when the listing chose it."""
    parser = argparse.ArgumentParser(
        prog="forklab",
        description="Fork agent runs into counterfactual worlds; count rescues and harms.",
        epilog="`forklab COMMAND --help` gives a command's options and an example.",
    )
    parser.add_argument("--version", action=_Version)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    if command is not None and command in COMMANDS:
        getattr(importlib.import_module(COMMANDS[command][0]), COMMANDS[command][1])(sub)
    else:
        for module, function, names in REGISTRARS:
            if all(name in CATALOGUE for name in names):
                for name in names:
                    entry = sub.add_parser(name, help=CATALOGUE[name].help, add_help=False)
                    entry.add_argument("words", nargs=argparse.REMAINDER)
            else:  # a command the catalogue does not know yet: its module says its help
                getattr(importlib.import_module(module), function)(sub)
    for name, child in sub.choices.items():
        if child.epilog is None and (example := epilog(name)) is not None:
            child.epilog = example
            child.formatter_class = argparse.RawDescriptionHelpFormatter
    return parser


def dispatch(argv: Sequence[str] | None = None) -> int:
    """Run one command in this process and return its exit code. Everything it prints
    goes through ``forklab.cli.terminal.visible_output``."""
    with visible_output():
        return _dispatch(list(sys.argv[1:] if argv is None else argv))


def _dispatch(words: list[str]) -> int:
    if words[:1] == ["temporal"]:  # every later word is the temporal CLI's, flags too
        words = ["temporal", "--", *words[1:]]
    parser = build_parser(words[0] if words else None)
    args = parser.parse_args(words)
    if not hasattr(args, "func"):  # the listing's entry (``forklab -- status x``)
        args = build_parser(args.command).parse_args(words)
    try:
        code: int = args.func(args)
    except CliError as exc:
        print(f"forklab: error: {exc}", file=sys.stderr)
        return exc.code
    except KeyboardInterrupt:
        print("forklab: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        _stop_writing()
        return BROKEN_PIPE_EXIT
    return code


#: Exit code when the reader of our output went away (128 + SIGPIPE, as a shell reports).
BROKEN_PIPE_EXIT = 141


def _stop_writing() -> None:
    """The reader of stdout went away (``forklab … | head -1``): what the command did is
    done; send the rest of its output nowhere, so that flushing cannot fail again."""
    with contextlib.suppress(OSError, ValueError, io.UnsupportedOperation):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())


def main(argv: Sequence[str] | None = None) -> NoReturn:
    """The ``forklab`` executable: run the command, flush its output, and end the process
    with ``os._exit``, skipping interpreter finalisation.

    A command that talked to Temporal leaves the SDK's core runtime behind (Rust threads
    that hold Python objects). Finalisation would run while those threads are alive; when
    one of them then takes the GIL, CPython aborts the process (SIGABRT, "PyGILState_Release:
    thread state ... must be current") after the command has already succeeded. Every file
    a command writes is closed before it returns, so nothing is lost by skipping it.

    An exception no command turned into an error sentence (a bug, or ``plan --debug``'s
    workload traceback) is printed here, still through ``visible_output``: its message may
    hold a workload's or a server's text.
    """
    try:
        code = dispatch(argv)
    except Exception:
        with visible_output():
            traceback.print_exc()
        code = 1
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # the reader went away
            stream.flush()
    os._exit(code)


if __name__ == "__main__":
    main()
