"""``forklab plan`` of a cohort spec, and the sequential design as the approver sees it.

A cohort is rehearsed by its workflow (reading the cohort needs the Temporal server), so
``forklab plan`` of a cohort spec says so and prints what the spec alone fixes: the most
forks it can start and, with ``analysis.sequential``, the design over the most runs the
cohort can hold, with the compute it is expected to save. Imported only for a cohort spec
(``forklab plan`` of a workload never loads the cohort models)."""

from __future__ import annotations

import argparse
import json

from forklab.activities.runfork.cohort_looks import planned_design
from forklab.cli.errors import CliError
from forklab.cli.experiment.design_text import design_text
from forklab.cli.experiment.specfile import SPEC_EXIT, load_cohort_spec


def cmd_plan_cohort(args: argparse.Namespace) -> int:
    spec = load_cohort_spec(args.spec)
    ids = spec.cohort.workflow_ids
    runs = len(ids) if ids is not None else spec.cohort.limit
    worlds, k = len(spec.worlds), spec.cohort.forks_per_world
    design = planned_design(spec, runs)
    if isinstance(design, str):  # the spec's own check refuses this; kept fail-closed
        raise CliError(f"{args.spec}: {design}", SPEC_EXIT)
    if args.json:
        print(
            json.dumps(
                {
                    "experiment_id": spec.id,
                    "runs_at_most": runs,
                    "forks_at_most": runs * worlds * k,
                    "design": design.model_dump(mode="json") if design else None,
                },
                indent=2,
            )
        )
        return 0
    lines = [
        f"{args.spec}: a cohort of recorded runs: its rehearsal reads the cohort on the "
        f"Temporal server (`forklab cohort start {args.spec}`; `forklab cohort status` shows "
        "the plan to approve)",
        f"  at most {runs} runs x {worlds} worlds x {k} forks = {runs * worlds * k} forks",
    ]
    if design is not None:
        lines += [f"  {line}" for line in design_text(design)]
        lines.append(
            f"  (over {runs} runs; the rehearsal fixes the design over the runs it resolves)"
        )
    print("\n".join(lines))
    return 0
