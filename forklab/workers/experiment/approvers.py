"""The worker's approver policy, read from the environment when the worker starts.

- ``FORKLAB_APPROVERS_FILE``: the registered approvers, one ``<name> <Ed25519 public key,
  hex>`` per line (what ``forklab keys`` prints); blank lines and ``#`` comments are
  skipped. Or ``FORKLAB_APPROVERS``: the same lines in the setting itself, separated by
  ``;`` (for deployments whose workers mount no file, like the compose one). Neither set:
  whoever holds a run's own key approves it (the single-user default).
- ``FORKLAB_REQUESTER_MAY_APPROVE``: ``1`` (default) or ``0``; ``0`` keeps whoever started
  an experiment from approving it, and needs the approvers file (without registered keys
  the requester holds the run's key). The shipped compose deployment sets ``0``.

A file that cannot be read or holds a line that is not an approver stops the worker with
one sentence naming the file and the line: a policy half read would approve the wrong
people.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from pydantic import ValidationError

from forklab.contracts.experiment import ApproverPolicy, RegisteredApprover
from forklab.workers.config import ConfigError

APPROVERS_FILE = "FORKLAB_APPROVERS_FILE"
APPROVERS = "FORKLAB_APPROVERS"
REQUESTER_MAY_APPROVE = "FORKLAB_REQUESTER_MAY_APPROVE"
#: The most an approvers file may hold (it is read whole).
MAX_FILE_BYTES = 256 * 1024


def read_approvers(
    path: Path, setting: str = APPROVERS_FILE, role: str = "approver"
) -> list[RegisteredApprover]:
    """The keys registered in the file ``path`` names (``setting``: the setting that named
    it, for the error; ``role``: what the keys are, e.g. fork issuers)."""
    try:
        with path.open("rb") as f:
            data = f.read(MAX_FILE_BYTES + 1)
    except OSError as exc:
        raise ConfigError(f"{setting}: cannot read {path} ({exc.strerror})") from None
    if len(data) > MAX_FILE_BYTES:
        raise ConfigError(f"{setting}: {path} is larger than {MAX_FILE_BYTES} bytes")
    try:
        text = data.decode()
    except UnicodeDecodeError:
        raise ConfigError(f"{setting}: {path} is not UTF-8 text") from None
    return parse_approvers(text.splitlines(), f"{setting} {path}", "line", role)


def parse_approvers(
    lines: list[str], source: str, unit: str, role: str = "approver"
) -> list[RegisteredApprover]:
    """The approvers (or other ``role``) of ``lines``; an error names ``source`` and the
    ``unit`` (line, entry)."""
    approvers: list[RegisteredApprover] = []
    for number, line in enumerate(lines, 1):
        words = line.split("#", 1)[0].split()
        if not words:
            continue
        try:
            if len(words) != 2:
                raise ValueError
            approver = RegisteredApprover(name=words[0], public_key=words[1])
        except (ValueError, ValidationError):
            raise ConfigError(
                f"{source}: {unit} {number} is not '<name> <public key>' (a name of letters, "
                "digits, _ . @ -, and the 64 hex digits forklab keys prints)"
            ) from None
        if any(a.name == approver.name or a.public_key == approver.public_key for a in approvers):
            raise ConfigError(f"{source}: {unit} {number} repeats a name or a key; one per {role}")
        approvers.append(approver)
    if not approvers:
        raise ConfigError(f"{source} names no {role}")
    return approvers


def approver_policy(env: Mapping[str, str] | None = None) -> ApproverPolicy:
    env = os.environ if env is None else env
    flag = env.get(REQUESTER_MAY_APPROVE, "1").strip()
    if flag not in ("0", "1"):
        raise ConfigError(f"{REQUESTER_MAY_APPROVE} is {flag!r}; use 1 or 0")
    file = env.get(APPROVERS_FILE, "").strip()
    inline = env.get(APPROVERS, "").strip()
    if file and inline:
        raise ConfigError(f"both {APPROVERS_FILE} and {APPROVERS} are set; keep one")
    if inline:
        if len(inline) > MAX_FILE_BYTES:
            raise ConfigError(f"{APPROVERS} is longer than {MAX_FILE_BYTES} characters")
        approvers = parse_approvers(inline.split(";"), APPROVERS, "entry")
    elif file:
        approvers = read_approvers(Path(file).expanduser())
    elif flag == "0":
        raise ConfigError(
            f"{REQUESTER_MAY_APPROVE}=0 needs {APPROVERS_FILE} or {APPROVERS}: without "
            "registered approvers, whoever starts a run holds its key"
        )
    else:
        return ApproverPolicy()
    return ApproverPolicy(approvers=approvers, requester_may_approve=flag == "1")
