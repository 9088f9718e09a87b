"""``forklab status`` and ``forklab cancel``: an experiment's state, or the local services'.

Light on purpose: this module loads neither Temporal's SDK nor the experiment's models
until it has found the server's port open (``forklab status`` answers in well under a
second either way; bench/cli_startup.py).
"""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING

from forklab.cli.errors import CliError
from forklab.cli.ops_common import (
    add_connection_flags,
    check_reachable,
    experiment_handle,
    pinned_build,
    query_status,
    run,
    settings_from,
)
from forklab.workers import processes
from forklab.workers.config import Settings
from forklab.workers.server import pidfile, reachable

if TYPE_CHECKING:
    from forklab.workflows.experiment.messages import StatusView

#: The background processes ``forklab up`` may have started, as ``forklab status`` names them.
SERVICES = ("server", "worker", "agent-worker", "model-server", "effects-service")


def services_view(settings: Settings) -> dict[str, object]:
    """What runs under ``settings.home``: whether Temporal answers on the address, and
    each background process ``forklab up`` records (its pid, or None)."""
    running = {name: processes.running(pidfile(settings, name)) for name in SERVICES}
    return {
        "address": settings.address,
        "temporal_reachable": reachable(settings.host, settings.port),
        "home": str(settings.home),
        "web_ui": settings.ui_url,
        "services": {name: (r.pid if r else None) for name, r in running.items()},
    }


def services_status(settings: Settings, as_json: bool) -> int:
    view = services_view(settings)
    if as_json:
        print(json.dumps(view, indent=2))
        return 0
    answer = "answers" if view["temporal_reachable"] else "does not answer"
    print(f"Temporal at {settings.address}: {answer}")
    services = view["services"]
    assert isinstance(services, dict)
    for name, pid in services.items():
        print(f"  {name:<16} {'running, pid ' + str(pid) if pid else 'not started by forklab up'}")
    print(f"home {settings.home}; Web UI {settings.ui_url}")
    print("an experiment's status: forklab status EXPERIMENT (ids: forklab list)")
    return 0


def render_status(view: StatusView) -> str:
    p, b, a = view.progress, view.budget, view.approval
    lines = [
        f"experiment {view.experiment_id}: {view.status.value}, stage {view.stage.value}",
        f"  {view.message}",
    ]
    if view.error:
        lines.append(f"  error: {view.error}")
    if view.plan:
        lines.append(f"  plan fingerprint {view.plan.fingerprint}")
        lines.append(f"  snapshot {view.plan.snapshot.snapshot_id}")
        if view.plan.snapshot.workload_bundle:
            lines.append(f"  workload bundle {view.plan.snapshot.workload_bundle}")
        lines.append(f"  capacity: {view.plan.capacity.reason}")
        lines.append(f"  prefixes: {view.plan.prefixes}")
    expiry = f", expires {a.expires_at:%Y-%m-%d %H:%M:%S} UTC" if a.expires_at else ""
    lines.append(f"  approval: {a.status.value}{expiry} ({a.policy})")
    if a.public_key:
        lines.append(f"    approver key {a.public_key[:16]}… in {a.key_location}")
    hidden = a.attempts_total - len(a.attempts)
    if hidden:
        lines.append(f"    ({hidden} earlier attempts not kept)")
    lines += [
        f"    {'accepted' if t.accepted else 'refused'} {t.kind} by {t.approver or '?'} "
        f"at {t.at:%H:%M:%S}: {t.reason}"
        for t in a.attempts
    ]
    lines.append(
        f"  progress: prefixes {p.prefixes_done}/{p.prefix_chunks}, world batches "
        f"{p.batches_completed}/{p.batches} done, {p.batches_failed} failed, "
        f"{p.batches_skipped} skipped; {p.running} "
        f"{'sandbox' if p.running == 1 else 'sandboxes'} running"
    )
    lines.append(
        f"  budget: {b.spent_world_seconds:.1f} of {b.max_world_seconds:g} world-seconds spent "
        f"(estimated {b.estimated_world_seconds:.1f}), peak {b.peak_concurrent_sandboxes} "
        f"of {b.max_concurrent_sandboxes} sandboxes"
    )
    if view.plan and view.plan.capacity.wave_ends:
        lines += _looks(view)
    if view.cleanup:
        lines.append(f"  cleanup: {view.cleanup.summary()}")
    return "\n".join(lines)


def _looks(view: StatusView) -> list[str]:
    """A sequential design's looks so far: per look, each world that ran into it with its
    counts, statistic against boundary and decision; then what stopping left unspent."""
    assert view.plan is not None
    ends = view.plan.capacity.wave_ends
    lines = [
        f"  sequential design: {len(view.looks)} of {len(ends)} looks decided "
        f"(waves end at episodes {', '.join(str(e) for e in ends)})"
    ]
    for look in view.looks:
        lines.append(f"    look {look.look}:")
        lines += [
            f"      {w.world}: {w.episodes} episodes, rescue {w.rescue}, harm {w.harm}, "
            f"Z {w.statistic:+.2f} vs ±{w.boundary:.2f}: {w.decision.value}"
            for w in look.worlds
        ]
    b = view.budget
    lines.append(
        f"    unspent: {b.unspent_world_episodes} world-episodes "
        f"(~{b.unspent_world_seconds:.1f} world-seconds at each world's pace)"
    )
    return lines


def cmd_status(args: argparse.Namespace) -> int:
    settings = settings_from(args)
    if args.experiment is None:
        return services_status(settings, args.json)
    check_reachable(settings)  # before the SDK and the experiment's models load
    from forklab.workflows.experiment.messages import workflow_id

    async def go() -> tuple[StatusView, tuple[str, str] | None]:
        handle = await experiment_handle(settings, args.experiment)
        return await query_status(settings, handle), await pinned_build(handle)

    view, pinned = run(go)
    if args.json:
        print(view.model_dump_json(indent=2))
    else:
        print(render_status(view))
        if pinned is not None:
            print(f"  runs on build {pinned[0]}:{pinned[1]} (pinned: its workers only)")
        print(f"  web UI: {settings.experiment_url(workflow_id(args.experiment))}")
    return 0


def cmd_cancel(args: argparse.Namespace) -> int:
    settings = settings_from(args)

    check_reachable(settings)
    from temporalio.api.enums.v1 import WorkflowExecutionStatus

    async def go() -> None:
        handle = await experiment_handle(settings, args.experiment)
        desc = await handle.describe()
        if desc.raw_description.workflow_execution_info.status != (
            WorkflowExecutionStatus.WORKFLOW_EXECUTION_STATUS_RUNNING
        ):
            raise CliError(f"experiment {args.experiment} is not running; nothing to cancel")
        await handle.cancel()

    run(go)
    print(f"cancellation requested for {args.experiment}; its cleanup deletes every sandbox")
    return 0


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "status",
        help="an experiment's stage, plan, approval, progress and budget "
        "(no id: the local services)",
    )
    p.add_argument(
        "experiment", nargs="?", help="experiment id (none: the services `forklab up` runs)"
    )
    p.add_argument("--json", action="store_true", help="machine-readable")
    add_connection_flags(p, ui=True)
    p.set_defaults(func=cmd_status)

    p = sub.add_parser("cancel", help="cancel a running experiment (cleanup still runs)")
    p.add_argument("experiment", help="experiment id")
    add_connection_flags(p)
    p.set_defaults(func=cmd_cancel)
