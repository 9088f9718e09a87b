"""``forklab fork|steps|diff|trail|outcome|promote|watch``: fork agent runs and decide
between the forks. Thin shells over ``forklab.cli.runfork.agent_lab.AgentLab``."""

from __future__ import annotations

import argparse
import asyncio
import getpass
import json
import sys
from typing import Any

from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter

from forklab.activities.runfork.history_reads import RunNotFound
from forklab.cli.arguments import finite_number, json_object, whole_number
from forklab.cli.errors import CliError
from forklab.cli.ops_common import add_connection_flags, run, settings_from
from forklab.cli.runfork.agent_lab import AgentLab, ForkError
from forklab.cli.runfork.agent_services import agent_settings
from forklab.experiments.runfork.diff import change_lines
from forklab.experiments.runfork.policy import PolicyError, ToolPolicy, parse_policies
from forklab.experiments.runfork.receipt import BoundaryMode, PrefixEvent

BAD_INPUT = 2
WATCH_POLL_SECONDS = 0.5


async def _lab(args: argparse.Namespace) -> AgentLab:
    settings = settings_from(args)
    agent = agent_settings(settings)
    try:
        # a plain client: forks are started with the parent's raw input payloads, so the
        # CLI needs neither the agent framework nor its converter (nor their import time)
        client = await Client.connect(
            settings.address, namespace=settings.namespace, data_converter=pydantic_data_converter
        )
    except RuntimeError as exc:
        raise CliError(
            f"cannot reach Temporal at {settings.address} ({str(exc).splitlines()[0]}); "
            "start it with `forklab up`"
        ) from None
    return AgentLab(client, agent)


def _guard(fn: Any) -> Any:
    """Turn a bad request into one line and exit code 2."""

    async def wrapped(args: argparse.Namespace) -> int:
        try:
            code: int = await fn(args)
            return code
        except (ForkError, RunNotFound, PolicyError) as exc:
            raise CliError(str(exc).strip("'\""), code=BAD_INPUT) from None

    return wrapped


def _parse_intervention(text: str | None) -> dict[str, Any] | None:
    return None if text is None else json_object(text, "--intervention")


def _print_json(value: Any) -> None:
    print(json.dumps(value, indent=2, sort_keys=True, default=str))


@_guard
async def _fork(args: argparse.Namespace) -> int:
    intervention = _parse_intervention(args.intervention)
    at_step = whole_number(args.at_step, "--at-step")
    policies: dict[str, ToolPolicy] = parse_policies(args.tool_policy or [])
    lab = await _lab(args)
    fork = await lab.fork(
        args.run,
        at_step,
        name=args.name,
        intervention=intervention,
        model=args.model,
        tool_policies=policies,
        boundary=BoundaryMode(args.boundary),
    )
    started = (
        f"fork {fork.receipt.fork_workflow_id} started (workflow run {fork.handle.result_run_id})"
    )
    # --json: the receipt alone on stdout (the line that says what happened goes to stderr)
    print(started, file=sys.stderr if args.json else sys.stdout)
    _print_json(fork.receipt.model_dump(mode="json"))
    return 0


@_guard
async def _steps(args: argparse.Namespace) -> int:
    lab = await _lab(args)
    steps = await lab.steps(args.run)
    # local activities and child workflows are no steps (a fork cannot serve them), but a
    # fork's policies reach them: each is listed after the step it followed
    acting = await lab.acting_calls(args.run)
    if args.json:
        rows: list[dict[str, Any]] = []
        for s in steps:
            rows.append({"kind": "step", **s.model_dump(mode="json", exclude={"result_b64"})})
            rows.extend(_acting_json(e) for e in acting if e.after_step == s.index)
        head = [_acting_json(e) for e in acting if e.after_step < (steps[0].index if steps else 1)]
        _print_json(head + rows)
        return 0
    print(f"{'step':>5}  {'origin':<9} {'status':<9} {'ms':>8}  input sha256  call")
    for e in acting:
        if not steps or e.after_step < steps[0].index:
            _print_acting(e)
    for s in steps:
        ms = f"{s.duration_ms:8.1f}" if s.duration_ms is not None else "       -"
        print(
            f"{s.index:>5}  {s.origin:<9} {s.status.value:<9} {ms}  {s.input_sha256[:12]}  "
            f"{s.label or s.activity_type}"
        )
        for e in acting:
            if e.after_step == s.index:
                _print_acting(e)
    return 0


