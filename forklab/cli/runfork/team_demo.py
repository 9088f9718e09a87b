"""``forklab demo team``: a team fork end to end, in seconds.

It records a run of the example team (researcher ``fast``: its thin conclusion gets the
report rejected), forks the whole team at the researcher's conclusion (step 3) with
``--override-result`` giving it a full conclusion, and prints the cut, the group receipt
and the team diff: the writer's and reviewer's forks were moved back by the messages
that carried the conclusion, and the verdict flipped. It starts what is missing (dev
server, model stand-in) and runs the team's worker in this process.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import time

from forklab.activities.runfork.overrides import make_override
from forklab.activities.runfork.team_fork_start import TeamForkRequest, TeamForkStarter
from forklab.activities.stores.team_registry import TeamRegistry
from forklab.agents.team import CONCLUSION_STEP
from forklab.agents.team_start import start_team
from forklab.cli.errors import CliError
from forklab.cli.ops_common import add_connection_flags, run, settings_from
from forklab.cli.runfork.agent_lab import AgentLab
from forklab.cli.runfork.agent_services import (
    agent_settings,
    ensure_agent_services,
    stop_agent_services,
)
from forklab.cli.runfork.team_fork_commands import diff_lines, receipt_lines, team_diff
from forklab.cli.service_commands import ensure_server, stop_services
from forklab.contracts.team_fork import TeamForkStatus
from forklab.workers.config import Settings
from forklab.workers.runfork.agent_config import AgentSettings
from forklab.workers.runfork.agent_worker import connect_agents
from forklab.workers.runfork.plugin import ensure_search_attributes
from forklab.workers.runfork.team_worker import build_team_worker, team_task_queue

#: The conclusion the researcher's fork is told it reached at step 3.
FULL_CONCLUSION = (
    "adopt durable execution for every agent workflow: recorded histories make each run "
    "replayable, auditable and cheap to fork"
)


async def team_demo(settings: Settings, agent: AgentSettings) -> int:
    client = await connect_agents(settings, agent)
    await ensure_search_attributes(client)
    async with build_team_worker(client, agent):
        began = time.monotonic()
        team = await start_team(
            client, f"team-{int(time.time())}", "durable execution", team_task_queue(agent)
        )
        results = await team.results()
        ids = team.ids
        review = results["reviewer"]
        print(
            f"1. recorded team {ids.researcher.removesuffix('-researcher')}: researcher "
            f"concluded {results['researcher']['conclusion']!r}; reviewer "
            f"{'approved' if review['approved'] else 'rejected'} ({review['reason']})"
        )
        override = make_override(CONCLUSION_STEP, {"content": FULL_CONCLUSION, "model": "override"})
        started = await TeamForkStarter(client, TeamRegistry(agent.forks_path)).start(
            TeamForkRequest(
                member=ids.researcher,
                at_step=CONCLUSION_STEP,
                name=f"{ids.researcher.removesuffix('-researcher')}-what-if",
                result_override=override,
                requested_by="demo team",
            )
        )
        record = await started.result()
        if record.status is not TeamForkStatus.forked:
            raise CliError(f"the team fork was aborted: {record.reason}")
        print(f"2. forklab fork-team {ids.researcher} --override-result 3='{{…full…}}'")
        print("\n".join("   " + line for line in receipt_lines(record.receipt)))
        addresses = record.receipt.addresses
        for fork_id in addresses.values():
            await client.get_workflow_handle(fork_id).result()
        reviewed = await client.get_workflow_handle(addresses[ids.reviewer]).result()
        rows = await team_diff(AgentLab(client, agent), record.receipt)
        verdict = "approved" if reviewed["approved"] else "rejected"
        print(f"3. team diff: the reviewer's fork {verdict} ({reviewed['reason']})")
        print("\n".join(" " + line for line in diff_lines(rows)))
        print(
            f"   originals untouched; {time.monotonic() - began:.1f} s. More: forklab trail "
            f"{record.receipt.team_fork_id} / forklab diff {record.receipt.team_fork_id}"
        )
    return 0


def cmd_team_demo(args: argparse.Namespace) -> int:
    if not args.yes and not sys.stdin.isatty():
        raise CliError("no terminal to ask; pass --yes to run the demo non-interactively", 2)
    if not args.yes and input("record a team run and fork it? [y/N] ").strip().lower() not in (
        "y",
        "yes",
    ):
        return 0
    settings = settings_from(args)
    agent = agent_settings(settings)
    server = ensure_server(settings)
    started = ensure_agent_services(settings)
    try:
        return run(lambda: team_demo(settings, agent))
    finally:
        stopped = stop_agent_services(settings) if started else []
        if server:
            with contextlib.suppress(Exception):
                stopped += stop_services(settings, worker=False, server=server)
        if stopped:
            print(f"stopped what the demo started: {', '.join(stopped)}")


def register(scenarios: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = scenarios.add_parser(
        "team", help="record the example team, fork it at the researcher's conclusion"
    )
    p.add_argument("--yes", action="store_true", help="run without asking")
    add_connection_flags(p)
    p.set_defaults(func=cmd_team_demo)
