"""``forklab cohort start|status|approve|report|cancel``: experiments over a cohort of
recorded agent runs (docs/agent-experiments.md), on the worker that runs experiments.

``start`` starts the ``ForkLabCohortExperiment`` workflow with a fresh approver key (the
workflow holds only its public half, as for workload experiments); ``approve`` signs the
plan fingerprint the workflow shows, which covers the cohort, with that key."""

from __future__ import annotations

import argparse
import asyncio
import getpass
import os
import socket
from typing import Any

from temporalio.client import WorkflowFailureError, WorkflowHandle
from temporalio.common import WorkflowIDConflictPolicy, WorkflowIDReusePolicy
from temporalio.exceptions import WorkflowAlreadyStartedError
from temporalio.service import RPCError, RPCStatusCode

from forklab.activities.experiment.approval_keys import (
    KeyFileError,
    key_path,
    new_private_key,
    personal_key_path,
    public_key_hex,
    read_private_key,
    write_private_key,
)
from forklab.activities.runfork.cohort_plans import CohortPlans
from forklab.activities.stores.artifacts import ArtifactError
from forklab.cli.errors import CliError
from forklab.cli.experiment.cohort_bundle import ship_cohort_code
from forklab.cli.experiment.design_text import design_text
from forklab.cli.experiment.specfile import load_cohort_spec
from forklab.cli.ops_common import add_connection_flags, open_client, run, settings_from
from forklab.contracts.approval import approval_payload, sign
from forklab.contracts.cohort import CohortReport
from forklab.experiments.cohort.plan import CohortPlan
from forklab.experiments.cohort.spec import CohortExperimentSpec
from forklab.workers.config import Settings
from forklab.workers.stores import artifact_store
from forklab.workflows.experiment.cohort_messages import (
    STATUS_QUERY,
    WORKFLOW_TYPE,
    CohortInput,
    CohortResult,
    CohortStatusView,
)
from forklab.workflows.experiment.messages import ApprovalAttempt, Stage, Status, workflow_id


async def _handle(settings: Settings, experiment: str) -> WorkflowHandle[Any, CohortResult]:
    client = await open_client(settings)
    handle = client.get_workflow_handle(workflow_id(experiment), result_type=CohortResult)
    try:
        await handle.describe()
    except RPCError as exc:
        if exc.status is RPCStatusCode.NOT_FOUND:
            raise CliError(
                f"no cohort experiment {experiment!r} (workflow {workflow_id(experiment)}) in "
                f"namespace {settings.namespace}; start one with `forklab cohort start SPEC`"
            ) from None
        raise CliError(f"cannot look up experiment {experiment!r}: {exc.message}") from None
    return handle


async def status_of(settings: Settings, experiment: str) -> CohortStatusView:
    handle = await _handle(settings, experiment)
    view: CohortStatusView = await handle.query(STATUS_QUERY, result_type=CohortStatusView)
    return view


async def start(settings: Settings, path: str) -> tuple[str, str]:
    """Start the experiment of the cohort spec at ``path``; its workflow id and key file."""
    return await start_spec(settings, load_cohort_spec(path), path)


async def start_spec(
    settings: Settings, spec: CohortExperimentSpec, source: str = "spec"
) -> tuple[str, str]:
    """Ship the bundle of the spec's own scorer and feature functions (if it names any),
    then start its experiment with a fresh approver key (private half on disk, owner only;
    the workflow gets the public half); its workflow id and key file."""
    bundle = await asyncio.to_thread(ship_cohort_code, settings, spec, source)
    client = await open_client(settings)
    key = new_private_key()
    wid = workflow_id(spec.id)
    pending = write_private_key(key_path(settings.home, wid, f"pending-{os.getpid()}"), key)
    try:
        handle = await client.start_workflow(
            WORKFLOW_TYPE,
            CohortInput(
                spec=spec,
                approver_public_key=public_key_hex(key),
                key_location=f"{socket.gethostname()}:{pending.parent}",
                requested_by=f"{getpass.getuser()}@{socket.gethostname()}",
                code_bundle=bundle.digest if bundle is not None else None,
            ),
            id=wid,
            task_queue=settings.task_queue,
            result_type=CohortResult,
            id_reuse_policy=WorkflowIDReusePolicy.ALLOW_DUPLICATE_FAILED_ONLY,
            id_conflict_policy=WorkflowIDConflictPolicy.FAIL,
        )
    except WorkflowAlreadyStartedError:
        pending.unlink()
        raise CliError(
            f"experiment {spec.id!r} was already started (workflow {wid}); give the spec a "
            "new id to run it again"
        ) from None
    except BaseException:
        pending.unlink()
        raise
    run_id = handle.first_execution_run_id or handle.result_run_id or ""
    path_of_key = key_path(settings.home, wid, run_id)
    os.replace(pending, path_of_key)
    return wid, str(path_of_key)


