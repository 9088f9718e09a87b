"""``forklab doctor``: an account-wide sweep for ForkLab sandboxes left by earlier runs.

Each experiment's cleanup deletes the sandboxes labelled with its own id; a run whose
worker and server both died can leave some behind (for Daytona, until their TTL). The
doctor lists every sandbox the configured backend (``FORKLAB_SANDBOX``) holds for ForkLab,
and with ``--delete`` removes those that belong to no open run: a sandbox carries
``forklab.run = <workflow id>/<first run id>``, and one whose run Temporal reports as still
running is kept (a running experiment's batches would be killed under it). Without Temporal
nothing is deleted: whether a run is open is only known there. Exit status 1 while any
sandbox that is not kept is left.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.service import RPCError, RPCStatusCode

from forklab.activities.experiment.world_batches import RUN_LABEL
from forklab.activities.sandbox.base import SandboxBackend, SandboxError
from forklab.cli.errors import CliError
from forklab.cli.ops_common import add_connection_flags, run, settings_from
from forklab.workers.client import connect
from forklab.workers.config import ConfigError, Settings

#: A ``forklab.run`` value no run has (run keys are ``<workflow id>/<run id>``): what a
#: backend lists under it are the leftovers it lists whatever the labels (a local sandbox
#: whose registry entry is unreadable or gone), which no run can claim.
_NO_RUN = "forklab-doctor/no-such-run"
#: Runs that continued as new this recently are looked up too: the listing of open runs
#: may not show the new run of such a chain yet (it is eventually consistent), while its
#: sandboxes, labelled with the chain's first run, are live.
_CONTINUED_WINDOW = timedelta(minutes=30)


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("doctor", help="list (or delete) leftover ForkLab sandboxes")
    add_connection_flags(p)
    p.add_argument(
        "--delete",
        action="store_true",
        help="delete every sandbox whose run is not running in Temporal (those of a running "
        "run are kept; nothing is deleted when Temporal cannot be reached)",
    )
    p.add_argument("--json", action="store_true", help="machine-readable")
    p.set_defaults(func=doctor)


@dataclass(frozen=True)
class _Sweep:
    kept: dict[str, list[str]]  # run key → its sandboxes, for each run still running
    strays: list[str]  # listed under any label: no readable forklab.run label
    delete: list[str]


def doctor(args: argparse.Namespace) -> int:
    # the backends' modules (and the activities they share): imported when the doctor runs
    from forklab.workers.experiment.providers import sandbox_backend

    settings = settings_from(args)

    def say(line: str) -> None:  # the listing for people; --json prints the data at the end
        if not args.json:
            print(line)

    found: list[str] = []
    data: dict[str, Any] = {}
    try:
        backend = sandbox_backend(settings)
        found = backend.list({})
        data = {"backend": backend.name, "found": found}
        say(f"{backend.name} sandboxes: {len(found)} ForkLab sandbox(es) found")
        for sandbox_id in found:
            say(f"  {sandbox_id}")
        if args.delete and found:
            # every lookup is made before anything is deleted; ``found`` was listed first,
            # so a sandbox made since (by a run that is running) is not in it
            sweep = _sweep(backend, found, run(lambda: _open_runs(settings)))
            for key, ids in sweep.kept.items():
                say(f"kept {len(ids)} sandbox(es) of run {key}: it is still running")
            if sweep.strays:
                say(
                    f"{len(sweep.strays)} sandbox(es) without a readable {RUN_LABEL} label "
                    "(a crash's leftover no run can claim): deleting them"
                )
            for sandbox_id in sweep.delete:
                backend.delete(sandbox_id)
            doomed = set(sweep.delete)
            found = [sandbox_id for sandbox_id in backend.list({}) if sandbox_id in doomed]
            say(f"removed {len(doomed) - len(found)}, left {len(found)}")
            data |= {
                "kept": sweep.kept,
                "strays": sweep.strays,
                "removed": sorted(doomed - set(found)),
                "left": found,
            }
    except ConfigError as exc:
        raise CliError(str(exc), code=2) from None
    except SandboxError as exc:
        raise CliError(f"cannot list sandboxes: {exc}", code=1) from None
    if args.json:
        print(json.dumps(data, indent=2, sort_keys=True))
    return 1 if found else 0


def _sweep(backend: SandboxBackend, found: list[str], open_runs: list[str]) -> _Sweep:
    """Split ``found`` into the sandboxes of each open run (kept), the unlabelled leftovers
    and the rest (to delete). A sandbox without a ``forklab.run`` label, or with one of a
    run that is not open, is deleted: nothing running can own it."""
    listed = set(found)
    strays = set(backend.list({RUN_LABEL: _NO_RUN})) & listed
    kept: dict[str, list[str]] = {}
    for key in open_runs:
        ids = sorted((set(backend.list({RUN_LABEL: key})) & listed) - strays)
        if ids:
            kept[key] = ids
    keep = {sandbox_id for ids in kept.values() for sandbox_id in ids}
    return _Sweep(
        kept=kept,
        strays=sorted(strays),
        delete=[sandbox_id for sandbox_id in found if sandbox_id not in keep],
    )


async def _open_runs(settings: Settings) -> list[str]:
    """The run key (``<workflow id>/<first run id>``) of every workflow running in the
    namespace. Any failure refuses the delete: without the lookup, a running experiment's
    sandboxes could not be told from leftovers."""
    try:
        client = await connect(settings)
        return await _running_keys(client)
    except (RuntimeError, RPCError) as exc:
        reason = exc.message if isinstance(exc, RPCError) else str(exc).splitlines()[0]
        raise CliError(
            f"nothing deleted: --delete keeps the sandboxes of running experiments and cannot "
            f"ask Temporal at {settings.address} which are running ({reason}); start it with "
            "`forklab up` (or point FORKLAB_ADDRESS at your server) and retry",
            code=1,
        ) from None


async def _running_keys(client: Client) -> list[str]:
    since = (datetime.now(UTC) - _CONTINUED_WINDOW).strftime("%Y-%m-%dT%H:%M:%SZ")
    query = (
        "ExecutionStatus = 'Running' OR "
        f"(ExecutionStatus = 'ContinuedAsNew' AND CloseTime > '{since}')"
    )
    workflow_ids = sorted({execution.id async for execution in client.list_workflows(query)})
    keys: list[str] = []
    for workflow_id in workflow_ids:
        try:
            latest = await client.get_workflow_handle(workflow_id).describe()
        except RPCError as exc:
            if exc.status is RPCStatusCode.NOT_FOUND:  # gone since it was listed
                continue
            raise
        if latest.status is not WorkflowExecutionStatus.RUNNING:
            continue
        first = latest.raw_description.workflow_execution_info.first_run_id or latest.run_id
        keys.append(f"{workflow_id}/{first}")
    return keys
