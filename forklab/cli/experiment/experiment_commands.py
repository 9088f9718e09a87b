"""The experiment commands: start, bundle, report (status/cancel: status_commands;
approve/reject: approval_commands)."""

from __future__ import annotations

import argparse
import asyncio
import getpass
import json
import os
import re
import socket
import sys
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path

from temporalio.api.enums.v1 import WorkflowExecutionStatus
from temporalio.common import (
    SearchAttributePair,
    TypedSearchAttributes,
    WorkflowIDConflictPolicy,
    WorkflowIDReusePolicy,
)
from temporalio.exceptions import WorkflowAlreadyStartedError
from temporalio.service import RPCError

from forklab.activities.experiment.approval_keys import (
    key_path,
    new_private_key,
    public_key_hex,
    write_private_key,
)
from forklab.activities.experiment.workload_bundles import WorkloadBundleError, ship_workload
from forklab.activities.stores.artifacts import ArtifactError
from forklab.activities.stores.outages import StoreUnavailableError
from forklab.cli.errors import CliError
from forklab.cli.experiment.report_files import write_report
from forklab.cli.experiment.specfile import SPEC_EXIT, load_spec
from forklab.cli.experiment.start_request import signed_start
from forklab.cli.experiment.workload_files import collect_workload
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
from forklab.experiments.experiment.bundle import BundleError, WorkloadBundle
from forklab.experiments.experiment.spec import ExperimentSpec
from forklab.experiments.visible_text import visible
from forklab.workers.client import ensure_search_attributes
from forklab.workers.config import Settings
from forklab.workers.server import reachable
from forklab.workers.stores import artifact_store
from forklab.workflows.experiment.messages import (
    BATCH_EPISODES_RANGE,
    DEFAULT_BATCH_EPISODES,
    DEFAULT_HISTORY_EVENTS,
    DEFAULT_REHEARSAL_EPISODES,
    HISTORY_EVENTS_RANGE,
    REHEARSAL_EPISODES_RANGE,
    WORKFLOW_TYPE,
    ExperimentInput,
    ExperimentResult,
    Stage,
    workflow_id,
)
from forklab.workflows.experiment.search_attributes import EXPERIMENT, STAGE


# --- start ----------------------------------------------------------------------------
def summary_line(text: str, limit: int = 200) -> str:
    """``text`` as the Web UI's one-line summary: whole when it fits, else cut at a word
    with "…" (a cut mid-word or mid-clause reads as the whole sentence)."""
    flat = " ".join(text.split())
    if len(flat) <= limit:
        return flat
    return flat[: limit - 1].rsplit(" ", 1)[0].rstrip(",;:") + "…"


def static_details(spec: ExperimentSpec, requested_by: str, key_folder: str) -> str:
    """What the Web UI shows of the run (Markdown); ``visible`` as what the CLI prints."""
    worlds = ", ".join(f"{w.name} ({w.role.value})" for w in spec.worlds)
    text = "\n".join(
        [
            f"**Hypothesis** {spec.hypothesis.text}",
            "",
            f"- workload: `{spec.workload.name}` · seed {spec.seed} · {spec.episodes} episodes",
            f"- worlds: {worlds}",
            f"- budget: {spec.budget.max_world_seconds:g} world-seconds, "
            f"{spec.budget.max_concurrent_sandboxes} sandboxes at once",
            f"- approval: {'required' if spec.approval.required else 'skip asked (worker decides)'}"
            f", expires after {spec.approval.expiry_minutes:g} min",
            f"- requested by {requested_by}; approver key in {key_folder}",
        ]
    )
    return visible(text)


@dataclass(frozen=True)
class Started:
    key_path: Path  # the approver's private key (owner-only, keyed by workflow id and run)
    workload_bundle: WorkloadBundle | None  # None: the workload is built into ForkLab
    workers_polling: bool  # a worker was seen polling the task queue lately


def ship_spec_workload(
    settings: Settings, spec: ExperimentSpec, source: str = "spec"
) -> WorkloadBundle | None:
    """Bundle the spec's workload as this process imports it and ship it through the
    artifact store, before anything starts: a workload that cannot be bundled stops here,
    with one sentence, before a plan, an approval or any compute."""
    try:
        files = collect_workload(spec.workload.name)
        return None if files is None else ship_workload(artifact_store(settings), files)
    except BundleError as exc:
        raise CliError(f"{source}: field workload.name: {exc}", SPEC_EXIT) from None
    except (ArtifactError, StoreUnavailableError, WorkloadBundleError) as exc:
        raise CliError(f"cannot ship the workload bundle: {exc}") from None


