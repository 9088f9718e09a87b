"""``forklab list``: experiments, agent runs and forks, from Temporal's visibility (so it works
from any machine that reaches the server, with nothing read from the local home).

An experiment carries ``ForkLabExperiment`` (and its ``ForkLabStage``), a fork
``ForkLabParent`` and ``ForkLabLineageRoot``; an agent run is a workflow on the agents' task
queue that is not a fork.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from enum import StrEnum
from typing import TYPE_CHECKING, Any

from forklab.cli.arguments import whole_number
from forklab.cli.errors import CliError
from forklab.cli.ops_common import add_connection_flags, open_client, run, settings_from
from forklab.cli.runfork.agent_services import agent_settings

if TYPE_CHECKING:
    from temporalio.client import WorkflowExecution


class Kind(StrEnum):
    experiment = "experiment"
    run = "run"
    fork = "fork"


#: Workflow statuses as the visibility query names them.
STATUSES = (
    "Running",
    "Completed",
    "Failed",
    "Canceled",
    "Terminated",
    "ContinuedAsNew",
    "TimedOut",
)
#: What a filter value may hold: ids as ForkLab makes them; no quote reaches the query.
_VALUE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:/@-]{0,199}")


def _value(flag: str, value: str) -> str:
    if not _VALUE.fullmatch(value):
        raise CliError(
            f"{flag} {value!r} is not an id: use letters, digits and . _ : / @ - (up to 200)",
            2,
        )
    return value


#: A lineage root as forks record it: the root run's workflow id, ``@``, its first run id
#: (a UUID; ``forklab.experiments.runfork.identity.lineage_root``).
_ROOT = re.compile(r"(?P<workflow>.+)@(?P<run>[0-9a-f]{8}-[0-9a-f-]{27})")


def _lineage_clause(kind: Kind, lineage: str) -> str:
    """The clause keeping one lineage: ``lineage`` is the root run's workflow id (what a
    person knows) or the whole root a receipt shows (``id@first-run-id``). A fork records
    the whole root, so a workflow id alone matches every chain that id has started."""
    root = _ROOT.fullmatch(lineage)
    workflow = root["workflow"] if root else lineage
    if kind is Kind.fork:
        if root:
            return f"ForkLabLineageRoot = '{lineage}'"
        return f"ForkLabLineageRoot STARTS_WITH '{workflow}@'"
    return f"WorkflowId = '{workflow}'"


def queries(args: argparse.Namespace, agent_queue: str) -> dict[Kind, str]:
    """The visibility query of each kind asked for, with the filters that apply to it."""
    kinds = [Kind(args.kind)] if args.kind else list(Kind)
    if args.stage is not None:
        kinds = [k for k in kinds if k is Kind.experiment]
    if args.lineage is not None:
        kinds = [k for k in kinds if k is not Kind.experiment]
    found: dict[Kind, str] = {}
    for kind in kinds:
        clauses = {
            Kind.experiment: ["ForkLabExperiment IS NOT NULL"],
            Kind.fork: ["ForkLabParent IS NOT NULL"],
            Kind.run: [
                f"TaskQueue = '{_value('task queue', agent_queue)}'",
                "ForkLabParent IS NULL",
            ],
        }[kind]
        if args.status is not None:
            clauses.append(f"ExecutionStatus = '{args.status}'")
        if args.stage is not None:
            clauses.append(f"ForkLabStage = '{_value('--stage', args.stage)}'")
        if args.lineage is not None:
            clauses.append(_lineage_clause(kind, _value("--lineage", args.lineage)))
        found[kind] = " AND ".join(clauses)
    return found


def _row(kind: Kind, wf: WorkflowExecution) -> dict[str, Any]:
    attrs = wf.search_attributes

    def first(name: str) -> Any:
        values = attrs.get(name) or []
        return values[0] if values else None

    return {
        "kind": kind.value,
        "workflow_id": wf.id,
        "run_id": wf.run_id,
        "type": wf.workflow_type,
        "status": wf.status.name.lower() if wf.status is not None else None,
        "started": wf.start_time.isoformat() if wf.start_time else None,
        "closed": wf.close_time.isoformat() if wf.close_time else None,
        "stage": first("ForkLabStage"),
        "parent": first("ForkLabParent"),
        "lineage_root": first("ForkLabLineageRoot"),
    }


#: The most rows ``--limit`` asks for (the listing holds them all in memory to sort them).
MAX_LIMIT = 100_000


async def list_rows(args: argparse.Namespace) -> list[dict[str, Any]]:
    settings = settings_from(args)
    asked = queries(args, agent_settings(settings).agent_task_queue)
    client = await open_client(settings)
    from temporalio.service import RPCError

    rows: list[dict[str, Any]] = []
    for kind, query in asked.items():
        try:
            async for wf in client.list_workflows(query, limit=args.limit):
                rows.append(_row(kind, wf))
        except RPCError as exc:
            raise CliError(f"Temporal refused the list of {kind.value}s ({exc.message})") from None
    rows.sort(key=lambda r: r["started"] or "", reverse=True)
    return rows[: args.limit]


def cmd_list(args: argparse.Namespace) -> int:
    args.limit = whole_number(str(args.limit), "--limit", low=1, high=MAX_LIMIT)
    rows = run(lambda: list_rows(args))
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    if not rows:
        print("nothing found", file=sys.stderr)
        return 0
    print(f"{'kind':<10} {'status':<15} {'started':<20} {'stage / parent':<24} workflow id")
    for r in rows:
        extra = r["stage"] or r["parent"] or ""
        started = (r["started"] or "")[:19].replace("T", " ")
        print(
            f"{r['kind']:<10} {r['status'] or '?':<15} {started:<20} {extra:<24} {r['workflow_id']}"
        )
    return 0


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "list", help="list experiments, agent runs and forks (from Temporal's visibility)"
    )
    p.add_argument("--kind", choices=[k.value for k in Kind], help="only this kind")
    p.add_argument("--status", choices=STATUSES, help="only workflows in this status")
    p.add_argument("--stage", help="only experiments at this stage (e.g. awaiting_approval)")
    p.add_argument("--lineage", metavar="ROOT", help="only this run and the forks of its lineage")
    p.add_argument("--limit", default="50", help="at most this many rows (50)")
    p.add_argument("--json", action="store_true", help="machine-readable")
    add_connection_flags(p)
    p.set_defaults(func=cmd_list)