async def approve(settings: Settings, experiment: str, approver: str) -> ApprovalAttempt:
    view = await status_of(settings, experiment)
    if view.status is not Status.running or view.stage is not Stage.awaiting_approval:
        raise CliError(
            f"experiment {experiment} is not awaiting approval (stage {view.stage.value}, "
            f"{view.status.value}); see `forklab cohort status {experiment}`"
        )
    assert view.fingerprint is not None
    gate = view.approval
    # a worker whose policy names approvers counts only their own keys (`forklab keys`)
    path = (
        personal_key_path(settings.home)
        if gate.approvers
        else key_path(settings.home, gate.workflow_id, gate.run_id)
    )
    try:
        key = read_private_key(path)
    except (KeyFileError, OSError):
        where = (
            "make one with `forklab keys` and have it registered with the worker"
            if gate.approvers
            else f"approve where it was started ({gate.key_location})"
        )
        raise CliError(f"no approver key for experiment {experiment} at {path}; {where}") from None
    payload = approval_payload(
        experiment_id=view.experiment_id,
        workflow_id=gate.workflow_id,
        run_id=gate.run_id,
        fingerprint=view.fingerprint,
        nonce=gate.nonce,
        approver=approver,
    )
    handle = await _handle(settings, experiment)
    attempt: ApprovalAttempt = await handle.execute_update(
        "approve",
        {
            "approver": approver,
            "fingerprint": view.fingerprint,
            "nonce": gate.nonce,
            "signature": sign(key, payload),
        },
        result_type=ApprovalAttempt,
    )
    return attempt


def stored_plan(settings: Settings, view: CohortStatusView) -> CohortPlan | str:
    """The plan the workflow names by digest, read from the artifact store; or, when this
    host cannot read it, a sentence saying so."""
    if view.plan_artifact is None:
        return "no plan yet"
    try:
        return CohortPlans(artifact_store(settings)).get(view.plan_artifact)
    except (ArtifactError, ValueError) as exc:
        return f"the plan's runs and exclusions cannot be read here: {exc}"


def render_status(view: CohortStatusView, plan: CohortPlan | str | None = None) -> str:
    """The status; with ``plan`` (``stored_plan``) also every exclusion and its reason,
    and each team's signed cuts for a cohort of teams."""
    lines = [
        f"experiment {view.experiment_id}: {view.status.value}, stage {view.stage.value}",
        f"  {view.message}",
    ]
    if view.error:
        lines.append(f"  error: {view.error}")
    if view.fingerprint:
        lines.append(f"  plan fingerprint: {view.fingerprint}")
        lines.append(
            f"  runs: {view.runs}; excluded: {view.excluded} (plan artifact {view.plan_artifact})"
        )
        if isinstance(plan, str):
            if view.excluded:
                lines.append(f"    {plan}")
        elif plan is not None:
            lines += [f"    excluded {e.workflow_id}: {e.reason}" for e in plan.excluded]
            for r in plan.runs:
                if r.team is not None:
                    lines += [f"    {line}" for line in r.team.lines(r.workflow_id)]
        if view.code_digest:
            lines.append(
                f"  your scorer and feature functions (code digest, signed): {view.code_digest}"
            )
        lines.append("  tools (the approver signs these policies):")
        lines += [f"    {tool}: {policy}" for tool, policy in sorted(view.tools.items())]
        lines.append(
            f"  forks: {view.forks_done}/{view.forks_total} done, {view.running} running, "
            f"{view.forks_missing} without an outcome; {view.tokens} tokens"
        )
    lines += design_lines(view)
    return "\n".join(lines)