async def start_experiment(
    settings: Settings,
    spec: ExperimentSpec,
    batch_episodes: int = DEFAULT_BATCH_EPISODES,
    rehearsal_episodes: int = DEFAULT_REHEARSAL_EPISODES,
    history_events: int = DEFAULT_HISTORY_EVENTS,
    source: str = "spec",
) -> Started:
    """Ship the workload's bundle, then start the experiment's workflow with a fresh
    approver key. The workflow gets only the public key and the bundle's digest."""
    bundle = await asyncio.to_thread(ship_spec_workload, settings, spec, source)
    client = await open_client(settings)
    try:
        await ensure_search_attributes(client, settings.namespace)
    except RPCError as exc:
        raise CliError(
            f"cannot register ForkLab's search attributes in namespace {settings.namespace} "
            f"({exc.message}); register ForkLabExperiment and ForkLabStage (Keyword) yourself"
        ) from None
    key = new_private_key()
    requested_by = f"{getpass.getuser()}@{socket.gethostname()}"
    wid = workflow_id(spec.id)
    # The key is on disk before the workflow exists (a crash in between loses nothing but a
    # pending file), and takes its run's name once the run id is known.
    pending = write_private_key(key_path(settings.home, wid, f"pending-{os.getpid()}"), key)
    folder = pending.parent
    try:
        # by name: importing ``forklab.workflows.experiment.workflow`` would import the worker's
        # activities
        handle = await client.start_workflow(
            WORKFLOW_TYPE,
            ExperimentInput(
                spec=spec,
                approver_public_key=public_key_hex(key),
                key_location=f"{socket.gethostname()}:{folder}",
                requested_by=requested_by,
                request=signed_start(
                    settings.home,
                    workflow_id=wid,
                    experiment_id=spec.id,
                    requested_by=requested_by,
                ),
                batch_episodes=batch_episodes,
                rehearsal_episodes=rehearsal_episodes,
                workload_bundle=bundle.digest if bundle is not None else None,
                history_events=history_events,
            ),
            id=wid,
            task_queue=settings.task_queue,
            result_type=ExperimentResult,
            id_reuse_policy=WorkflowIDReusePolicy.ALLOW_DUPLICATE_FAILED_ONLY,
            id_conflict_policy=WorkflowIDConflictPolicy.FAIL,
            search_attributes=TypedSearchAttributes(
                [
                    SearchAttributePair(EXPERIMENT, spec.id),
                    SearchAttributePair(STAGE, Stage.starting.value),
                ]
            ),
            static_summary=visible(summary_line(f"ForkLab {spec.id}: {spec.hypothesis.text}")),
            static_details=static_details(spec, requested_by, str(folder)),
        )
    except WorkflowAlreadyStartedError:
        pending.unlink()
        raise CliError(
            f"experiment {spec.id!r} was already started (workflow {wid}); an experiment runs "
            "once: see `forklab status`, or give the spec a new id to run it again"
        ) from None
    except RPCError as exc:
        pending.unlink()
        raise CliError(f"Temporal refused to start experiment {spec.id!r}: {exc.message}") from None
    except BaseException:
        pending.unlink()  # no run, so no key: nothing of a start that did not happen is kept
        raise
    run_id = handle.first_execution_run_id or handle.result_run_id or ""
    path = key_path(settings.home, wid, run_id)
    os.replace(pending, path)
    try:
        pollers = await workflow_pollers(client, settings.namespace, settings.task_queue)
    except RPCError:  # the run is started: the hint below is only a hint
        pollers = []
    return Started(path, bundle, bool(live_pollers(pollers, datetime.now(UTC), None)))


