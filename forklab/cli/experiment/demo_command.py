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
from pathlib import Path

import forklab.workloads
from forklab.cli.errors import CliError
from forklab.cli.experiment.approval_commands import approve, send
from forklab.cli.experiment.experiment_commands import save_report, start_experiment
from forklab.cli.experiment.specfile import load_spec
from forklab.cli.ops_common import (
    add_connection_flags,
    experiment_handle,
    query_status,
    run,
    settings_from,
)
from forklab.cli.runfork import agent_demo, fleet_demo, workspace_command
from forklab.cli.service_commands import (
    claim_ports,
    ensure_server,
    ensure_worker,
    stop_services,
)
from forklab.workers.config import Settings
from forklab.workers.stores import artifact_store, ledger
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


def default_spec() -> Path:
    cascade = _SPECS / "retry-cascade.yaml"
    return cascade if cascade.is_file() else _SPECS / "recovery-counter.yaml"


def _plan_lines(view: StatusView) -> list[str]:
    assert view.plan is not None
    plan = view.plan
    lines = [
        f"plan fingerprint {plan.fingerprint}",
        f"snapshot {plan.snapshot.snapshot_id} ({plan.snapshot.files} files)",
        f"rehearsal on {plan.rehearsal.episodes} episodes (local twin, free):",
    ]
    lines += [f"  {w.name:<18} failure rate {w.failure_rate:6.1%}" for w in plan.rehearsal.worlds]
    lines.append(f"capacity: {plan.capacity.reason}")
    lines.append(f"prefixes: {plan.prefixes}")
    return lines


def _ask(fingerprint: str) -> bool:
    if not sys.stdin.isatty():
        raise CliError("no terminal to ask for approval; pass --yes to approve non-interactively")
    answer = input(f"approve plan {fingerprint[:16]}…? [y/N] ")
    return answer.strip().lower() in ("y", "yes")


async def _wait_for_plan(settings: Settings, experiment: str) -> StatusView:
    handle = await experiment_handle(settings, experiment)
    while True:
        view = await query_status(settings, handle)
        if view.stage in (Stage.awaiting_approval, Stage.done):
            return view
        await asyncio.sleep(POLL_SECONDS)


async def _follow(settings: Settings, experiment: str) -> ExperimentResult:
    """Print a progress line whenever it changes, until the workflow ends."""
    handle = await experiment_handle(settings, experiment)
    last = ""
    task = asyncio.ensure_future(handle.result())
    while not task.done():
        view = await query_status(settings, handle)
        p, b = view.progress, view.budget
        line = (
            f"  [{view.stage.value}] prefixes {p.prefixes_done}/{p.prefix_chunks} · world "
            f"batches {p.batches_completed}/{p.batches} done, {p.batches_failed} failed, "
            f"{p.batches_skipped} skipped, {p.running} sandboxes running · "
            f"{b.spent_world_seconds:.1f}/{b.max_world_seconds:g} world-seconds"
        )
        if line != last:
            print(line, flush=True)
            last = line
        await asyncio.wait({task}, timeout=POLL_SECONDS)
    return task.result()


async def demo_flow(settings: Settings, spec_path: Path, yes: bool) -> int:
    spec = load_spec(str(spec_path))
    spec = spec.model_copy(update={"id": f"{spec.id}-{time.strftime('%Y%m%d-%H%M%S')}"})
    key_file = (await start_experiment(settings, spec)).key_path
    print(f"1. started experiment {spec.id} from {spec_path.name}")
    print(f"   Web UI: {settings.experiment_url(workflow_id(spec.id))}")
    print(f"   approver key written to {key_file} (owner-only)")
    print("2. rehearsing, resolving the snapshot and checking capacity (no compute yet)…")
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
        return 1
    approver = YES_APPROVER if yes else getpass.getuser()
    attempt = await approve(settings, spec.id, approver, fingerprint)
    if not attempt.accepted:
        raise CliError(f"the approval was not accepted: {attempt.reason}")
    print(f"3. approved by {approver!r}; worlds now run in local sandboxes:")
    result = await _follow(settings, spec.id)
    if result.status is not Status.completed:
        raise CliError(f"experiment {spec.id} ended {result.status.value}: {result.error}")
    files = save_report(settings, result, None)
    print("4. report:\n")
    print(files.markdown)
    cleanup = result.cleanup
    if cleanup is not None:
        print(
            f"cleanup: {cleanup.found} sandboxes found, {cleanup.removed} removed, "
            f"{cleanup.left} left"
        )
    print(f"report files: report.md, report.json and report.html in {files.folder}")
    print(f"ledger: {ledger(settings).location}; artifacts: {artifact_store(settings).location}")
    print(f"again later: forklab report {spec.id}")
    return 0


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
    try:
        return run(lambda: demo_flow(settings, spec_path, args.yes))
    finally:
        if args.keep:
            print(f"kept running; Web UI {settings.ui_url}; stop with `forklab down`")
        elif started:
            stop_services(settings, worker=worker, server=server)
            print(f"stopped what the demo started: {' and '.join(started)}")


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("demo", help="run the retry-cascade experiment end to end, durably")
    p.add_argument("--yes", action="store_true", help="approve without asking (recorded)")
    p.add_argument("--keep", action="store_true", help="leave the server and worker running")
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
