"""The fork issuer key of a ForkLab home: what ``forklab fork`` signs fork markers with.

Like an experiment's approver key, it is an Ed25519 key pair kept in an owner-only file
(``<home>/fork-issuer/issuer.key``, its folder 0700, the file 0600), made the first time a fork
is issued from that home. A worker trusts the public half of its own home's key when its
policy registers no issuers (the single-user default: ``forklab up`` and ``forklab fork``
share the home); a deployment registers the keys of the hosts that issue forks instead
(``FORKLAB_FORK_ISSUERS``), and its workers then hold public keys only.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import os
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from forklab.activities.experiment.approval_keys import (
    KeyFileError,
    new_private_key,
    read_private_key,
)
from forklab.contracts.fork_signature import issuer_public_key


def issuer_key_path(home: Path) -> Path:
    return home / "fork-issuer" / "issuer.key"


def issuer_key(home: Path) -> Ed25519PrivateKey:
    """The home's issuer key, made when there is none. Two forks issued at once from a new
    home agree on one key: the file is put in place by a link, which never replaces one."""
    path = issuer_key_path(home)
    if not path.is_file():
        # only the key's own folder is made owner-only: the home stays as it is (boxes of
        # other uids may need to pass through it)
        path.parent.mkdir(parents=True, exist_ok=True)
        os.chmod(path.parent, 0o700)
        staged = path.with_name(f".issuer.key.new{os.getpid()}")
        pem = new_private_key().private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
        fd = os.open(staged, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.write(fd, pem)
        finally:
            os.close(fd)
        with contextlib.suppress(FileExistsError):
            os.link(staged, path)
        staged.unlink()
    return read_private_key(path)


def home_issuer(home: Path) -> dict[str, str]:
    """The public key of the home's issuer key (public key → name), or nothing when no fork
    was ever issued from this home or its key cannot be read."""
    path = issuer_key_path(home)
    if not path.is_file():
        return {}
    try:
        return {issuer_public_key(read_private_key(path)): f"the key in {path}"}
    except KeyFileError:
        return {}


def team_release_token(key: Ed25519PrivateKey, team_fork_id: str) -> str:
    """The token team fork ``team_fork_id``'s release carries: a keyed digest of its id
    under this home's issuer key. The worker that starts the members (or, after it died,
    the next one on this home) can compute it and release them; what is recorded (their
    markers' ``release_sha256``) does not give it away."""
    raw = key.private_bytes(
        serialization.Encoding.Raw,
        serialization.PrivateFormat.Raw,
        serialization.NoEncryption(),
    )
    message = b"forklab-team-release-token\n" + team_fork_id.encode()
    return hmac.new(raw, message, hashlib.sha256).hexdigest()
