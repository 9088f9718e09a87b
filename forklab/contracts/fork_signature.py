"""The fork marker contract: the exact bytes a fork's issuer signs, and their check.

A worker serves a run its parent's steps (and gives it the parent's lineage root, whose
effects the ledger then replays to it) only on the word of its ``forklab_fork`` memo.
Anyone who may start a workflow writes that memo, so the word must be signed: ``forklab
fork`` signs every marker with its issuer key (Ed25519), binding the parent run, the
boundary, the lineage, the policies and intervention, the fork's own workflow id and the
sha256 of its start input, and the digest of the prefix page passed in its start when one
is (``prefix_page_sha256``). A worker verifies the signature against the keys it trusts
and the binding against what the server recorded for the run: a marker made up, signed
by another key, copied to another workflow id, started with another input, altered, or
replayed long after it was issued is refused. Pure and free of I/O; keys are stored in
``forklab.activities.runfork.fork_keys`` and the worker's trust in
``forklab.workers.runfork.fork_issuers``.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from datetime import datetime, timedelta

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from forklab.contracts.approval import sign, verify
from forklab.contracts.runfork import ForkMarker

#: What a fork signature commits to (never an approval or a start request).
PURPOSE = "forklab-fork-v1"
#: A fork starts right after its marker is signed; a marker used later is a replay (of a
#: real marker, onto the same workflow id after the fork closed).
MAX_MARKER_AGE = timedelta(minutes=15)
#: How far the signer's clock may run ahead of the server's.
CLOCK_SKEW = timedelta(minutes=5)
#: Fields the issuer does not sign: the signature itself, and what the fork interceptor
#: sets on the fork's later runs and children (the server vouches for those: a run that
#: continued-as-new, a child of a run).
_UNSIGNED = {"signature", "continued", "child_of"}
#: Signed fields left out of the signed bytes while unset: a marker that passes no prefix
#: page signs the bytes it signed before the field existed (an older issuer's marker
#: verifies on a newer worker), and one that does cannot lose the field unnoticed.
_SIGNED_WHEN_SET = {"prefix_page_sha256"}
#: The same, in the team part: a member's marker from before releases carried a token.
_TEAM_SIGNED_WHEN_SET = {"release_sha256"}
_SHOWN = 80


def marker_payload(marker: ForkMarker) -> bytes:
    """The exact bytes an issuer signs: canonical JSON of the marker's signed fields."""
    body = marker.model_dump(mode="json", exclude=_UNSIGNED)
    for name in _SIGNED_WHEN_SET:
        if body.get(name) is None:
            del body[name]
    team = body.get("team")
    if isinstance(team, dict):
        for name in _TEAM_SIGNED_WHEN_SET:
            if team.get(name) is None:
                del team[name]
    body["purpose"] = PURPOSE
    return json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()


def prefix_page_sha256(marker: ForkMarker, page: bytes) -> str:
    """The digest a marker signs for the prefix page passed in its fork's start: the page's
    bytes bound to the prefix the marker names (parent, run, base and boundary, overridden result),
    so a page cut for another run or boundary never matches, whatever it holds."""
    names = [
        marker.parent_workflow_id,
        marker.source_run_id,
        marker.base_step,
        marker.at_step,
        marker.result_override.result_sha256 if marker.result_override else None,
    ]
    h = hashlib.sha256(json.dumps(names, sort_keys=True, separators=(",", ":")).encode())
    h.update(b"\n")
    h.update(page)
    return h.hexdigest()


def issuer_public_key(key: Ed25519PrivateKey) -> str:
    raw = key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return raw.hex()


def sign_marker(marker: ForkMarker, key: Ed25519PrivateKey) -> ForkMarker:
    """``marker`` with its issuer key and signature."""
    unsigned = marker.model_copy(update={"issuer_key": issuer_public_key(key), "signature": None})
    return unsigned.model_copy(update={"signature": sign(key, marker_payload(unsigned))})


def _shown(text: str) -> str:
    return repr(text if len(text) <= _SHOWN else text[:_SHOWN] + "…")


def marker_refusal(
    marker: ForkMarker,
    *,
    trusted: Mapping[str, str],
    workflow_id: str,
    start_input_sha256: str,
    started_at: datetime,
) -> str | None:
    """None when ``marker`` was issued by a key in ``trusted`` (public key hex → name) for
    this run (``workflow_id``, its recorded start input's sha256, its start time); else
    the one sentence saying why it is refused."""
    if marker.signature is None or marker.issuer_key is None:
        return "the fork marker is not signed; start forks with `forklab fork`"
    if marker.issuer_key not in trusted:
        return (
            f"the fork marker is signed by key {_shown(marker.issuer_key)}, which this worker "
            "does not trust (register the issuer's key in FORKLAB_FORK_ISSUERS)"
        )
    if not verify(marker.issuer_key, marker_payload(marker), marker.signature):
        return (
            "the fork marker's signature does not verify (the marker, or the prefix page "
            "passed with it, was altered or made up)"
        )
    if marker.fork_workflow_id != workflow_id:
        return (
            f"the fork marker was issued for workflow {_shown(marker.fork_workflow_id or '')}, "
            f"not {_shown(workflow_id)} (a marker copied from another run)"
        )
    if marker.start_input_sha256 != start_input_sha256:
        return (
            "this run's start input is not the one the fork marker was issued for "
            f"(sha256 {start_input_sha256[:12]}…, marker {(marker.start_input_sha256 or '')[:12]}…)"
        )
    issued = marker.issued_at
    if issued is None or issued.tzinfo is None:
        return "the fork marker carries no issue time"
    if started_at - issued > MAX_MARKER_AGE or issued - started_at > CLOCK_SKEW:
        return (
            f"the fork marker was issued at {issued.isoformat()}, not within "
            f"{int(MAX_MARKER_AGE.total_seconds() // 60)} minutes before this run started "
            f"({started_at.isoformat()}): a marker used again later"
        )
    return None
