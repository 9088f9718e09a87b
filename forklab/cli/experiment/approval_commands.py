"""``forklab approve``, ``reject`` and ``sign``: decisions sent as Updates.

An Update returns the attempt the workflow recorded for *this* request, so the CLI prints
exactly that (no polling a query, no reading someone else's attempt). ``approve`` signs
the gate's current challenge (experiment, workflow id and first run, plan fingerprint,
nonce, approver) with the run's private key, kept owner-only under
``<home>/approval-keys/<workflow id>/<run id>.key`` by ``forklab start`` (or by the worker
that made it); when the worker's policy names approvers, with your own key from
``forklab keys`` (``<home>/approver/approver.key``) instead. ``sign`` prints the same
request as JSON for ``temporal workflow update execute --name approve --input …``.
"""

from __future__ import annotations

import argparse
import getpass
from pathlib import Path

from temporalio.client import WorkflowUpdateFailedError
from temporalio.service import RPCError

from forklab.activities.experiment.approval_keys import (
    KeyFileError,
    key_path,
    personal_key_path,
    read_private_key,
)
from forklab.cli.errors import CliError
from forklab.cli.ops_common import (
    add_connection_flags,
    experiment_handle,
    query_status,
    run,
    settings_from,
)
from forklab.contracts.approval import approval_payload, sign
from forklab.workers.config import Settings
from forklab.workflows.experiment.messages import (
    MAX_NAME,
    MAX_REASON,
    ApprovalAttempt,
    ApproveRequest,
    RejectRequest,
    Status,
    StatusView,
)


def signed_request(
    settings: Settings,
    view: StatusView,
    approver: str,
    fingerprint: str | None,
    key_file: Path | None,
) -> ApproveRequest:
    """An approve request for ``view``'s current challenge, signed with the run's key."""
    if view.status is not Status.running:
        raise CliError(
            f"experiment {view.experiment_id} has ended ({view.status.value}"
            f"{': ' + view.error if view.error else ''}); it takes no more approvals"
        )
    if fingerprint is None:
        if view.plan is None:
            raise CliError(
                f"experiment {view.experiment_id} has no plan yet (stage {view.stage.value}); "
                "wait for stage awaiting_approval (`forklab status`)"
            )
        fingerprint = view.plan.fingerprint
    gate = view.approval
    run_key = key_path(settings.home, gate.workflow_id, gate.run_id)
    own_key = personal_key_path(settings.home)
    if key_file is not None:
        path = key_file
    elif gate.approvers:  # the worker's policy names approvers: only your own key counts
        path = own_key
        if not path.is_file():
            raise CliError(
                f"experiment {view.experiment_id}'s worker names who approves, and you have "
                f"no approver key at {path}: make one with `forklab keys` and have its line "
                "registered in the worker's FORKLAB_APPROVERS_FILE"
            )
    else:
        path = run_key if run_key.is_file() or not own_key.is_file() else own_key
    if not path.is_file():
        raise CliError(
            f"no approver key for experiment {view.experiment_id} (run {gate.run_id}) at "
            f"{path}; the key is where the run was started ({gate.key_location}): approve "
            "there, or pass --key FILE"
        )
    try:
        key = read_private_key(path)
    except KeyFileError as exc:
        raise CliError(str(exc)) from None
    payload = approval_payload(
        experiment_id=view.experiment_id,
        workflow_id=gate.workflow_id,
        run_id=gate.run_id,
        fingerprint=fingerprint,
        nonce=gate.nonce,
        approver=approver,
    )
    return ApproveRequest(
        approver=approver, fingerprint=fingerprint, nonce=gate.nonce, signature=sign(key, payload)
    )


