"""``forklab evals``: run the causal, capacity and acquisition suites (``evals/``).

Locally by default (nothing leaves the machine); ``--send`` uploads each suite as a
Braintrust experiment, which needs ``BRAINTRUST_API_KEY``. Exit status 1 when a suite
has a failing case.
"""

from __future__ import annotations

import argparse
import os

from evals import acquisition, capacity, causal
from forklab.errors import CliError


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("evals", help="run the causal, capacity and acquisition eval suites")
    p.add_argument(
        "--send", action="store_true", help="upload to Braintrust (needs BRAINTRUST_API_KEY)"
    )
    p.set_defaults(func=evals)


def evals(args: argparse.Namespace) -> int:
    if args.send and not os.environ.get("BRAINTRUST_API_KEY"):
        raise CliError("--send needs BRAINTRUST_API_KEY; set it or run without --send", code=2)
    results = [suite.run(send=args.send) for suite in (causal, capacity, acquisition)]
    for r in results:
        mark = "ok" if r.passed else "FAILED: " + "; ".join(r.failed)
        print(f"{r.suite}: {r.cases - len(r.failed)}/{r.cases} cases · {mark}")
    return 0 if all(r.passed for r in results) else 1