def cmd_start(args: argparse.Namespace) -> int:
    spec = load_spec(args.spec)
    settings = settings_from(args)
    for flag, value, (low, high), default in (
        ("--batch-episodes", args.batch_episodes, BATCH_EPISODES_RANGE, DEFAULT_BATCH_EPISODES),
        (
            "--rehearsal-episodes",
            args.rehearsal_episodes,
            REHEARSAL_EPISODES_RANGE,
            DEFAULT_REHEARSAL_EPISODES,
        ),
        ("--history-events", args.history_events, HISTORY_EVENTS_RANGE, DEFAULT_HISTORY_EVENTS),
    ):
        if not low <= value <= high:
            raise CliError(
                f"{flag} is {value}; give a number from {low} to {high} (default {default})",
                2,
            )
    started = run(
        lambda: start_experiment(
            settings,
            spec,
            args.batch_episodes,
            args.rehearsal_episodes,
            args.history_events,
            args.spec,
        )
    )
    b = started.workload_bundle
    if args.json:
        print(
            json.dumps(
                {
                    "experiment_id": spec.id,
                    "workflow_id": workflow_id(spec.id),
                    "approver_key": str(started.key_path),
                    "workload_bundle": b.digest if b is not None else None,
                    "web_ui": settings.experiment_url(workflow_id(spec.id)),
                    "workers_polling": started.workers_polling,
                },
                indent=2,
            )
        )
    else:
        print(f"started experiment {spec.id} (workflow {workflow_id(spec.id)})")
        if b is not None:
            print(
                f"workload bundle {b.digest} ({len(b.entries)} files, {b.total_bytes:,} bytes) "
                "shipped through the artifact store"
            )
        print(f"approver key (private, readable only by you): {started.key_path}")
        print(f"watch it: {settings.experiment_url(workflow_id(spec.id))}")
    if not started.workers_polling:
        print(
            f"forklab: no worker has polled task queue {settings.task_queue!r} lately: the run "
            "waits until one does; if none runs, start one with `forklab up` (or `forklab "
            "worker` where Temporal is reachable)",
            file=sys.stderr,
        )
    if not args.json:
        print(f"next: forklab status {spec.id}   then   forklab approve {spec.id}")
    return 0


def cmd_bundle(args: argparse.Namespace) -> int:
    """Ship the spec's workload bundle and print its digest: the ``workload_bundle`` of a
    workflow input started some other way (``temporal workflow start``)."""
    spec = load_spec(args.spec)
    bundle = ship_spec_workload(settings_from(args), spec, args.spec)
    if bundle is None:
        print(f"workload {spec.workload.name!r} is built into ForkLab: nothing to ship")
    else:
        print(bundle.digest)
    return 0


# --- report ---------------------------------------------------------
#: The workspace evidence files a report folder may receive (see ``workspace_section``).
_WORKSPACE_FILE = re.compile(r"workspace-[A-Za-z0-9_.-]+\.json")


@dataclass(frozen=True)
class ReportFiles:
    """A durable run's report as written to ``folder``."""

    folder: Path
    markdown: str
    report_json: str
    html: str
    #: A workload with files: its workspace manifests and diffs, written beside the report.
    workspace_files: tuple[str, ...] = ()


async def fetch_result(settings: Settings, experiment: str) -> ExperimentResult:
    handle = await experiment_handle(settings, experiment)
    desc = await handle.describe()
    if desc.raw_description.workflow_execution_info.status == (
        WorkflowExecutionStatus.WORKFLOW_EXECUTION_STATUS_RUNNING
    ):
        view = await query_status(settings, handle)
        if view.stage is Stage.awaiting_approval:
            raise CliError(
                f"experiment {experiment} is awaiting approval and has no report until it is "
                f"decided: approve it (`forklab approve {experiment}`) or reject it "
                f"(`forklab reject {experiment}`); `forklab status {experiment}` shows the plan"
            )
        raise CliError(
            f"experiment {experiment} is still running (stage {view.stage.value}); "
            f"wait for it, or watch `forklab status {experiment}`"
        )
    view = await query_status(settings, handle)
    try:
        return await handle.result()
    except Exception:  # cancelled or terminated: the status query still has the story
        raise CliError(
            f"experiment {experiment} ended {view.status.value} without a report"
            f"{': ' + view.error if view.error else ''}"
        ) from None


