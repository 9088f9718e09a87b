"""``forklab fork|steps|diff|trail|outcome|promote|watch``: fork agent runs and decide
between the forks. Thin shells over ``forklab.cli.runfork.agent_lab.AgentLab``."""

from __future__ import annotations

import argparse
import asyncio
import getpass
import json
import re
import sys
from typing import Any

from forklab.activities.runfork.history_reads import RunNotFound
from forklab.activities.runfork.overrides import make_override
from forklab.cli.arguments import finite_number, json_object, json_value, whole_number
from forklab.cli.errors import CliError
from forklab.cli.ops_common import add_connection_flags, command, plain_client, settings_from
from forklab.cli.runfork.agent_lab import ACTING_KINDS, AgentLab, ForkError, Timeline
from forklab.cli.runfork.agent_services import agent_settings
from forklab.contracts.fork_request import ForkOptions, ForkRequest
from forklab.contracts.runfork import ForkPoint
from forklab.experiments.runfork.approximations import Approximation, ApproximationKind
from forklab.experiments.runfork.diff import change_lines
from forklab.experiments.runfork.overrides import ForkSignal, ResultOverride
from forklab.experiments.runfork.policy import (
    DEFAULT_KEY,
    PolicyError,
    ToolPolicy,
    parse_policies,
)
from forklab.experiments.runfork.promotion import SiblingRun
from forklab.experiments.runfork.receipt import (
    CANCEL_REQUEST_KIND,
    SENT_SIGNAL_KIND,
    BoundaryMode,
    ForkReceipt,
    PrefixEvent,
)

BAD_INPUT = 2
STEPS_HELP = "list the steps of an agent run, its other events and where it forks exactly"
PROMOTE_HELP = "promote a fork; its siblings are closed (append-only), running ones cancelled"
WATCH_POLL_SECONDS = 0.5


async def open_lab(args: argparse.Namespace) -> AgentLab:
    """The lab of the settings ``args`` name, on a plain client (``plain_client``)."""
    settings = settings_from(args)
    return AgentLab(await plain_client(settings), agent_settings(settings))


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


_STEP = re.compile(r"^[0-9]{1,9}$")
_SIGNAL = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]{0,199}$")


def _step_json(flag: str, text: str | None) -> tuple[int, Any] | None:
    """``N=JSON`` (``--override-result``, ``--override-input``), or one line, exit 2."""
    if text is None:
        return None
    step_text, sep, value_text = text.partition("=")
    if not sep or not _STEP.match(step_text) or int(step_text) < 1:
        raise CliError(
            f"{flag} {text[:40]!r} is not N=JSON (e.g. 3='\"approved\"')", code=BAD_INPUT
        )
    return int(step_text), json_value(value_text, f"{flag}'s value")


def _parse_signal(text: str) -> ForkSignal:
    """``--signal NAME`` or ``--signal NAME=JSON`` (one line, exit 2, when malformed)."""
    name, sep, value_text = text.partition("=")
    if not _SIGNAL.match(name):
        raise CliError(
            f"--signal {text[:40]!r}: give NAME or NAME=JSON (a name of letters, digits, _ . -)",
            code=BAD_INPUT,
        )
    args = [json_value(value_text, f"--signal {name}'s value")] if sep else []
    return ForkSignal(name=name, args=args)


def _parse_override(text: str | None) -> ResultOverride | None:
    """``--override-result N=JSON``: step N's result on the fork."""
    given = _step_json("--override-result", text)
    if given is None:
        return None
    try:
        return make_override(*given)
    except ValueError as exc:
        raise CliError(str(exc), code=BAD_INPUT) from None


def fork_options(args: argparse.Namespace) -> ForkOptions:
    """What ``forklab fork`` and ``forklab fork-team`` ask the fork to change
    (``--intervention``, ``--model``, the overrides, ``--signal``, ``--tool-policy``,
    ``--live-after``, ``--boundary``); one line, exit 2, on bad input."""
    intervention = _parse_intervention(args.intervention)
    override = _parse_override(args.override_result)
    asked = _step_json("--override-input", args.override_input)
    signals = [_parse_signal(text) for text in args.signal or []]
    given = list(args.tool_policy or [])
    if args.live_after and not any(p.partition("=")[0].strip() == DEFAULT_KEY for p in given):
        given.append(f"{DEFAULT_KEY}={ToolPolicy.live.value}")
    try:
        policies = parse_policies(given)
    except PolicyError as exc:
        raise CliError(str(exc), code=BAD_INPUT) from None
    return ForkOptions(
        intervention=intervention,
        model=args.model,
        tool_policies=policies,
        boundary=BoundaryMode(args.boundary),
        result_override=override,
        input_override=asked,
        signals=signals,
    )


