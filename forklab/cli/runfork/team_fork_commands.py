"""``forklab fork-team MEMBER --at-step N``: fork a whole team at the consistent cut, as
one operation; ``forklab trail TEAMFORK`` and ``forklab diff TEAMFORK`` (one argument)
read a team fork back (the group receipt; which members' final states diverged from
their originals' and where the divergence entered each)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from temporalio.client import Client

from forklab.activities.runfork.team_fork_start import (
    TeamForkError,
    TeamForkRequest,
    TeamForkStarter,
)
from forklab.activities.stores.team_registry import TeamRegistry
from forklab.cli.errors import CliError
from forklab.cli.ops_common import add_connection_flags, command
from forklab.cli.runfork.agent_lab import AgentLab
from forklab.cli.runfork.fork_commands import BAD_INPUT, fork_options, open_lab, step_asked
from forklab.contracts.team_fork import TeamForkRecord, TeamForkStatus
from forklab.experiments.runfork.receipt import BoundaryMode
from forklab.experiments.runfork.team_receipt import SlotRole, TeamReceipt


def request_from(args: argparse.Namespace) -> TeamForkRequest:
    """The team fork ``args`` ask for (one line, exit 2, on bad input)."""
    changes = fork_options(args)
    at_step = step_asked(args, changes)
    if at_step is None:
        raise CliError(
            "give --at-step N, --override-result N=JSON or --override-input N=JSON",
            code=BAD_INPUT,
        )
    return TeamForkRequest(
        member=args.member,
        at_step=at_step,
        members=args.members,
        freeze=tuple(args.freeze or ()),
        name=args.name,
        **changes.options(),
    )


def receipt_lines(receipt: TeamReceipt) -> list[str]:
    """The group receipt for people: the cut per member, what became of each message,
    and each member's slot."""
    lines = [
        f"team fork {receipt.team_fork_id}: {receipt.requested_member} at step "
        f"{receipt.requested_step}",
        "cut:",
    ]
    for c in receipt.cut:
        moved = f"   moved back by {', '.join(c.moved_by)}" if c.moved_by else ""
        lines.append(f"  {c.workflow_id:<34} {c.label()}{moved}")
    lines.append("messages:")
    lines += [f"  {e.message.id}: {e.treatment.value}" for e in receipt.edges]
    lines.append("members:")
    for s in receipt.slots:
        where = f" -> {s.fork_workflow_id}" if s.fork_workflow_id else ""
        lines.append(f"  {s.workflow_id:<34} {s.role.value}{where}")
    for o in receipt.overrides:
        what = f"step {o.step}" if o.step is not None else f"signal {o.name}"
        lines.append(f"override: {o.member} {o.kind.value} {what} = {json.dumps(o.value)[:80]}")
    return lines


def record_lines(record: TeamForkRecord) -> list[str]:
    if record.status is TeamForkStatus.forked:
        head = f"team fork {record.receipt.team_fork_id}: forked, every member released"
    else:
        head = (
            f"team fork {record.receipt.team_fork_id}: aborted, no member ran "
            f"({len(record.terminated)} held forks terminated): {record.reason}"
        )
    return [head, *receipt_lines(record.receipt)]


async def _client_and_teams(args: argparse.Namespace) -> tuple[AgentLab, Client, TeamRegistry]:
    lab = await open_lab(args)
    return lab, lab.client, TeamRegistry(lab.agent.forks_path)


async def _fork_team(args: argparse.Namespace) -> int:
    req = request_from(args)
    _, client, teams = await _client_and_teams(args)
    try:
        started = await TeamForkStarter(client, teams).start(req)
    except TeamForkError as exc:
        raise CliError(str(exc), code=BAD_INPUT) from None
    print(
        f"team fork {started.plan.team_fork_id} started: {len(started.plan.addresses)} member "
        "forks, held until all exist",
        file=sys.stderr if args.json else sys.stdout,
    )
    record = await started.result()
    if args.json:
        print(json.dumps(record.model_dump(mode="json"), indent=2, sort_keys=True))
    else:
        print("\n".join(record_lines(record)))
    return 0 if record.status is TeamForkStatus.forked else 1


