"""Approval activities: the worker's side of the approval gate.

``issue_approval_key`` serves workflows started without an approver key (e.g. by
``temporal workflow start``): it makes the key pair on this worker's host, keeps the
private key owner-only under ``<home>/approval-keys/<workflow id>/<run id>.key`` and returns
only the public key. Workload code never sees that folder: it runs in sandboxes that do not
mount the ForkLab home. ``approval_policy`` tells the workflow whether this worker lets a
spec skip approval (default: never); the spec alone cannot switch the approver off.
``approver_policy`` tells it who may approve (``forklab.workers.experiment.approvers``
reads that policy when the worker starts).
"""

from __future__ import annotations

import socket
from pathlib import Path

from temporalio import activity

from forklab.activities.experiment.approval_keys import (
    ALLOW_UNAPPROVED,
    KeyFileError,
    key_path,
    new_private_key,
    public_key_hex,
    read_private_key,
    write_private_key,
)
from forklab.contracts.experiment import (
    ApprovalPolicy,
    ApproverPolicy,
    KeyInput,
    KeyIssued,
    PolicyInput,
)
from forklab.contracts.experiment_activities import (
    APPROVAL_POLICY,
    APPROVER_POLICY,
    ISSUE_APPROVAL_KEY,
)


class ApprovalActivities:
    def __init__(
        self, home: Path, allow_unapproved: bool, approvers: ApproverPolicy | None = None
    ) -> None:
        self._home = home
        self._allow_unapproved = allow_unapproved
        self._approvers = approvers or ApproverPolicy()

    @activity.defn(name=APPROVER_POLICY.name)
    async def approver_policy(self, inp: PolicyInput) -> ApproverPolicy:
        """Who may approve experiment ``inp.experiment_id`` on this worker."""
        return self._approvers

    @activity.defn(name=ISSUE_APPROVAL_KEY.name)
    async def issue_approval_key(self, inp: KeyInput) -> KeyIssued:
        """Idempotent: a retry finds the key the first attempt wrote and returns it."""
        path = key_path(self._home, inp.workflow_id, inp.run_id)
        try:
            key = read_private_key(path) if path.is_file() else None
        except KeyFileError:
            key = None  # a torn write of an earlier attempt: nobody has used it
        if key is None:
            key = new_private_key()
            write_private_key(path, key)
        return KeyIssued(
            public_key=public_key_hex(key), location=f"{socket.gethostname()}:{path.parent}"
        )

    @activity.defn(name=APPROVAL_POLICY.name)
    async def approval_policy(self, inp: PolicyInput) -> ApprovalPolicy:
        """Whether experiment ``inp.experiment_id``, whose spec asks to skip approval, may."""
        if self._allow_unapproved:
            return ApprovalPolicy(
                skip_allowed=True,
                reason=f"skipped: the spec asks and this worker allows it ({ALLOW_UNAPPROVED}=1)",
            )
        return ApprovalPolicy(
            skip_allowed=False,
            reason=(
                "required: the spec asks to skip approval, but this worker's policy requires "
                f"it ({ALLOW_UNAPPROVED} is not set)"
            ),
        )
