"""The approval contract: the exact bytes an approver signs, and their verification.

The CLI (or any signer) signs ``approval_payload`` with the approver's Ed25519 key; the
workflow verifies it against the public key it holds. Deterministic and free of I/O, so
the workflow can call ``verify``; keys are made and stored in
``forklab.activities.experiment.approval_keys``.
"""

from __future__ import annotations

import json

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import (
    Ed25519PrivateKey,
    Ed25519PublicKey,
)

#: What a signature commits to; a signature for anything else (e.g. a reject) never verifies.
PURPOSE = "forklab-approve-v1"


def approval_payload(
    *,
    experiment_id: str,
    workflow_id: str,
    run_id: str,
    fingerprint: str,
    nonce: str,
    approver: str,
) -> bytes:
    """The exact bytes an approver signs: canonical JSON, so CLI and workflow agree."""
    body = {
        "purpose": PURPOSE,
        "experiment_id": experiment_id,
        "workflow_id": workflow_id,
        "run_id": run_id,
        "fingerprint": fingerprint,
        "nonce": nonce,
        "approver": approver,
    }
    return json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()


def sign(key: Ed25519PrivateKey, payload: bytes) -> str:
    return key.sign(payload).hex()


def verify(public_key: str, payload: bytes, signature: str) -> bool:
    """Whether ``signature`` (hex) is ``public_key``'s (hex) signature of ``payload``.
    Malformed keys or signatures are simply not valid."""
    try:
        key = Ed25519PublicKey.from_public_bytes(bytes.fromhex(public_key))
        key.verify(bytes.fromhex(signature), payload)
    except (ValueError, InvalidSignature):
        return False
    return True


#: What a requester's signature over a start commits to (never an approval: the purposes differ).
REQUEST_PURPOSE = "forklab-request-v1"


def request_payload(
    *, workflow_id: str, experiment_id: str, requested_by: str, requested_at: str
) -> bytes:
    """The exact bytes a requester signs when starting an experiment: who asks for which
    workflow, when (ISO 8601). A worker whose policy keeps requesters from approving their
    own plans reads the requester's identity from this signature, not from a name anyone
    could type."""
    body = {
        "purpose": REQUEST_PURPOSE,
        "workflow_id": workflow_id,
        "experiment_id": experiment_id,
        "requested_by": requested_by,
        "requested_at": requested_at,
    }
    return json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()