def step_asked(args: argparse.Namespace, options: ForkOptions) -> int | None:
    """``--at-step N``, or the step an override implies: N for ``--override-result N=``
    (the fork is at N), N-1 for ``--override-input N=`` (step N runs live); None when
    neither says."""
    if args.at_step is not None:
        return whole_number(args.at_step, "--at-step")
    if options.result_override is not None:
        return options.result_override.step
    if options.input_override is not None:
        return options.input_override[0] - 1
    return None


def _print_json(value: Any) -> None:
    print(json.dumps(value, indent=2, sort_keys=True, default=str))


@_guard
async def _fork(args: argparse.Namespace) -> int:
    wait = finite_number(args.wait, "--wait", 0, 3600)
    changes = fork_options(args)
    at_step = step_asked(args, changes)
    lab = await open_lab(args)
    point: str | None = None
    if args.at is not None:
        point, at_step = await lab.resolve_at(args.run, args.at)
    if at_step is None:
        raise CliError(
            "give --at-step N, --at POINT, --override-result N=JSON or --override-input N=JSON",
            code=BAD_INPUT,
        )
    fork = await lab.fork(
        ForkRequest(
            run=args.run,
            at_step=at_step,
            name=args.name,
            point=point,
            allow_build_change=args.allow_build_change,
            **changes.options(),
        )
    )
    started = (
        f"fork {fork.receipt.fork_workflow_id} started (workflow run {fork.handle.result_run_id})"
    )
    # --json: the receipt alone on stdout (what happened goes to stderr)
    say = sys.stderr if args.json else sys.stdout
    print(started, file=say)
    reached = await lab.fork_point(fork, timeout=wait) if wait else None
    for line in _fork_point_lines(fork.receipt, reached, wait):
        print(line, file=sys.stderr)  # stdout stays the started line and the receipt
    _print_json(fork.receipt.model_dump(mode="json"))
    return 0


def _fork_point_lines(receipt: ForkReceipt, point: ForkPoint | None, wait: float) -> list[str]:
    """What ``forklab fork`` learnt waiting for the fork to pass its prefix: the calls an
    approximate boundary served with drifted inputs, and the builds."""
    if not wait:
        return []
    if point is None:
        return [
            f"the fork has not passed its prefix after {wait:g} s (is a worker with "
            "ForkLabPlugin running on the fork queue?); `forklab steps` shows where it is"
        ]
    known = [a for a in receipt.approximations if a.kind is not ApproximationKind.noted]
    lines = [f"approximately: {a.line()}" for a in known]
    lines += [f"approximately: {d}" for d in point.drift]
    builds = f"builds: the parent's prefix was recorded by {receipt.parent_build or '(none named)'}"
    return [*lines, f"{builds}; the fork runs on {point.build or '(none named)'}"]


@_guard
async def _steps(args: argparse.Namespace) -> int:
    lab = await open_lab(args)
    timeline = await lab.timeline(args.run)
    if args.json:
        _print_json(
            {
                "steps": [
                    {
                        **s.model_dump(mode="json", exclude={"result_b64"}),
                        "forkable": timeline.not_forkable.get(s.index) is None,
                        "not_forkable_because": timeline.not_forkable.get(s.index),
                    }
                    for s in timeline.steps
                ],
                "events": [e.model_dump(mode="json") for e in timeline.events],
            }
        )
        return 0
    print(render_steps(timeline))
    return 0


def render_steps(timeline: Timeline) -> str:
    """``forklab steps`` for people: a row per step (``fork`` says whether ``--at-step``
    there forks exactly), and, between them, the timers, children, signals, updates and
    local activities that reached the run after the step above, and the signals and
    cancel requests it sent other workflows (each naming the workflow). Local activities and
    child workflows are no steps (a fork cannot serve them), but a fork's policies reach
    them: each has a row of its own, saying whether the fork refused it."""
    lines = [f"{'step':>5}  {'origin':<9} {'status':<9} {'ms':>8}  input sha256  fork  call"]
    events = sorted(timeline.events, key=lambda e: e.after_step)
    shown = 0
    for s in timeline.steps:
        while shown < len(events) and events[shown].after_step < s.index:
            lines.append(_event_row(events[shown]))
            shown += 1
        ms = f"{s.duration_ms:8.1f}" if s.duration_ms is not None else "       -"
        fork = "no" if timeline.not_forkable.get(s.index) else "yes"
        lines.append(
            f"{s.index:>5}  {s.origin:<9} {s.status.value:<9} {ms}  {s.input_sha256[:12]}  "
            f"{fork:<4}  {s.label or s.activity_type}"
        )
    lines += [_event_row(e) for e in events[shown:]]
    return "\n".join(lines)


