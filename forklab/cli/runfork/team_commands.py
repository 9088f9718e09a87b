"""``forklab team RUN``: a team's members, the messages between them and, with
``--at-step``, the consistent cut for forking one member there; ``forklab team-worker``
and ``forklab langgraph-worker``: the workers of the example team and the LangGraph
agent (foreground)."""

from __future__ import annotations

import argparse
import json
from typing import Any

from forklab.activities.runfork.team_history import TeamReadError, read_team
from forklab.cli.arguments import whole_number
from forklab.cli.errors import CliError
from forklab.cli.ops_common import add_connection_flags, command, plain_client, run, settings_from
from forklab.experiments.runfork.team_cut import Message, Position, TeamCut, TeamCutError
from forklab.workers.runfork.agent_config import AgentSettings

BAD_INPUT = 2


def _where(member: str | None, at: Position | None) -> str:
    if member is None:
        return "(outside)"
    if at is None:
        return f"{member} (not received)"
    if at.after_step < 0:
        return f"{member} (at its start)"
    more = f", message event {at.seq + 1}" if at.seq else ""
    return f"{member} (after step {at.after_step}{more})"


def _message_line(m: Message) -> str:
    return (
        f"  {m.kind.value:<13} {m.name!r:<12} {_where(m.sender, m.sent_at)} -> "
        f"{_where(m.receiver, m.received_at)}"
    )


def _cut_lines(cut: TeamCut) -> list[str]:
    lines = [f"cut for {cut.requested_member} at step {cut.requested_step}:"]
    for m in cut.members:
        frozen = " (frozen)" if m.frozen else ""
        moved = f"   moved back by {', '.join(m.moved_by)}" if m.moved_by else ""
        lines.append(f"  {m.workflow_id:<32} {m.label()}{frozen}{moved}")
    lines.append("what the cut does with each message:")
    for e in cut.edges:
        lines.append(f"  {e.message.id}: {e.status.value}, {e.treatment.value}")
    return lines


async def _team(args: argparse.Namespace) -> int:
    from forklab.experiments.runfork.team_cut import consistent_cut

    if args.at_step is None and (args.member or args.freeze):
        raise CliError("--member and --freeze need --at-step N", code=BAD_INPUT)
    at_step = None if args.at_step is None else whole_number(args.at_step, "--at-step")
    client = await plain_client(settings_from(args))
    try:
        team = await read_team(client, args.run, members=args.members)
        cut = (
            consistent_cut(team, args.member or args.run, at_step, frozen=args.freeze or [])
            if at_step is not None
            else None
        )
    except (TeamReadError, TeamCutError) as exc:
        raise CliError(str(exc), code=BAD_INPUT) from None
    if args.json:
        out: dict[str, Any] = {"team": team.model_dump(mode="json")}
        if cut is not None:
            out["cut"] = cut.model_dump(mode="json")
        print(json.dumps(out, indent=2, sort_keys=True))
        return 0
    print(f"members ({len(team.members)}):")
    for m in team.members:
        state = "closed" if m.closed else "running"
        print(f"  {m.workflow_id:<32} {m.workflow_type:<18} {m.steps:>4} steps  {state}")
    print(f"messages ({len(team.messages)}):")
    for msg in team.messages:
        print(_message_line(msg))
    if cut is not None:
        print("\n".join(_cut_lines(cut)))
    return 0


def _worker(kind: str) -> Any:
    def command(args: argparse.Namespace) -> int:
        from forklab.cli.runfork.agent_services import agent_settings

        settings = settings_from(args)
        agent: AgentSettings = agent_settings(settings)
        if kind == "team":
            from forklab.workers.runfork.team_worker import run_team_worker, team_task_queue

            queue, main = team_task_queue(agent), run_team_worker
        else:
            try:
                from forklab.workers.runfork.langgraph_worker import (
                    langgraph_task_queue,
                    run_langgraph_worker,
                )
            except ImportError:
                raise CliError(
                    "the LangGraph example needs the langgraph extra: "
                    "pip install 'forklab[langgraph]'"
                ) from None
            queue, main = langgraph_task_queue(agent), run_langgraph_worker
        print(
            f"ForkLab {kind} worker: task queue {queue} on {settings.address}, "
            f"model {agent.resolved_model_url}; Ctrl-C stops it",
            flush=True,
        )
        try:
            run(lambda: main(settings, agent))
        except RuntimeError as exc:
            raise CliError(
                f"the {kind} worker cannot connect to Temporal at {settings.address} "
                f"({str(exc).splitlines()[0]}); start it with `forklab up`"
            ) from None
        return 0

    return command


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("team", help="show a team of workflows, its messages and a cut")
    p.add_argument("run", metavar="RUN", help="a member's workflow id")
    p.add_argument("--members", nargs="+", metavar="WID", help="exactly these members (and RUN)")
    p.add_argument("--at-step", help="show the consistent cut at this step")
    p.add_argument("--member", metavar="WID", help="the member cut at --at-step (default RUN)")
    p.add_argument("--freeze", nargs="+", metavar="WID", help="members never continued")
    p.add_argument("--json", action="store_true", help="print the team (and cut) as JSON")
    add_connection_flags(p)
    p.set_defaults(func=command(_team))
    for kind, what in (("team", "the example team"), ("langgraph", "the LangGraph agent")):
        w = sub.add_parser(f"{kind}-worker", help=f"run the worker of {what} (foreground)")
        add_connection_flags(w)
        w.set_defaults(func=_worker(kind))