async def team_diff(lab: AgentLab, receipt: TeamReceipt) -> list[dict[str, Any]]:
    """Per member: whether its fork's final state diverged from its original's, and where
    the divergence entered it (its first step that differs, and the messages from the
    fork world it received after its cut)."""
    out: list[dict[str, Any]] = []
    for slot in receipt.slots:
        row: dict[str, Any] = {"member": slot.workflow_id, "role": slot.role.value}
        if slot.role is not SlotRole.forked or slot.fork_workflow_id is None:
            row.update(diverged=False, why="no fork: its original run stands")
            out.append(row)
            continue
        d = await lab.diff(slot.workflow_id, slot.fork_workflow_id)
        changed = bool(d.diff.added or d.diff.removed or d.diff.changed)
        entered: list[str] = []
        if slot.workflow_id == receipt.requested_member and receipt.overrides:
            entered += [f"override {o.kind.value}" for o in receipt.overrides]
        entered += [
            e.message.id
            for e in receipt.edges
            if e.message.receiver == slot.workflow_id
            and e.treatment.value in ("regenerated", "delivered_at_start")
        ]
        row.update(
            fork=slot.fork_workflow_id,
            diverged=changed,
            divergence_step=d.divergence_step,
            entered_through=entered,
            paths=[*d.diff.changed, *d.diff.added, *d.diff.removed][:10],
        )
        out.append(row)
    return out


def diff_lines(rows: list[dict[str, Any]]) -> list[str]:
    lines = []
    for r in rows:
        if "fork" not in r:
            lines.append(f"  {r['member']:<34} {r['role']}: {r['why']}")
            continue
        state = "diverged" if r["diverged"] else "same final state"
        where = f" from step {r['divergence_step']}" if r["divergence_step"] else ""
        via = f", entered through {', '.join(r['entered_through'])}" if r["entered_through"] else ""
        lines.append(f"  {r['member']:<34} {state}{where}{via}")
    return lines


def _paths(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{**r, "paths": [str(p) for p in r.get("paths", [])]} for r in rows]


async def team_trail_or_diff(args: argparse.Namespace, kind: str) -> int | None:
    """``forklab trail NAME`` / ``forklab diff NAME`` for a team fork's name: handled
    here (exit code), or None when NAME is no team fork (the single-fork command runs)."""
    lab, _, teams = await _client_and_teams(args)
    record = teams.get(args.run if kind == "trail" else args.a)
    if record is None:
        return None
    if kind == "trail":
        if args.json:
            print(json.dumps(record.model_dump(mode="json"), indent=2, sort_keys=True))
        else:
            print("\n".join(record_lines(record)))
        return 0
    if record.status is not TeamForkStatus.forked:
        raise CliError(f"team fork {args.a!r} was aborted: no member ran", code=BAD_INPUT)
    rows = _paths(await team_diff(lab, record.receipt))
    if args.json:
        print(json.dumps(rows, indent=2, sort_keys=True, default=str))
    else:
        print(f"team fork {args.a}: which members' final states diverged, and where")
        print("\n".join(diff_lines(rows)))
    return 0


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "fork-team", help="fork a team of workflows at a consistent cut, as one operation"
    )
    p.add_argument("member", metavar="MEMBER", help="the member whose step is asked for")
    p.add_argument("--at-step", help="MEMBER inherits steps 1..N; the others follow the cut")
    p.add_argument("--members", nargs="+", metavar="WID", help="exactly these members (and MEMBER)")
    p.add_argument("--freeze", nargs="+", metavar="WID", help="members kept as cut, never run")
    p.add_argument("--name", help="the team fork's name (its members are NAME/<member id>)")
    p.add_argument("--intervention", help="opaque JSON object every member's fork may read")
    p.add_argument("--model", help="swap the model of every live model call of every fork")
    p.add_argument("--override-result", metavar="N=JSON", help="MEMBER's step N returns JSON")
    p.add_argument("--override-input", metavar="N=JSON", help="MEMBER's step N is asked JSON")
    p.add_argument(
        "--signal", action="append", metavar="NAME[=JSON]", help="to MEMBER's fork at its point"
    )
    p.add_argument("--live-after", action="store_true", help="the default policy '*' is live")
    p.add_argument(
        "--tool-policy", action="append", metavar="TOOL=POLICY", help="as for forklab fork"
    )
    p.add_argument(
        "--boundary",
        choices=[b.value for b in BoundaryMode],
        default=BoundaryMode.exact.value,
        help="as for forklab fork, for every member",
    )
    p.add_argument("--json", action="store_true", help="print the team fork's record (JSON)")
    add_connection_flags(p)
    p.set_defaults(func=command(_fork_team))