def _event_row(e: PrefixEvent) -> str:
    if e.kind == SENT_SIGNAL_KIND:  # what reached another workflow, and which
        return f"{'':>5}  · signal {e.name[:100]!r} sent to {(e.child_id or '?')[:100]}"
    if e.kind == CANCEL_REQUEST_KIND:
        return f"{'':>5}  · cancel requested of {(e.child_id or '?')[:100]}"
    if e.kind not in ACTING_KINDS:
        return f"{'':>5}  {'· ' + e.kind}"
    origin = "local" if e.kind == "local activity" else "child"
    what = f"child workflow {e.child_id}" if e.child_id else e.kind
    status = "blocked" if e.blocked else ""
    return (
        f"{'-':>5}  {origin:<9} {status:<9} {'-':>8}  {'-':<12}  {'':<4}  {e.name or '?'} ({what})"
    )


@_guard
async def _diff(args: argparse.Namespace) -> int:
    from forklab.cli.runfork.team_fork_commands import team_trail_or_diff

    if args.b is None:
        code = await team_trail_or_diff(args, "diff")
        if code is None:
            raise CliError(f"{args.a!r} is no team fork: give two runs to diff", code=BAD_INPUT)
        return code
    lab = await open_lab(args)
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
    from forklab.cli.runfork.team_fork_commands import team_trail_or_diff

    code = await team_trail_or_diff(args, "trail")
    if code is not None:
        return code
    lab = await open_lab(args)
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
        if r.get("result_override"):
            o = r["result_override"]
            model += f", step {o['step']} returns {json.dumps(o['value'])[:80]}"
        if r.get("signals"):
            model += ", signals " + ", ".join(g["name"] for g in r["signals"])
        if r.get("input_override"):
            o = r["input_override"]
            model += f", step {o['step']} asked {json.dumps(o['value'])[:80]}"
        lines.append(
            f"  fork {r['fork_workflow_id']} of {r['parent_workflow_id']} at step "
            f"{r['resolved_step']} (asked {r['requested_step']}, boundary {r['boundary']}{model})"
        )
        lines += [
            f"    approximately: {Approximation.model_validate(a).line()}"
            for a in r.get("approximations", [])
        ]
    receipt = trail["receipts"][-1] if trail["receipts"] else None
    if receipt is not None and receipt["fork_workflow_id"] == trail["run"]:
        lines.append(
            f"  build: predicted {receipt.get('fork_build') or '(none polling)'}, ran "
            f"{trail.get('build_ran') or '(not yet)'}"
        )
    if trail.get("drift"):
        lines.append("  input drift the fork recorded as it ran:")
        lines += [f"    {Approximation.model_validate(d).line()}" for d in trail["drift"]]
    if trail["policy_decisions"]:
        lines.append("  steps not run live:")
        lines += [
            f"    {d['index']:>4} {d['activity_type']}: {d['origin']}"
            for d in trail["policy_decisions"]
        ]
    lines.append(f"  ledger: {len(trail['ledger'])} effects")
    lines += [f"    {json.dumps(e, sort_keys=True, default=str)[:160]}" for e in trail["ledger"]]
    for sibling, what in trail.get("closed_siblings", {}).items():
        lines.append(f"  closed by this promotion: {sibling} ({what})")
    lines.append(f"  decisions: {len(trail['decisions'])}")
    lines += [f"    {json.dumps(d, sort_keys=True, default=str)[:160]}" for d in trail["decisions"]]
    return "\n".join(lines)


@_guard
async def _outcome(args: argparse.Namespace) -> int:
    score = None if args.score is None else finite_number(args.score, "--score")
    lab = await open_lab(args)
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
    lab = await open_lab(args)
    by = getpass.getuser()
    promotion = await lab.promote(args.run, by, keep_running=args.keep_running)
    if args.json:
        _print_json(
            {
                "promoted": args.run,
                "closed": promotion.closed,
                "siblings": {k: v.value for k, v in promotion.siblings.items()},
                "by": by,
            }
        )
        return 0
    print(f"promoted {args.run}; closed: {', '.join(promotion.closed) or '(none)'}")
    for sibling, what in promotion.siblings.items():
        print(f"  {sibling}: {_SIBLING_RUN[what]}")
    return 0


_SIBLING_RUN = {
    SiblingRun.cancelled: "was running; cancellation requested in Temporal",
    SiblingRun.left_running: "left running in Temporal (--keep-running)",
    SiblingRun.already_closed: "had already closed in Temporal",
}


#: Event fields ``watch_line`` shows in its columns; the rest follow as key=value.
_WATCH_COLUMNS = ("kind", "step", "call", "activity", "attempt")
#: The longest value ``watch_line`` shows of an extra field (``--json`` has them whole).
_WATCH_VALUE_WIDTH = 80


