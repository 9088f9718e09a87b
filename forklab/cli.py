"""The ``forklab`` command: one entry point, one sub-command per operator action."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from forklab import ops_commands, plan_commands
from forklab.errors import CliError


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="forklab",
        description="Fork agent runs into counterfactual worlds; count rescues and harms.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    plan_commands.register(sub)
    ops_commands.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        code: int = args.func(args)
    except CliError as exc:
        print(f"forklab: error: {exc}", file=sys.stderr)
        return exc.code
    except KeyboardInterrupt:
        print("forklab: interrupted", file=sys.stderr)
        return 130
    return code


if __name__ == "__main__":
    sys.exit(main())
