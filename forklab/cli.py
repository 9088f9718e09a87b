"""The ``forklab`` command: one entry point, one sub-command per operator action."""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import sys
import traceback
from collections.abc import Sequence
from typing import NoReturn

from forklab import plan_commands
from forklab.errors import CliError
from forklab.terminal import visible_output

#: Commands that need neither Temporal nor the workers: they are parsed without importing
#: the other commands' modules (temporalio, activities, workers), which would otherwise
#: take longer than a whole ``forklab plan`` of a small spec.
LOCAL_COMMANDS = ("plan", "schema")


def build_parser(local_only: bool = False) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="forklab",
        description="Fork agent runs into counterfactual worlds; count rescues and harms.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    plan_commands.register(sub)
    if not local_only:
        from forklab import (
            agent_commands,
            agent_services,
            approval_commands,
            demo_command,
            doctor_command,
            evals_command,
            experiment_commands,
            service_commands,
            workspace_command,
        )

        experiment_commands.register(sub)
        approval_commands.register(sub)
        service_commands.register(sub)
        demo_command.register(sub)
        agent_commands.register(sub)
        agent_services.register(sub)
        doctor_command.register(sub)
        evals_command.register(sub)
        workspace_command.register_layers(sub)
    return parser


def dispatch(argv: Sequence[str] | None = None) -> int:
    """Run one command in this process and return its exit code. Everything it prints
    goes through ``forklab.terminal.visible_output``."""
    with visible_output():
        return _dispatch(list(sys.argv[1:] if argv is None else argv))


def _dispatch(words: list[str]) -> int:
    parser = build_parser(local_only=bool(words) and words[0] in LOCAL_COMMANDS)
    args = parser.parse_args(words)
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