def watch_line(offset: int, event: dict[str, Any]) -> str:
    """One run-log event for people: offset, step (``call N`` while a call is pending and
    has no step number yet), kind, activity (and its attempt when it is a retry), then any
    other field as ``key=value``, long values cut."""
    step, call = event.get("step"), event.get("call")
    where = f"step {step}" if step is not None else f"call {call}" if call is not None else ""
    line = f"{offset:>6}  {where:<8} {event.get('kind', 'event')!s:<15} {event.get('activity', '')}"
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
    lab = await open_lab(args)
    await lab.is_closed(args.run)  # the run must exist
    stream = await lab.run_stream(args.run)  # its latest chain's, not an earlier one's
    after = first - 1
    while True:
        events = lab.watch(stream, after)
        for e, event in zip(events, await lab.numbered(args.run, events), strict=True):
            if args.json:  # one JSON object a line, so a reader can follow the stream
                print(json.dumps({"offset": e.offset, **event}, sort_keys=True), flush=True)
            else:
                print(watch_line(e.offset, event), flush=True)
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


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("fork", help="fork an agent run at a step into a new workflow")
    p.add_argument("run", help="workflow id of the run to fork")
    at = p.add_mutually_exclusive_group()
    at.add_argument("--at-step", help="inherit steps 1..N")
    at.add_argument(
        "--at",
        metavar="POINT",
        help="fork where something happened; that step runs live, the steps before it are "
        "inherited: failed (the first failed step), tool:NAME (its last call), tool:NAME#k "
        "(its k-th), last_model_call_before_failure, step:N",
    )
    p.add_argument("--name", help="workflow id of the fork (default: RUN--fork-XXXX)")
    p.add_argument("--intervention", help="opaque JSON object the workflow may read")
    p.add_argument("--model", help="swap the model of every live model call")
    p.add_argument(
        "--override-result",
        metavar="N=JSON",
        help="inherit steps 1..N-1 and serve JSON as step N's result (the fork is at N)",
    )
    p.add_argument(
        "--override-input",
        metavar="N=JSON",
        help="inherit steps 1..N-1 and run step N live with JSON as its (first) argument",
    )
    p.add_argument(
        "--signal",
        action="append",
        metavar="NAME[=JSON]",
        help="deliver this signal to the fork's workflow at the fork point (repeatable)",
    )
    p.add_argument(
        "--live-after",
        action="store_true",
        help="every step after the boundary runs live (the default policy '*' becomes live)",
    )
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
    p.add_argument(
        "--allow-build-change",
        action="store_true",
        help="a fork on another build than the parent's whose prefix notices the change is "
        "served the parent's results approximately instead of failing (kept in the receipt)",
    )
    p.add_argument(
        "--wait",
        default="30",
        metavar="SECONDS",
        help="wait this long for the fork to pass its prefix, and fail (exit 2) with its "
        "sentence when it fails there; 0: do not wait (default 30)",
    )
    p.add_argument("--json", action="store_true", help="print the receipt only (JSON)")
    add_connection_flags(p)
    p.set_defaults(func=command(_fork))

    p = sub.add_parser("steps", help=STEPS_HELP)
    p.add_argument("run")
    p.add_argument("--json", action="store_true", help="machine-readable")
    add_connection_flags(p)
    p.set_defaults(func=command(_steps))

    p = sub.add_parser("diff", help="compare two runs' final states")
    p.add_argument("a")
    p.add_argument("b", nargs="?", help="omitted: A is a team fork, compare each member's fork")
    p.add_argument("--json", action="store_true", help="machine-readable")
    add_connection_flags(p)
    p.set_defaults(func=command(_diff))

    p = sub.add_parser("trail", help="lineage, receipts, policy decisions and ledger of a run")
    p.add_argument("run")
    p.add_argument("--json", action="store_true", help="machine-readable (all of it)")
    add_connection_flags(p)
    p.set_defaults(func=command(_trail))

    p = sub.add_parser("outcome", help="record an outcome (append-only)")
    p.add_argument("run")
    p.add_argument("--label", required=True)
    p.add_argument("--score", help="a finite number")
    p.add_argument("--json", action="store_true", help="print the recorded outcome (JSON)")
    add_connection_flags(p)
    p.set_defaults(func=command(_outcome))

    p = sub.add_parser("promote", help=PROMOTE_HELP)
    p.add_argument("run")
    p.add_argument(
        "--keep-running",
        action="store_true",
        help="leave siblings that are still running in Temporal running (recorded as such)",
    )
    p.add_argument("--json", action="store_true", help="print the promotion (JSON)")
    add_connection_flags(p)
    p.set_defaults(func=command(_promote))

    p = sub.add_parser("watch", help="print a run's event log from an offset")
    p.add_argument("run")
    p.add_argument("--from", dest="from_offset", default="0", help="first offset")
    p.add_argument("--follow", action="store_true", help="keep waiting until the run closes")
    p.add_argument("--json", action="store_true", help="one JSON object per event (JSON lines)")
    add_connection_flags(p)
    p.set_defaults(func=command(_watch))
