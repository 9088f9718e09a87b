"""``forklab demo fleet``: an experiment over a cohort of recorded agent runs, end to end.

It records a cohort of research-pipeline runs on seeded topics with model ``fast`` at
temperature 1 (most fail the scorer: thin sections), then runs the experiment over them,
each run forked where it charges the customer (the charge blocked by the signed tool
list), k = 3, with worlds: baseline (A/A), a model swap (``slow``), a prompt patch
("Write every section in full."), a placebo ("Be yourself.") and a positive control (a
model-provider brownout on half the model calls). It prints the plan, approves it
(``--yes``, or asks), prints the table and the report's path. It starts what is missing
(dev server, worker, agent worker, model and payments stand-ins) and stops what it
started unless ``--keep``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
import time

from temporalio.client import WorkflowFailureError

from forklab.cli.errors import CliError
from forklab.cli.experiment.cohort_commands import approve, render_status, start_spec, status_of
from forklab.cli.ops_common import add_connection_flags, plain_client, run, settings_from
from forklab.cli.runfork.agent_services import (
    agent_settings,
    ensure_agent_services,
    stop_agent_services,
)
from forklab.cli.service_commands import ensure_server, ensure_worker, stop_services
from forklab.experiments.cohort.spec import CohortExperimentSpec
from forklab.workers.config import Settings
from forklab.workers.runfork.agent_config import AgentSettings
from forklab.workflows.experiment.cohort_messages import CohortResult
from forklab.workflows.experiment.messages import Stage, workflow_id

DEFAULT_RUNS = 24
TOPICS = ("durable execution", "vector search", "edge caching", "rate limiting", "stream joins")


def fleet_spec(run_ids: list[str], stamp: int) -> CohortExperimentSpec:
    return CohortExperimentSpec.model_validate(
        {
            "id": f"fleet-{stamp}",
            "hypothesis": {
                "text": "a stronger model, or an instruction to write every section in full, "
                "at the charge step rescues thin reports without harming good ones",
                "expected": {"slow": "decrease", "full": "decrease", "noop": "none"},
            },
            "seed": stamp % 1_000_000,
            "cohort": {
                "workflow_ids": run_ids,
                "limit": len(run_ids),
                "fork_at": "tool:charge_customer#1",
                "forks_per_world": 3,
                "outcome": "forklab.experiments.cohort.scorers:final_score",
                "success_threshold": 1.0,
            },
            "worlds": [
                {"name": "baseline", "role": "baseline"},
                {"name": "slow", "role": "treatment", "model": "slow"},
                {
                    "name": "full",
                    "role": "treatment",
                    "prompt_patch": {"text": "Write every section in full."},
                },
                {"name": "noop", "role": "placebo", "prompt_patch": {"text": "Be yourself."}},
                {
                    "name": "outage",
                    "role": "positive_control",
                    "faults": [{"kind": "brownout", "rate": 0.5}],
                },
            ],
            "budget": {"max_forks": len(run_ids) * 15, "max_concurrent_forks": 8},
        }
    )


async def record_cohort(
    settings: Settings, agent: AgentSettings, runs: int, stamp: int
) -> list[str]:
    client = await plain_client(settings)
    handles = []
    for i in range(runs):
        handles.append(
            await client.start_workflow(
                "ResearchPipeline",
                # forklab.agents.research.ResearchInput as JSON (the CLI imports no agent)
                {
                    "topic": f"{TOPICS[i % len(TOPICS)]} #{i}",
                    "model": "fast",
                    "temperature": 1.0,
                    "invoice": f"inv-fleet-{stamp}-{i}",
                },
                id=f"fleet-{stamp}-{i:03d}",
                task_queue=agent.agent_task_queue,
            )
        )
    failed = 0
    for h in handles:
        try:
            await h.result()
        except WorkflowFailureError:
            failed += 1
    print(f"1. recorded {runs} research runs (model fast, temperature 1): {failed} failed")
    return [h.id for h in handles]


async def fleet_demo(settings: Settings, agent: AgentSettings, runs: int, yes: bool) -> int:
    stamp = int(time.time())
    ids = await record_cohort(settings, agent, runs, stamp)
    spec = fleet_spec(ids, stamp)
    wid, key = await start_spec(settings, spec)
    print(f"2. started experiment {spec.id} (workflow {wid}); approver key {key}")
    for _ in range(600):
        view = await status_of(settings, spec.id)
        if view.stage is Stage.awaiting_approval or view.stage is Stage.done:
            break
        await asyncio.sleep(0.2)
    print(render_status(view))
    if view.stage is not Stage.awaiting_approval:
        raise CliError(f"the experiment did not reach approval: {view.error or view.message}")
    if not yes:
        answer = input(f"approve plan {view.fingerprint}? [y/N] ").strip().lower()
        if answer not in ("y", "yes"):
            print("not approved; reject or let it expire: forklab cohort cancel " + spec.id)
            return 0
    attempt = await approve(settings, spec.id, "demo fleet --yes" if yes else "demo fleet")
    print(f"3. {'approved' if attempt.accepted else 'refused'}: {attempt.reason}")
    client = await plain_client(settings)
    handle = client.get_workflow_handle(workflow_id(spec.id), result_type=CohortResult)
    result = await handle.result()
    if result.report is None:
        raise CliError(f"the experiment ended {result.status.value}: {result.error}")
    r = result.report
    print(
        f"4. {result.forks_done} forks, {result.tokens} tokens; cleanup left "
        f"{result.cleanup.remaining if result.cleanup else '?'} forks running"
    )
    print(
        f"   noise floor (A/A flip rate): {r.flip_rate:.1%} [{r.flip_ci_low:.1%}, "
        f"{r.flip_ci_high:.1%}] over {r.runs} runs"
    )
    print(f"   {'world':<9} {'role':<17} {'rescued':>7} {'harmed':>6} {'rate':>7}  verdict")
    for w in r.worlds:
        print(
            f"   {w.world:<9} {w.role:<17} {w.rescues:>7} {w.harms:>6} "
            f"{w.rate_difference:>+7.1%}  {w.verdict.replace('_', ' ')}"
            f"{'' if w.as_expected else ' (not as expected)'}"
        )
    print(f"5. report: {r.report_dir}/report.md")
    return 0


def cmd_fleet_demo(args: argparse.Namespace) -> int:
    if not args.yes and not sys.stdin.isatty():
        raise CliError(
            "no terminal to ask for approval; pass --yes to approve non-interactively", 2
        )
    if not 1 <= args.runs <= 500:
        raise CliError(f"--runs is {args.runs}; give a number from 1 to 500", 2)
    settings = settings_from(args)
    agent = agent_settings(settings)
    server = ensure_server(settings)
    worker = ensure_worker(settings)
    started = ensure_agent_services(settings)
    names = (["server"] if server else []) + (["worker"] if worker else []) + started
    if names:
        print(f"started in the background: {', '.join(names)}")
    try:
        return run(lambda: fleet_demo(settings, agent, args.runs, args.yes))
    finally:
        if args.keep:
            print(f"kept running; Web UI {settings.ui_url}; stop with `forklab down`")
        else:
            stopped = stop_agent_services(settings) if started else []
            if server or worker:
                with contextlib.suppress(Exception):
                    stopped += stop_services(settings, worker=worker, server=server)
            if stopped:
                print(f"stopped what the demo started: {', '.join(stopped)}")


def register(scenarios: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = scenarios.add_parser(
        "fleet", help="record a cohort of agent runs and run an experiment over it"
    )
    p.add_argument("--yes", action="store_true", help="approve without asking (recorded)")
    p.add_argument("--keep", action="store_true", help="leave the services running")
    p.add_argument("--runs", type=int, default=DEFAULT_RUNS, help="runs in the cohort")
    add_connection_flags(p, ui=True)
    p.set_defaults(func=cmd_fleet_demo)