def design_lines(view: CohortStatusView) -> list[str]:
    """A sequential design as the approver signs it (waves, boundaries, the share of the
    forks it is expected to leave unspent) and its looks so far."""
    if view.design is None:
        return []
    lines = [f"  {line}" for line in design_text(view.design)]
    for look in view.looks:
        lines += [
            f"  look {look.look}: {w.world} {w.rescue} rescued / {w.harm} harmed over "
            f"{w.episodes} runs, statistic {w.statistic:+.3f} vs ±{w.boundary:.3f}: "
            f"{w.decision.value}"
            for w in look.worlds
        ]
    if view.looks or view.forks_unspent:
        lines.append(f"  forks unspent (worlds the design stopped): {view.forks_unspent}")
    return lines


def _cmd_start(args: argparse.Namespace) -> int:
    settings = settings_from(args)
    wid, key = run(lambda: start(settings, args.spec))
    print(f"started cohort experiment (workflow {wid})")
    print(f"approver key (private, readable only by you): {key}")
    print(f"next: forklab cohort status {wid.removeprefix('forklab-')}")
    return 0


def _cmd_status(args: argparse.Namespace) -> int:
    settings = settings_from(args)
    view = run(lambda: status_of(settings, args.experiment))
    if args.json:
        print(view.model_dump_json(indent=2))
    else:
        print(render_status(view, stored_plan(settings, view) if view.plan_artifact else None))
    return 0


def _cmd_approve(args: argparse.Namespace) -> int:
    attempt = run(lambda: approve(settings_from(args), args.experiment, args.approver))
    print(f"{'approved' if attempt.accepted else 'refused'}: {attempt.reason}")
    return 0 if attempt.accepted else 1


async def _result(settings: Settings, experiment: str) -> CohortResult:
    handle = await _handle(settings, experiment)
    try:
        return await handle.result()
    except WorkflowFailureError as exc:
        raise CliError(f"experiment {experiment} failed: {exc.cause or exc}") from None


def _cmd_report(args: argparse.Namespace) -> int:
    settings = settings_from(args)
    result = run(lambda: _result(settings, args.experiment))
    if args.json:
        print(result.model_dump_json(indent=2))
        return 0
    if result.report is None:
        print(f"experiment {args.experiment}: {result.status.value}; no report ({result.error})")
        return 1
    print(report_markdown(settings, args.experiment, result.report))
    print(f"report: {result.report.report_dir}/report.md")
    return 0


def report_markdown(settings: Settings, experiment: str, report: CohortReport) -> str:
    """The report's Markdown, read from the artifact store its analysis wrote it to (a
    report recorded before the Markdown moved there holds it itself)."""
    if report.markdown is not None:
        return report.markdown
    assert report.markdown_artifact is not None  # the report's own check: one of the two
    try:
        return artifact_store(settings).get_bytes(report.markdown_artifact).decode()
    except ArtifactError as exc:
        raise CliError(
            f"experiment {experiment}'s report cannot be read from this host's artifact "
            f"store ({exc}); point FORKLAB_ARTIFACTS at the store its worker writes to"
        ) from None


def _cmd_cancel(args: argparse.Namespace) -> int:
    async def go() -> None:
        await (await _handle(settings_from(args), args.experiment)).cancel()

    run(go)
    print(f"cancelling {args.experiment}: its forks are cancelled and cleaned up")
    return 0


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("cohort", help="experiments over a cohort of recorded agent runs")
    cmds = p.add_subparsers(dest="cohort_command", required=True)
    c = cmds.add_parser("start", help="start the experiment of a cohort spec")
    c.add_argument("spec")
    add_connection_flags(c)
    c.set_defaults(func=_cmd_start)
    for name, func, text in (
        ("status", _cmd_status, "stage, plan fingerprint, runs, tools, progress"),
        ("approve", _cmd_approve, "sign the plan the experiment shows"),
        ("report", _cmd_report, "wait for the end and print the report"),
        ("cancel", _cmd_cancel, "cancel: every fork still running is cancelled"),
    ):
        c = cmds.add_parser(name, help=text)
        c.add_argument("experiment", help="the spec id")
        if name in ("status", "report"):
            c.add_argument("--json", action="store_true", help="machine-readable")
        if name == "approve":
            c.add_argument("--approver", default=getpass.getuser(), help="your name")
        add_connection_flags(c)
        c.set_defaults(func=func)


__all__ = ["approve", "register", "render_status", "start", "start_spec", "status_of"]
