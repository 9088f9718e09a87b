"""The requester's signature on a start: ``forklab start`` signs who asks for which
workflow, and when, with the key ``forklab keys`` made in the starter's own home (none: an
unsigned start, as before). A worker whose policy keeps requesters from approving their
own plans reads the requester from this signature and refuses an unsigned start."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

from forklab.activities.experiment.approval_keys import (
    KeyFileError,
    personal_key_path,
    public_key_hex,
    read_private_key,
)
from forklab.cli.errors import CliError
from forklab.contracts.approval import request_payload, sign
from forklab.workflows.experiment.messages import SignedRequest


def signed_start(
    home: Path, *, workflow_id: str, experiment_id: str, requested_by: str
) -> SignedRequest | None:
    path = personal_key_path(home)
    if not path.exists():
        return None
    try:
        key = read_private_key(path)
    except KeyFileError as exc:
        raise CliError(str(exc)) from None
    at = datetime.now(UTC)
    payload = request_payload(
        workflow_id=workflow_id,
        experiment_id=experiment_id,
        requested_by=requested_by,
        requested_at=at.isoformat(),
    )
    return SignedRequest(
        public_key=public_key_hex(key), requested_at=at, signature=sign(key, payload)
    )
