"""``forklab schema`` and ``forklab plan``: free, local, no Temporal needed."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from forklab.cli.errors import CliError
from forklab.cli.experiment.report_files import write_report
from forklab.cli.experiment.specfile import SPEC_EXIT, load_spec, names_cohort, own_import_path
from forklab.experiments.experiment.bundle import BundleError
from forklab.experiments.experiment.spec import SpecError, json_schema
from forklab.runtime.contract import ContractViolation
from forklab.runtime.workload import WorkloadError


def cmd_schema(args: argparse.Namespace) -> int:
    print(json.dumps(json_schema(), indent=2))
    return 0


#: What ``forklab plan`` says before anything else: it runs the workload's code in this
#: process, with no sandbox (the durable path's workers refuse to, without bubblewrap).
UNCONFINED_WARNING = (
    "WARNING: forklab plan runs the workload's code unconfined, in this process, as you: it "
    "can read and write whatever you can; plan only code you trust, and run anything else "
    "with `forklab start` on a worker with bubblewrap"
)


def cmd_plan(args: argparse.Namespace) -> int:
    from forklab.cli.experiment.rehearsal import Rehearsal

    try:
        spec = load_spec(args.spec)
    except CliError:
        if not names_cohort(args.spec):
            raise
        from forklab.cli.experiment.cohort_plan import cmd_plan_cohort

        return cmd_plan_cohort(args)
    try:
        # --debug runs in this process, so the traceback shows the workload's own frames.
        processes = 1 if args.debug else args.processes
        with Rehearsal(spec, processes=processes, memo=not args.no_memo) as rehearsal:
            # the analysis and the renderings (their models) import while the twin's
            # processes run the episodes, from ForkLab's own import path (not the spec's
            # folder, which ``load_spec`` put first)
            with own_import_path():
                from forklab.activities.experiment.twin_workspace import twin_workspace_section
                from forklab.experiments.experiment.analysis import build  # noqa: F401
                from forklab.experiments.experiment.report.render_html import render_html
                from forklab.experiments.experiment.report.render_markdown import (
                    render_markdown,
                )
                from forklab.experiments.experiment.report.render_text import render_text
            report = rehearsal.report()
        evidence = twin_workspace_section(spec)
    except (ContractViolation, SpecError) as exc:
        if args.debug:
            raise
        raise CliError(f"{args.spec}: {exc}", SPEC_EXIT) from None
    except WorkloadError as exc:
        raise CliError(f"{args.spec}: field {exc.field}: {exc.message}", SPEC_EXIT) from None
    except BundleError as exc:  # what forklab start could not ship, plan does not run
        raise CliError(f"{args.spec}: field workload.name: {exc}", SPEC_EXIT) from None
    except Exception as exc:  # the workload's own code failed on these params
        raise CliError(
            f"{args.spec}: the rehearsal failed in workload {spec.workload.name!r} "
            f"({type(exc).__name__}: {' '.join(str(exc).split())[:200]}); check workload.params",
            SPEC_EXIT,
        ) from None
    # loud, and first (a failure says only its one sentence); --json keeps stdout for the
    # report, so there it goes to stderr
    print(UNCONFINED_WARNING, file=sys.stderr if args.json else sys.stdout, flush=True)
    workspace_files: dict[str, str] = {}
    if evidence is not None:  # a workload with files: what each world did to them
        section, workspace_files = evidence
        report = report.model_copy(update={"workspaces": section})
    if args.out is not None:
        write_report(
            {
                "report.md": render_markdown(report),
                "report.json": report.model_dump_json(indent=2) + "\n",
                "report.html": render_html(report),
                **workspace_files,
            },
            Path(args.out),
        )
    if args.json:
        print(report.model_dump_json(indent=2))
    else:
        print(render_text(report))
        if args.out is not None:
            extra = f" and {len(workspace_files)} workspace files" if workspace_files else ""
            print(f"\nwrote report.md, report.json and report.html{extra} to {args.out}")
    return 0


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("schema", help="print the JSON Schema of an experiment spec")
    p.set_defaults(func=cmd_schema)
    p = sub.add_parser("plan", help="rehearse a spec on the local twin (free) and print the report")
    p.add_argument("spec", help="path to the experiment spec (.yaml or .json)")
    p.add_argument("--json", action="store_true", help="print the machine-readable report")
    p.add_argument(
        "--out", metavar="DIR", default=None, help="also write report.md, .json and .html here"
    )
    p.add_argument(
        "--processes",
        type=int,
        default=None,
        help="worker processes (default: one per free core when large)",
    )
    p.add_argument(
        "--no-memo",
        action="store_true",
        help="simulate every episode in full, even where a randomness-free run could be "
        "reused (benchmarks; the report is identical)",
    )
    p.add_argument(
        "--debug",
        action="store_true",
        help="when the workload breaks its contract, also print the Python traceback",
    )
    p.set_defaults(func=cmd_plan)