def _acting_json(e: PrefixEvent) -> dict[str, Any]:
    return {
        "kind": e.kind,
        "after_step": e.after_step,
        "name": e.name,
        "child_id": e.child_id,
        "blocked": e.blocked,
    }


def _print_acting(e: PrefixEvent) -> None:
    origin = "local" if e.kind == "local activity" else "child"
    what = f"child workflow {e.child_id}" if e.child_id else e.kind
    status = "blocked" if e.blocked else ""
    print(f"{'-':>5}  {origin:<9} {status:<9} {'-':>8}  {'-':<12}  {e.name or '?'} ({what})")


@_guard
async def _diff(args: argparse.Namespace) -> int:
    lab = await _lab(args)
    d = await lab.diff(args.a, args.b)
    if args.json:
        _print_json(
            {
                "a": d.a,
                "b": d.b,
                "common_ancestor": d.common_ancestor,
                "divergence_step": d.divergence_step,
                "diff": d.diff.model_dump(mode="json"),
            }
        )
        return 0
    print(f"common ancestor: {d.common_ancestor or '(none)'}")
    print(f"divergence step: {d.divergence_step or '(none)'}")
    for line in change_lines(d.diff):
        print(line)
    return 0


@_guard
async def _trail(args: argparse.Namespace) -> int:
    lab = await _lab(args)
    trail = await lab.trail(args.run)
    if args.json:
        _print_json(trail)
    else:
        print(render_trail(trail))
    return 0


def render_trail(trail: dict[str, Any]) -> str:
    """``forklab trail`` for people: the lineage, each fork's receipt in a line, the steps
    served or blocked by policy, the ledger's effects and the recorded decisions."""
    lines = [f"run {trail['run']}", f"  lineage: {' -> '.join(trail['lineage'])}"]
    for r in trail["receipts"]:
        model = f", model {r['model']}" if r.get("model") else ""
        lines.append(
            f"  fork {r['fork_workflow_id']} of {r['parent_workflow_id']} at step "
            f"{r['resolved_step']} (asked {r['requested_step']}, boundary {r['boundary']}{model})"
        )
    if trail["policy_decisions"]:
        lines.append("  steps not run live:")
        lines += [
            f"    {d['index']:>4} {d['activity_type']}: {d['origin']}"
            for d in trail["policy_decisions"]
        ]
    lines.append(f"  ledger: {len(trail['ledger'])} effects")
    lines += [f"    {json.dumps(e, sort_keys=True, default=str)[:160]}" for e in trail["ledger"]]
    lines.append(f"  decisions: {len(trail['decisions'])}")
    lines += [f"    {json.dumps(d, sort_keys=True, default=str)[:160]}" for d in trail["decisions"]]
    return "\n".join(lines)


@_guard
async def _outcome(args: argparse.Namespace) -> int:
    score = None if args.score is None else finite_number(args.score, "--score")
    lab = await _lab(args)
    await lab.steps(args.run)  # the run must exist
    by = getpass.getuser()
    lab.outcome(args.run, args.label, score, by)
    if args.json:
        _print_json({"run": args.run, "label": args.label, "score": score, "by": by})
    else:
        print(f"outcome of {args.run}: {args.label} (score {score})")
    return 0


@_guard
async def _promote(args: argparse.Namespace) -> int:
    lab = await _lab(args)
    by = getpass.getuser()
    closed = await lab.promote(args.run, by)
    if args.json:
        _print_json({"promoted": args.run, "closed": closed, "by": by})
    else:
        print(f"promoted {args.run}; closed: {', '.join(closed) or '(none)'}")
    return 0


#: Event fields ``watch_line`` shows in its columns; the rest follow as key=value.
_WATCH_COLUMNS = ("kind", "step", "activity", "attempt")
#: The longest value ``watch_line`` shows of an extra field (``--json`` has them whole).
_WATCH_VALUE_WIDTH = 80


def watch_line(offset: int, event: dict[str, Any]) -> str:
    """One run-log event for people: offset, step, kind, activity (and its attempt when
    it is a retry), then any other field as ``key=value``, long values cut."""
    step = event.get("step")
    line = (
        f"{offset:>6}  {'step ' + str(step) if step is not None else '':<8} "
        f"{event.get('kind', 'event')!s:<15} {event.get('activity', '')}"
    )
    attempt = event.get("attempt")
    if isinstance(attempt, int) and attempt > 1:
        line += f" (attempt {attempt})"
    extra = []
    for key, value in sorted(event.items()):
        if key in _WATCH_COLUMNS:
            continue
        text = json.dumps(value, sort_keys=True, default=str, ensure_ascii=False)
        if len(text) > _WATCH_VALUE_WIDTH:
            text = text[: _WATCH_VALUE_WIDTH - 1] + "…"
        extra.append(f"{key}={text}")
    return "  ".join([line.rstrip(), *extra])