async def send(settings: Settings, experiment: str, name: str, request: object) -> ApprovalAttempt:
    """Send the ``name`` Update; returns the attempt the workflow recorded for it."""
    handle = await experiment_handle(settings, experiment)
    try:
        attempt: ApprovalAttempt = await handle.execute_update(
            name, request, result_type=ApprovalAttempt
        )
        return attempt
    except (RPCError, WorkflowUpdateFailedError) as exc:
        message = exc.message if isinstance(exc, RPCError) else str(exc.cause or exc)
        raise CliError(f"experiment {experiment} did not take the {name} ({message})") from None


async def approve(
    settings: Settings,
    experiment: str,
    approver: str,
    fingerprint: str | None = None,
    key_file: Path | None = None,
) -> ApprovalAttempt:
    view = await query_status(settings, await experiment_handle(settings, experiment))
    request = signed_request(settings, view, approver, fingerprint, key_file)
    return await send(settings, experiment, "approve", request)


def _check_name(value: str, flag: str) -> str:
    if not value.strip():
        raise CliError(f"{flag} is empty; say who you are", 2)
    if len(value) > MAX_NAME:
        raise CliError(f"{flag} has {len(value)} characters; at most {MAX_NAME}", 2)
    return value


def cmd_approve(args: argparse.Namespace) -> int:
    settings = settings_from(args)
    approver = _check_name(args.approver, "--approver")
    attempt = run(lambda: approve(settings, args.experiment, approver, args.fingerprint, args.key))
    if not attempt.accepted:
        raise CliError(f"approval of {args.experiment} was not accepted: {attempt.reason}")
    if args.json:
        print(attempt.model_dump_json(indent=2))
    else:
        print(
            f"approved: experiment {args.experiment} by {attempt.approver} at {attempt.at:%H:%M:%S}"
        )
    return 0


def cmd_reject(args: argparse.Namespace) -> int:
    settings = settings_from(args)
    if len(args.reason) > MAX_REASON:
        raise CliError(f"--reason has {len(args.reason)} characters; at most {MAX_REASON}", 2)
    request = RejectRequest(by=_check_name(args.by, "--by"), reason=args.reason)
    attempt = run(lambda: send(settings, args.experiment, "reject", request))
    if attempt.reason.startswith("reject ignored"):
        raise CliError(f"rejection of {args.experiment} did not count: {attempt.reason}")
    print(f"{attempt.reason}: experiment {args.experiment} by {attempt.approver}; it ends now")
    return 0


def cmd_sign(args: argparse.Namespace) -> int:
    settings = settings_from(args)
    approver = _check_name(args.approver, "--approver")

    async def go() -> ApproveRequest:
        view = await query_status(settings, await experiment_handle(settings, args.experiment))
        return signed_request(settings, view, approver, args.fingerprint, args.key)

    print(run(go).model_dump_json())
    return 0


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    for name, helptext, func in (
        (
            "approve",
            "approve an experiment's plan, signed with the run's approver key",
            cmd_approve,
        ),
        (
            "sign",
            "print a signed approve request (JSON) for `temporal workflow update execute`",
            cmd_sign,
        ),
    ):
        p = sub.add_parser(name, help=helptext)
        p.add_argument("experiment", help="experiment id")
        p.add_argument("--approver", default=getpass.getuser(), help="who approves (default: you)")
        p.add_argument(
            "--fingerprint", help="the plan fingerprint you reviewed (default: the current plan's)"
        )
        p.add_argument(
            "--key",
            type=Path,
            default=None,
            help="the private key file (default: <home>/approval-keys/<workflow id>/<run>.key)",
        )
        if name == "approve":
            p.add_argument("--json", action="store_true", help="print the recorded attempt (JSON)")
        add_connection_flags(p)
        p.set_defaults(func=func)

    p = sub.add_parser("reject", help="reject an experiment's plan; it ends without compute")
    p.add_argument("experiment", help="experiment id")
    p.add_argument("--reason", default="", help="why (recorded)")
    p.add_argument("--by", default=getpass.getuser(), help="who rejects (default: you)")
    add_connection_flags(p)
    p.set_defaults(func=cmd_reject)
