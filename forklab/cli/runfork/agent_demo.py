"""``forklab demo agent``: fork a failed agent run and show what changed, end to end.

The research pipeline runs with model ``fast`` and fails the scorer; the demo forks it at
step 3 with model ``slow`` and ``charge_customer=block``, shows that the fork succeeds
with no new charge, prints the receipt, the diff of the final states (each changed path
with its values, cut short) and the parent's unchanged event count, then promotes the
fork and links both runs in the Web UI. It starts what is missing (dev server, model
server, payments/mail service, agent worker) and stops what it started unless ``--keep``.
"""

from __future__ import annotations

import argparse
import json
import time
import urllib.request
from typing import Any

from temporalio.client import Client, WorkflowFailureError

from forklab.cli.errors import CliError
from forklab.cli.ops_common import add_connection_flags, plain_client, run, settings_from
from forklab.cli.runfork.agent_lab import AgentLab
from forklab.cli.runfork.agent_services import (
    agent_settings,
    ensure_agent_services,
    stop_agent_services,
)
from forklab.cli.service_commands import ensure_server, stop_services
from forklab.contracts.fork_request import ForkRequest
from forklab.experiments.runfork.diff import change_lines
from forklab.experiments.runfork.policy import ToolPolicy
from forklab.workers.config import Settings
from forklab.workers.runfork.agent_config import AgentSettings

FORK_AT_STEP = 3
#: The longest value a diff line of the demo shows (`forklab diff` shows them whole).
DIFF_VALUE_WIDTH = 60


def _charges(agent: AgentSettings) -> int:
    with urllib.request.urlopen(agent.resolved_effects_url + "/effects/log", timeout=10) as r:
        effects: list[dict[str, Any]] = json.loads(r.read())["effects"]
    return sum(1 for e in effects if e["kind"] == "charge")


async def _event_count(client: Client, workflow_id: str) -> int:
    return len((await client.get_workflow_handle(workflow_id).fetch_history()).events)


async def agent_demo(settings: Settings, agent: AgentSettings, yes: bool) -> list[str]:
    """Run the story; returns the workflow ids worth opening in the Web UI afterwards."""
    client = await plain_client(settings)
    lab = AgentLab(client, agent)
    run_id = f"research-demo-{int(time.time())}"
    print(f"1. research pipeline {run_id} with model `fast`")
    parent = await client.start_workflow(
        "ResearchPipeline",
        # the input of forklab.agents.research.ResearchInput, as JSON: the CLI does not
        # import the agents' code (nor the model client it pulls in)
        {"topic": "durable execution", "model": "fast", "invoice": f"inv-{run_id}"},
        id=run_id,
        task_queue=agent.agent_task_queue,
    )
    try:
        await parent.result()
        raise CliError("the `fast` run was expected to fail the scorer and did not")
    except WorkflowFailureError as exc:
        print(f"   failed as expected: {exc.cause}")
    for s in await lab.steps(run_id):
        print(f"   step {s.index}: {s.label} [{s.status.value}]")
    charges_before = _charges(agent)
    events_before = await _event_count(client, run_id)
    print(f"2. fork at step {FORK_AT_STEP} with model `slow` and charge_customer=block")
    fork = await lab.fork(
        ForkRequest(
            run=run_id,
            at_step=FORK_AT_STEP,
            name=f"{run_id}-slow",
            model="slow",
            tool_policies={"charge_customer": ToolPolicy.block},
            requested_by="demo agent",
        )
    )
    state = await fork.handle.result()
    new_charges = _charges(agent) - charges_before
    print(
        f"   fork {fork.receipt.fork_workflow_id}: status {state['status']}, score {state['score']}"
    )
    print(f"   new charges: {new_charges} (the charge was {state['invoice']['status']})")
    print("3. receipt")
    print(json.dumps(fork.receipt.model_dump(mode="json"), indent=2, sort_keys=True))
    d = await lab.diff(run_id, fork.receipt.fork_workflow_id)
    print(f"4. diff (common ancestor {d.common_ancestor}, divergence at step {d.divergence_step})")
    for line in change_lines(d.diff, DIFF_VALUE_WIDTH):
        print(f"   {line}")
    events_after = await _event_count(client, run_id)
    print(f"5. parent events: {events_before} before the fork, {events_after} after (unchanged)")
    if events_after != events_before or new_charges != 0 or state["status"] != "ok":
        raise CliError("the demo's checks failed; see above")
    if not yes:
        answer = input(f"promote {fork.receipt.fork_workflow_id}? [y/N] ").strip().lower()
        if answer not in ("y", "yes"):
            print("not promoted")
            return [run_id, fork.receipt.fork_workflow_id]
    promotion = await lab.promote(fork.receipt.fork_workflow_id, by="demo agent")
    print(f"6. promoted {fork.receipt.fork_workflow_id}; closed: {', '.join(promotion.closed)}")
    return [run_id, fork.receipt.fork_workflow_id]


def cmd_agent_demo(args: argparse.Namespace) -> int:
    settings = settings_from(args)
    agent = agent_settings(settings)
    server = ensure_server(settings)
    started = ensure_agent_services(settings)
    if server or started:
        print(f"started in the background: {', '.join((['server'] if server else []) + started)}")
    runs: list[str] = []
    try:
        runs = run(lambda: agent_demo(settings, agent, args.yes))
        return 0
    finally:
        if args.keep:
            print(f"kept running; Web UI {settings.ui_url}; stop with `forklab down`")
        else:
            stopped = stop_agent_services(settings) if started else []
            if server:
                stopped += stop_services(settings, worker=False, server=True)
            if stopped:
                print(f"stopped what the demo started: {', '.join(stopped)}")
        # the links stay true after the demo: the runs are in the server's database, and
        # a server the demo stopped must be started again to show them
        first = "`forklab up`, then " if server and not args.keep else ""
        for where, workflow in zip(("the run", "the fork"), runs, strict=False):
            print(f"{where} in the Web UI: {first}{settings.experiment_url(workflow)}")
            first = ""


def register(scenarios: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = scenarios.add_parser("agent", help="fork a failed agent run at step 3 and promote the fix")
    p.add_argument("--yes", action="store_true", help="promote without asking")
    p.add_argument("--keep", action="store_true", help="leave the services running")
    add_connection_flags(p, ui=True)
    p.set_defaults(func=cmd_agent_demo)