@_guard
async def _watch(args: argparse.Namespace) -> int:
    first = whole_number(args.from_offset, "--from")
    lab = await _lab(args)
    await lab.is_closed(args.run)  # the run must exist
    stream = await lab.run_stream(args.run)  # its latest chain's, not an earlier one's
    after = first - 1
    while True:
        events = lab.watch(stream, after)
        for e in events:
            if args.json:  # one JSON object a line, so a reader can follow the stream
                print(json.dumps({"offset": e.offset, **e.event}, sort_keys=True), flush=True)
            else:
                print(watch_line(e.offset, e.event), flush=True)
            after = e.offset
        if not args.follow:
            break
        if not events:
            if await lab.is_closed(args.run) and not lab.watch(stream, after):
                break
            await asyncio.sleep(WATCH_POLL_SECONDS)
    # where to go on from: a message, on stderr, so that stdout stays the events alone
    print(f"next offset: {after + 1}", file=sys.stderr)
    return 0


def _runner(fn: Any) -> Any:
    return lambda args: run(lambda: fn(args))


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("fork", help="fork an agent run at a step into a new workflow")
    p.add_argument("run", help="workflow id of the run to fork")
    p.add_argument("--at-step", required=True, help="inherit steps 1..N")
    p.add_argument("--name", help="workflow id of the fork (default: RUN--fork-XXXX)")
    p.add_argument("--intervention", help="opaque JSON object the workflow may read")
    p.add_argument("--model", help="swap the model of every live model call")
    p.add_argument(
        "--tool-policy",
        action="append",
        metavar="TOOL=POLICY",
        help="auto|replay|block|live per tool, '*' for the default (repeatable)",
    )
    p.add_argument(
        "--boundary",
        choices=[b.value for b in BoundaryMode],
        default=BoundaryMode.exact.value,
        help="exact (default): every inherited call must match its recorded type and input, "
        "else the fork is refused; approximate: types must match, drift, timers and signals "
        "in the prefix are recorded in the receipt; lineage_only: nothing is inherited, the "
        "fork re-runs live and only its lineage is recorded",
    )
    p.add_argument("--json", action="store_true", help="print the receipt only (JSON)")
    add_connection_flags(p)
    p.set_defaults(func=_runner(_fork))

    p = sub.add_parser("steps", help="list the steps of an agent run")
    p.add_argument("run")
    p.add_argument("--json", action="store_true", help="machine-readable")
    add_connection_flags(p)
    p.set_defaults(func=_runner(_steps))

    p = sub.add_parser("diff", help="compare two runs' final states")
    p.add_argument("a")
    p.add_argument("b")
    p.add_argument("--json", action="store_true", help="machine-readable")
    add_connection_flags(p)
    p.set_defaults(func=_runner(_diff))

    p = sub.add_parser("trail", help="lineage, receipts, policy decisions and ledger of a run")
    p.add_argument("run")
    p.add_argument("--json", action="store_true", help="machine-readable (all of it)")
    add_connection_flags(p)
    p.set_defaults(func=_runner(_trail))

    p = sub.add_parser("outcome", help="record an outcome (append-only)")
    p.add_argument("run")
    p.add_argument("--label", required=True)
    p.add_argument("--score", help="a finite number")
    p.add_argument("--json", action="store_true", help="print the recorded outcome (JSON)")
    add_connection_flags(p)
    p.set_defaults(func=_runner(_outcome))

    p = sub.add_parser("promote", help="promote a fork; its siblings are closed (append-only)")
    p.add_argument("run")
    p.add_argument("--json", action="store_true", help="print the promotion (JSON)")
    add_connection_flags(p)
    p.set_defaults(func=_runner(_promote))

    p = sub.add_parser("watch", help="print a run's event log from an offset")
    p.add_argument("run")
    p.add_argument("--from", dest="from_offset", default="0", help="first offset")
    p.add_argument("--follow", action="store_true", help="keep waiting until the run closes")
    p.add_argument("--json", action="store_true", help="one JSON object per event (JSON lines)")
    add_connection_flags(p)
    p.set_defaults(func=_runner(_watch))
