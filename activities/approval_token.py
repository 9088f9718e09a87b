"""One-time approval tokens: 256 random bits, kept where only their owner can read them.

The plaintext never enters workflow state: whoever starts an experiment (the CLI, or the
``issue_approval_token`` activity on a worker) writes it to an owner-only file and hands
the workflow its sha256. The plaintext reaches history once, in the approval that uses it.
"""

from __future__ import annotations

import hashlib
import os
import secrets
from pathlib import Path

TOKEN_BYTES = 32  # 256 bits


def new_token() -> str:
    return secrets.token_hex(TOKEN_BYTES)


def token_sha256(token: str) -> str:
    return hashlib.sha256(token.strip().encode()).hexdigest()


def token_path(home: Path, experiment_id: str) -> Path:
    return home / "tokens" / f"{experiment_id}.token"


def write_token_file(home: Path, experiment_id: str, token: str) -> Path:
    """Write ``token`` to an owner-only (0600) file, atomically; returns its path."""
    path = token_path(home, experiment_id)
    path.parent.mkdir(parents=True, exist_ok=True)
    os.chmod(path.parent, 0o700)
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, (token + "\n").encode())
    finally:
        os.close(fd)
    os.replace(tmp, path)
    return path