def save_report(settings: Settings, result: ExperimentResult, folder: Path | None) -> ReportFiles:
    """Write the run's stored report (Markdown, JSON, HTML) into ``folder``, by default
    ``<home>/reports/<experiment id>/``; the JSON is the stored report, indented."""
    if result.analysis is None:
        raise CliError(
            f"experiment {result.experiment_id} ended {result.status.value} without a report"
            f"{': ' + result.error if result.error else ''}"
        )
    store = artifact_store(settings)
    analysis = result.analysis
    try:
        files = ReportFiles(
            folder=folder or settings.reports_dir / result.experiment_id,
            markdown=store.get_bytes(analysis.markdown_digest).decode(),
            report_json=json.dumps(store.get_json(analysis.report_digest), indent=2) + "\n",
            html=store.get_bytes(analysis.html_digest).decode(),
        )
        extra: dict[str, str] = (
            store.get_json(analysis.workspace_files_digest)
            if analysis.workspace_files_digest
            else {}
        )
    except (ArtifactError, StoreUnavailableError) as exc:
        raise CliError(str(exc)) from None
    if not all(_WORKSPACE_FILE.fullmatch(name) for name in extra):
        raise CliError("the stored workspace evidence names a file outside the report folder")
    files = replace(files, workspace_files=tuple(sorted(extra)))
    write_report(
        {
            "report.md": files.markdown,
            "report.json": files.report_json,
            "report.html": files.html,
            **extra,
        },
        files.folder,
    )
    return files


#: An experiment id, as the spec allows it (``ExperimentSpec.id``): safe as a folder name.
_EXPERIMENT_ID = re.compile(r"[a-z0-9][a-z0-9-]{0,79}")


def saved_report(settings: Settings, experiment: str) -> ReportFiles | None:
    """The report an earlier ``forklab report`` or ``forklab demo`` saved under
    ``<home>/reports/<experiment>/``, if there is one: what the operator can still read
    when the server that ran it is down (the demo stops the server it started)."""
    if not _EXPERIMENT_ID.fullmatch(experiment):
        return None
    folder = settings.reports_dir / experiment
    try:
        return ReportFiles(
            folder=folder,
            markdown=(folder / "report.md").read_text(encoding="utf-8"),
            report_json=(folder / "report.json").read_text(encoding="utf-8"),
            html="",
        )
    except OSError:
        return None


def cmd_report(args: argparse.Namespace) -> int:
    settings = settings_from(args)
    saved = None if args.out else saved_report(settings, args.experiment)
    if saved is not None and not reachable(settings.host, settings.port):
        text = saved.report_json if args.json else saved.markdown
        print(text, end="" if text.endswith("\n") else "\n")
        print(
            f"Temporal is not reachable at {settings.address}: this is the report saved in "
            f"{saved.folder} (`forklab up` to read the run itself)",
            file=sys.stderr,
        )
        return 0
    result = run(lambda: fetch_result(settings, args.experiment))
    files = save_report(settings, result, args.out)
    wrote = f"wrote report.md, report.json and report.html to {files.folder}"
    if files.workspace_files:
        wrote += f" (and {len(files.workspace_files)} workspace manifest and diff files)"
    # the report on stdout, the line about the files on stderr: `report X > r.md` is Markdown
    text = files.report_json if args.json else files.markdown
    print(text, end="" if text.endswith("\n") else "\n")
    print(wrote, file=sys.stderr)
    return 0


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "start", help="start an experiment's durable workflow (writes the run's approver key)"
    )
    p.add_argument("spec", help="path to the experiment spec (.yaml or .json)")
    p.add_argument(
        "--batch-episodes",
        type=int,
        default=DEFAULT_BATCH_EPISODES,
        help="episodes per world batch (one sandbox each)",
    )
    p.add_argument(
        "--rehearsal-episodes",
        type=int,
        default=DEFAULT_REHEARSAL_EPISODES,
        help="episodes the rehearsal times for the estimate (0: all)",
    )
    p.add_argument(
        "--history-events",
        type=int,
        default=DEFAULT_HISTORY_EVENTS,
        help="events one workflow run records at most before it continues as new",
    )
    p.add_argument("--json", action="store_true", help="machine-readable")
    add_connection_flags(p, ui=True)
    p.set_defaults(func=cmd_start)

    p = sub.add_parser(
        "bundle",
        help="ship the spec's workload bundle to the artifact store and print its digest "
        "(the workload_bundle of a raw `temporal workflow start`)",
    )
    p.add_argument("spec", help="path to the experiment spec (.yaml or .json)")
    add_connection_flags(p)
    p.set_defaults(func=cmd_bundle)

    p = sub.add_parser(
        "report", help="write a finished experiment's report (.md, .json, .html); print it"
    )
    p.add_argument("experiment", help="experiment id")
    p.add_argument("--json", action="store_true", help="print the JSON report instead")
    p.add_argument(
        "--out",
        metavar="DIR",
        type=Path,
        default=None,
        help="folder for report.md, .json and .html (default: <home>/reports/<experiment id>)",
    )
    add_connection_flags(p)
    p.set_defaults(func=cmd_report)
