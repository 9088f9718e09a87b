"""``forklab demo workspace``: the coding-agent fork, run in local sandboxes; and
``forklab layers gc``: remove the workspace layers nothing needs any more.

A source agent runs the failing tests of a small package in a workspace holding a large
vendored blob; three children forked from it (copy-on-write) apply ``minimal``,
``rewrite`` and ``skip``. Prints ``summary.md`` and writes the evidence to a folder.
Exit code 0 when every check of the evidence holds, 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from temporalio.service import RPCError

from forklab.activities.runfork.coding_agent import DEFAULT_BLOB_BYTES, run_coding_agent_fork
from forklab.activities.runfork.history_reads import RunNotFound
from forklab.activities.runfork.workspace import agent_workspaces_root
from forklab.activities.sandbox.base import SandboxError
from forklab.activities.sandbox.local import LAYER_GRACE_SECONDS, LocalSandboxBackend
from forklab.activities.sandbox.workspace import GcResult, WorkspaceError
from forklab.cli.arguments import finite_number
from forklab.cli.errors import CliError
from forklab.cli.ops_common import add_connection_flags, open_client, run, settings_from
from forklab.cli.runfork.agent_lab import AgentLab
from forklab.cli.runfork.agent_services import agent_settings
from forklab.experiments.experiment.workspace_report import human_size
from forklab.workers.config import Settings
from forklab.workers.stores import artifact_store

_MIB = 1 << 20


def cmd_workspace(args: argparse.Namespace) -> int:
    if args.blob_mib < 1:
        raise CliError("--blob-mib: must be at least 1", code=2)
    settings = settings_from(args)
    out = args.out or settings.home / "workspace-demo" / time.strftime("%Y%m%d-%H%M%S")
    try:
        backend = LocalSandboxBackend(settings.sandboxes_dir, overlay=not args.no_overlay)
        summary = run_coding_agent_fork(backend, out, args.blob_mib * _MIB)
    except (SandboxError, WorkspaceError) as exc:
        raise CliError(str(exc)) from None
    except OSError as exc:
        raise CliError(f"{exc.filename or out}: {exc.strerror}") from None
    print((out / "summary.md").read_text(), end="")
    print(f"\nevidence: {out} (summary.md, summary.json, *-agent.log, changed/)")
    return 0 if all(c.ok for c in summary.checks) else 1


def register(scenarios: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = scenarios.add_parser(
        "workspace", help="fork a coding agent's workspace three ways (copy-on-write layers)"
    )
    p.add_argument(
        "--out", type=Path, help="evidence folder (default <home>/workspace-demo/<time>)"
    )
    p.add_argument(
        "--blob-mib",
        type=int,
        default=DEFAULT_BLOB_BYTES // _MIB,
        help="size of the vendored blob in MiB (default 50)",
    )
    p.add_argument(
        "--no-overlay", action="store_true", help="use the copy fallback instead of overlayfs"
    )
    p.add_argument("--home", type=Path, help="ForkLab home folder (FORKLAB_HOME, ~/.forklab)")
    p.set_defaults(func=cmd_workspace)


async def _collect_agent_layers(settings: Settings, min_age: float) -> GcResult | None:
    agent = agent_settings(settings)
    if not (agent_workspaces_root(agent.home) / "layers").is_dir():
        return None  # no agent run kept files here: no need to reach Temporal
    client = await open_client(settings)
    try:
        return await AgentLab(client, agent).collect_layers(min_age)
    except RPCError as exc:
        raise CliError(
            f"agent-run layers not collected: cannot ask Temporal which histories it keeps ({exc})"
        ) from None
    except (RunNotFound, WorkspaceError) as exc:
        raise CliError(f"agent-run layers not collected: {exc}") from None
    except OSError as exc:
        raise CliError(
            f"agent-run layers not collected: {exc.filename or agent.home}: {exc.strerror}"
        ) from None


def cmd_layers_gc(args: argparse.Namespace) -> int:
    """Remove the layers under the home's sandboxes that no run pins and no workspace sits
    on (a run unpins its layers when it cleans up; this also runs after every run, and
    drops the pins of runs the artifact store marks as ended elsewhere), and
    the agent-run layers that no history Temporal still keeps names (a run stays forkable
    at every step until its history is gone) and no recorded fork receipt needs."""
    min_age = finite_number(args.min_age, "--min-age", low=0)
    settings = settings_from(args)
    # the agent runs first: when Temporal cannot say which histories it keeps, nothing goes
    agent_result = run(lambda: _collect_agent_layers(settings, min_age))
    backend = LocalSandboxBackend(settings.sandboxes_dir)
    try:
        # the store is opened only when some run pins layers here
        ended = backend.release_ended_runs(lambda runs: artifact_store(settings).ended(runs))
    except Exception as exc:  # the store is needed only for this: collect what is known
        ended = []
        print(
            f"forklab: runs that ended on other hosts not checked ({exc}); "
            "their layers stay pinned until the store answers",
            file=sys.stderr,
        )
    try:
        result = backend.collect_layers(min_age)
    except (SandboxError, WorkspaceError) as exc:
        raise CliError(str(exc)) from None
    except OSError as exc:
        raise CliError(f"{exc.filename or settings.sandboxes_dir}: {exc.strerror}") from None
    if args.json:
        agents = None
        if agent_result is not None:
            agents = {
                "removed": len(agent_result.removed),
                "bytes_freed": agent_result.bytes_freed,
                "kept": agent_result.kept,
                "live": agent_result.live,
            }
        data = {
            "released_ended_runs": len(ended),
            "removed": len(result.removed),
            "bytes_freed": result.bytes_freed,
            "kept": result.kept,
            "live": result.live,
            "agent_runs": agents,
        }
        print(json.dumps(data, indent=2, sort_keys=True))
        return 0
    if ended:
        runs = "1 ended run" if len(ended) == 1 else f"{len(ended)} ended runs"
        print(f"released the pins of {runs} whose cleanup ran on another host")
    print(
        f"removed {len(result.removed)} layers ({human_size(result.bytes_freed)}); "
        f"kept {result.kept} ({result.live} pinned by a run or under a workspace)"
    )
    if agent_result is not None:
        print(
            f"agent runs: removed {len(agent_result.removed)} layers "
            f"({human_size(agent_result.bytes_freed)}); kept {agent_result.kept} "
            f"({agent_result.live} named by a history Temporal keeps, a fork receipt or a mount)"
        )
    return 0


def register_layers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("layers", help="workspace layers of the local sandboxes")
    actions = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    gc = actions.add_parser("gc", help="remove the layers no run and no workspace needs")
    gc.add_argument(
        "--min-age",
        default=str(LAYER_GRACE_SECONDS),
        help=f"keep layers sealed less than this many seconds ago ({LAYER_GRACE_SECONDS:g})",
    )
    gc.add_argument("--json", action="store_true", help="machine-readable")
    add_connection_flags(gc)
    gc.set_defaults(func=cmd_layers_gc)
