"""``forklab demo``: from nothing to a printed report, with an explicit approval step.

Starts what is missing (dev server, worker) in the background, runs the retry-cascade
experiment through the whole durable flow, shows progress while the worlds run, prints
the report, and stops what it started unless ``--keep`` is given.
"""

from __future__ import annotations

import argparse
import asyncio
import getpass
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import forklab.workloads
from forklab.cli.errors import CliError
from forklab.cli.experiment.approval_commands import approve, send
from forklab.cli.experiment.experiment_commands import save_report, start_experiment
from forklab.cli.experiment.specfile import load_spec
from forklab.cli.ops_common import (
    add_connection_flags,
    experiment_handle,
    live_pollers,
    open_client,
    query_status,
    run,
    settings_from,
    workflow_pollers,
)
from forklab.cli.runfork import agent_demo, fleet_demo, team_demo, workspace_command
from forklab.cli.service_commands import (
    claim_ports,
    ensure_server,
    ensure_worker,
    stop_services,
)
from forklab.experiments.experiment.report.model import Report
from forklab.experiments.experiment.report.render_summary import summary_lines
from forklab.workers.config import Settings
from forklab.workflows.experiment.messages import (
    ExperimentResult,
    RejectRequest,
    Stage,
    Status,
    StatusView,
    workflow_id,
)

#: The approver recorded when ``--yes`` approves without asking.
YES_APPROVER = "demo --yes"
_SPECS = Path(forklab.workloads.__file__).resolve().parent
POLL_SECONDS = 0.5
#: How long a worker the demo started may take to poll for the first time.
WORKER_POLL_SECONDS = 60.0


def default_spec() -> Path:
    cascade = _SPECS / "retry-cascade.yaml"
    return cascade if cascade.is_file() else _SPECS / "recovery-counter.yaml"


def _plan_lines(view: StatusView) -> list[str]:
    """What the approver signs, in four lines: the rehearsal's failure rates per world,
    the capacity verdict, the fingerprint."""
    assert view.plan is not None
    plan = view.plan
    rates = ", ".join(f"{w.name} {w.failure_rate:.0%}" for w in plan.rehearsal.worlds)
    return [
        f"rehearsed {plan.rehearsal.episodes} episodes on the local twin (free); "
        f"failure rates: {rates}",
        f"capacity: {plan.capacity.reason}",
        f"plan fingerprint {plan.fingerprint} (snapshot of {plan.snapshot.files} files)",
    ]


def _ask(fingerprint: str) -> bool:
    if not sys.stdin.isatty():
        raise CliError("no terminal to ask for approval; pass --yes to approve non-interactively")
    answer = input(f"approve plan {fingerprint[:16]}…? [y/N] ")
    return answer.strip().lower() in ("y", "yes")


async def _wait_for_worker(settings: Settings) -> None:
    """Wait until a worker polls the task queue: the demo has just started its own, and
    until its first poll reaches the server the status query would wait and warn that no
    worker polls. One that never polls is an error naming its log."""
    client = await open_client(settings)
    deadline = time.monotonic() + WORKER_POLL_SECONDS
    while time.monotonic() < deadline:
        pollers = await workflow_pollers(client, settings.namespace, settings.task_queue)
        if live_pollers(pollers, datetime.now(UTC), None):
            return
        await asyncio.sleep(POLL_SECONDS)
    raise CliError(
        f"the worker the demo started has not polled task queue {settings.task_queue!r} "
        f"within {WORKER_POLL_SECONDS:g} s; see {settings.logs_dir / 'worker.log'}"
    )


async def _wait_for_plan(settings: Settings, experiment: str) -> StatusView:
    handle = await experiment_handle(settings, experiment)
    while True:
        view = await query_status(settings, handle)
        if view.stage in (Stage.awaiting_approval, Stage.done):
            return view
        await asyncio.sleep(POLL_SECONDS)


def progress_line(view: StatusView) -> str:
    p, b = view.progress, view.budget
    sandboxes = "sandbox" if p.running == 1 else "sandboxes"
    return (
        f"[{view.stage.value}] prefixes {p.prefixes_done}/{p.prefix_chunks} · world "
        f"batches {p.batches_completed}/{p.batches} done, {p.batches_failed} failed, "
        f"{p.batches_skipped} skipped · {p.running} {sandboxes} running · "
        f"{b.spent_world_seconds:.1f} of {b.max_world_seconds:g} world-seconds"
    )


async def _follow(settings: Settings, experiment: str) -> ExperimentResult:
    """Show progress until the workflow ends: on a terminal one line rewritten in place;
    otherwise (a log, a pipe) a line per stage, so the story stays one screen long."""
    handle = await experiment_handle(settings, experiment)
    in_place = sys.stdout.isatty()
    last, stage = "", None
    task = asyncio.ensure_future(handle.result())
    while not task.done():
        view = await query_status(settings, handle)
        line = progress_line(view)
        if in_place and line != last:
            print(f"\r\033[K   {line}", end="", flush=True)
        elif not in_place and view.stage is not stage:
            print(f"   {line}", flush=True)
        last, stage = line, view.stage
        await asyncio.wait({task}, timeout=POLL_SECONDS)
    if in_place:
        print(flush=True)
    return task.result()


