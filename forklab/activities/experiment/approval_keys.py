"""Signed approvals: an Ed25519 key pair per workflow run; only the public key is public.

Whoever starts an experiment (``forklab start``, or the ``issue_approval_key`` activity on a
worker when the workflow was started without a key) makes a key pair, keeps the private key
in an owner-only file under ``<home>/approval-keys/<workflow id>/<run id>.key`` and hands the
workflow only the public key. An approval is a signature over ``approval_payload``: the
experiment, the workflow id and run, the plan fingerprint, the gate's current nonce and the
approver's name. Nothing Temporal records (input, history, memo, search attributes, the UI)
lets a reader approve: a signature found in history names one plan and one nonce, and the
gate uses each nonce once.

The payload and ``verify`` are the contract (``forklab.contracts.approval``; the workflow
calls ``verify``); the key files are written here and read by the CLI.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

#: The setting that lets a spec's ``approval.required: false`` skip approval on a worker
#: (``forklab.activities.experiment.approval``). Here rather than there so that
#: ``forklab.workers.config`` can name it without importing the activities and their models.
ALLOW_UNAPPROVED = "FORKLAB_ALLOW_UNAPPROVED"
_SAFE = re.compile(r"[^A-Za-z0-9_.-]")


class KeyFileError(ValueError):
    """A key file that cannot be read or written; the message names the path."""


def new_private_key() -> Ed25519PrivateKey:
    return Ed25519PrivateKey.generate()


def public_key_hex(key: Ed25519PrivateKey) -> str:
    raw = key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return raw.hex()


def key_path(home: Path, workflow_id: str, run_id: str) -> Path:
    """Where the private key of one workflow run lives: keyed by workflow id and run, so
    two runs (even of one spec id) never share or overwrite a key."""
    return home / "approval-keys" / _SAFE.sub("_", workflow_id) / f"{_SAFE.sub('_', run_id)}.key"


def personal_key_path(home: Path) -> Path:
    """Where ``forklab keys`` keeps a person's own key pair (as an approver registered in a
    worker's ``FORKLAB_APPROVERS_FILE``, and as a requester whose starts it signs)."""
    return home / "approver" / "approver.key"


def write_private_key(path: Path, key: Ed25519PrivateKey) -> Path:
    """Write ``key`` (PEM, unencrypted) to an owner-only (0600) file, atomically; the
    folders above it are made owner-only (0700)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    for folder in (path.parent, path.parent.parent):
        os.chmod(folder, 0o700)
    pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, pem)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    return path


def read_private_key(path: Path) -> Ed25519PrivateKey:
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise KeyFileError(f"cannot read the approver key {path} ({exc.strerror})") from None
    try:
        key = serialization.load_pem_private_key(data, password=None)
    except (ValueError, TypeError):
        raise KeyFileError(f"{path} is not a PEM private key") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise KeyFileError(f"{path} is not an Ed25519 private key")
    return key
