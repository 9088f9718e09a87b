"""``forklab evals``: run the causal, capacity and acquisition suites (``evals/``).

With ``BRAINTRUST_API_KEY`` set each suite is also uploaded as a Braintrust experiment
(project ``forklab-evals``); without it, or with ``--local``, nothing leaves the machine.
``--send`` insists on uploading (exit 2 without a key). Exit status 1 when a suite has a
failing case.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from types import ModuleType
from typing import TYPE_CHECKING

from forklab.activities.sdk_errors import innermost_sentence
from forklab.activities.secrets_text import redact
from forklab.cli.errors import CliError

if TYPE_CHECKING:
    from forklab.evals.suite import SuiteResult


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("evals", help="run the causal, capacity and acquisition eval suites")
    where = p.add_mutually_exclusive_group()
    where.add_argument(
        "--send",
        action="store_true",
        help="upload to Braintrust (fails without BRAINTRUST_API_KEY)",
    )
    where.add_argument(
        "--local", action="store_true", help="never upload, even with BRAINTRUST_API_KEY set"
    )
    p.add_argument("--json", action="store_true", help="the suites' results (JSON)")
    p.set_defaults(func=evals)


def evals(args: argparse.Namespace) -> int:
    # the suites (Braintrust, the analysis): imported when they run, not with the parser
    from forklab.workers.config import ConfigError
    from forklab.workers.extras import Extra, require_extra

    try:  # the suites are braintrust.Eval suites, local runs too
        require_extra(Extra.braintrust, "forklab evals")
    except ConfigError as exc:
        raise CliError(str(exc), code=2) from None
    from forklab.evals import acquisition, capacity, causal

    keyed = bool(os.environ.get("BRAINTRUST_API_KEY", "").strip())
    if args.send and not keyed:
        raise CliError("--send needs BRAINTRUST_API_KEY; set it or run without --send", code=2)
    send = keyed and not args.local
    results: list[SuiteResult] = []
    refused: dict[str, str] = {}  # suite -> why Braintrust did not take it
    for suite in (causal, capacity, acquisition):
        result, why = _run(suite, send)
        results.append(result)
        if why is not None:
            refused[result.suite] = why
    if args.json:
        uploaded = {r.suite: send and r.suite not in refused for r in results}
        rows = [
            r.model_dump(mode="json") | {"passed": r.passed, "uploaded": uploaded[r.suite]}
            for r in results
        ]
        print(json.dumps(rows, indent=2))
    else:
        for r in results:
            mark = "ok" if r.passed else "FAILED: " + "; ".join(r.failed)
            sent = " (not uploaded)" if r.suite in refused else ""
            print(f"{r.suite}: {r.cases - len(r.failed)}/{r.cases} cases · {mark}{sent}")
    if refused:
        names = ", ".join(refused)
        raise CliError(
            f"Braintrust did not take the {names} eval suite{'s' if len(refused) > 1 else ''} "
            f"({next(iter(refused.values()))}); check BRAINTRUST_API_KEY and "
            "BRAINTRUST_APP_URL, or run with --local",
            code=1,
        )
    where = "uploaded to Braintrust project forklab-evals" if send else "ran locally, nothing sent"
    print(where, file=sys.stderr if args.json else sys.stdout)
    return 0 if all(r.passed for r in results) else 1


def _run(suite: ModuleType, send: bool) -> tuple[SuiteResult, str | None]:
    """Run one suite, and why Braintrust did not take it (None: it did, or nothing was
    sent). A refused suite is run again locally, so its cases are still judged and shown;
    the reason never holds the key a server quoted back."""
    try:
        result: SuiteResult = suite.run(send=send)
    except Exception as exc:  # the SDK raises many kinds; all mean "not uploaded"
        if not send:
            raise
        why = redact(
            innermost_sentence(exc),
            os.environ.get("BRAINTRUST_API_KEY", "").strip(),
            "BRAINTRUST_API_KEY",
        )
        local: SuiteResult = suite.run(send=False)
        return local, why
    return result, None