async def demo_flow(settings: Settings, spec_path: Path, yes: bool, full: bool) -> str:
    """Run the experiment of ``spec_path`` through the durable flow and tell its story;
    returns the experiment id."""
    spec = load_spec(str(spec_path))
    spec = spec.model_copy(update={"id": f"{spec.id}-{time.strftime('%Y%m%d-%H%M%S')}"})
    key_file = (await start_experiment(settings, spec)).key_path
    print(
        f"1. started experiment {spec.id} from {spec_path.name}: {len(spec.worlds)} worlds × "
        f"{spec.episodes} episodes of workload {spec.workload.name}"
    )
    print(f"   approver key: {key_file} (owner-only)")
    print("2. planning: rehearsal, snapshot, capacity check (no compute yet)…")
    view = await _wait_for_plan(settings, spec.id)
    if view.stage is Stage.done:
        raise CliError(f"experiment {spec.id} ended before approval: {view.error}")
    print("\n".join(f"   {line}" for line in _plan_lines(view)))
    assert view.plan is not None
    fingerprint = view.plan.fingerprint
    approved = yes or await asyncio.to_thread(_ask, fingerprint)
    if not approved:
        await send(settings, spec.id, "reject", RejectRequest(by=getpass.getuser()))
        print("3. rejected: the experiment ends without creating a sandbox")
        return spec.id
    approver = YES_APPROVER if yes else getpass.getuser()
    attempt = await approve(settings, spec.id, approver, fingerprint)
    if not attempt.accepted:
        raise CliError(f"the approval was not accepted: {attempt.reason}")
    print(f"3. approved by {approver!r}; the worlds run in local sandboxes:")
    result = await _follow(settings, spec.id)
    if result.status is not Status.completed:
        raise CliError(f"experiment {spec.id} ended {result.status.value}: {result.error}")
    files = save_report(settings, result, None)
    report = Report.model_validate_json(files.report_json)
    print("4. result:")
    print("\n".join(f"   {line}" if line else "" for line in summary_lines(report)))
    if full:
        print(f"\n{files.markdown}")
    print(f"5. report: {files.folder}/report.html (open it in a browser; also report.md, .json)")
    return spec.id


def _closing_hints(settings: Settings, experiment: str, server_stopped: bool) -> list[str]:
    """What to do next, true after the demo ends: ``forklab report`` reads the saved copy
    when the server is down, and the Web UI needs the server, so it says to start it."""
    url = settings.experiment_url(workflow_id(experiment))
    ui = f"`forklab up`, then {url}" if server_stopped else url
    return [
        f"   the full report in the terminal: forklab report {experiment} (or demo --full)",
        f"   the run in Temporal's Web UI: {ui}",
    ]


def cmd_demo(args: argparse.Namespace) -> int:
    settings = settings_from(args)
    spec_path = Path(args.spec) if args.spec else default_spec()
    # what can fail early fails before any work: no terminal to ask (and no --yes) used to
    # surface after half a minute of rehearsal, leaving an experiment awaiting approval
    if not args.yes and not sys.stdin.isatty():
        raise CliError(
            "no terminal to ask for approval; pass --yes to approve non-interactively", 2
        )
    claim_ports(settings, services={"server"})
    server = ensure_server(settings)
    worker = ensure_worker(settings)
    started = [name for name, did in (("server", server), ("worker", worker)) if did]
    if started:
        print(f"started in the background: {' and '.join(started)} (logs {settings.logs_dir})")
    experiment: str | None = None
    try:

        async def flow() -> str:
            if worker:
                await _wait_for_worker(settings)
            return await demo_flow(settings, spec_path, args.yes, args.full)

        experiment = run(flow)
    finally:
        stop = not args.keep and bool(started)
        if stop:
            stop_services(settings, worker=worker, server=server)
        if experiment is not None:
            print("\n".join(_closing_hints(settings, experiment, stop and server)))
        if args.keep:
            print(f"kept running; Web UI {settings.ui_url}; stop with `forklab down`")
        elif started:
            print(f"stopped what the demo started: {' and '.join(started)}")
    return 0


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("demo", help="run the retry-cascade experiment end to end, durably")
    p.add_argument("--yes", action="store_true", help="approve without asking (recorded)")
    p.add_argument("--keep", action="store_true", help="leave the server and worker running")
    p.add_argument(
        "--full", action="store_true", help="print the full Markdown report after the summary"
    )
    p.add_argument(
        "--spec", help="another spec to run (default: forklab/workloads/retry-cascade.yaml)"
    )
    add_connection_flags(p, ui=True)
    p.set_defaults(func=cmd_demo)
    # optional: `forklab demo` alone runs the experiment
    scenarios = p.add_subparsers(dest="scenario", metavar="[SCENARIO]")
    workspace_command.register(scenarios)
    agent_demo.register(scenarios)
    fleet_demo.register(scenarios)
    team_demo.register(scenarios)
