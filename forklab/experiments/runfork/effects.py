"""The rules of the effect ledger: request digests and what a claim meets.

A side-effecting call is identified by (lineage root, key name), not by the run that
makes it, so a fork meets the effects its ancestors already applied.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict


def request_sha256(params: Mapping[str, Any], volatile: Iterable[str] = ()) -> str:
    """sha256 over the canonical JSON of ``params`` minus the declared volatile fields
    (timestamps, nonces, attempt ids), so a retry is not a different request."""
    skip = set(volatile)
    kept = {k: v for k, v in params.items() if k not in skip}
    text = json.dumps(kept, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def downstream_key(root: str, ledger_key: str) -> str:
    """The ``Idempotency-Key`` a tool sends the service for ``ledger_key`` of lineage
    ``root``: one-to-one on the pair (a joined string is not: root ``a:charge`` with key
    ``x`` and root ``a`` with key ``charge:x`` would share one) and 72 characters
    whatever their length (services cap the header, e.g. at 255)."""
    pair = json.dumps([root, ledger_key], separators=(",", ":"))
    return "forklab-" + hashlib.sha256(pair.encode()).hexdigest()


class EntryState(StrEnum):
    claimed = "claimed"
    completed = "completed"


class LedgerEntry(BaseModel):
    model_config = ConfigDict(frozen=True)

    lineage_root: str
    key_name: str
    tool: str
    request_sha256: str
    state: EntryState
    claim_token: str
    epoch: int
    result: dict[str, Any] | None = None
    #: the activity execution holding the claim (workflow id / run id / activity id)
    holder: str = ""
    #: until when (the ledger's clock, seconds since the epoch) the holder's attempt may
    #: still be applying the effect: its timeout and a margin, from its claim
    lease_until: float = 0.0


class ClaimOutcome(StrEnum):
    #: nobody holds the key: the caller owns it and may apply the effect
    new = "new"
    #: the key completed before: return its recorded result, apply nothing
    replay = "replay"
    #: a previous attempt claimed it and recorded nothing (it died or is a zombie):
    #: the effect may or may not have been applied downstream
    ambiguous = "ambiguous"
    #: an attempt with a higher or equal epoch holds it: this caller is the zombie
    fenced = "fenced"
    #: another activity execution (the parent of a fork running beside it, a sibling
    #: fork) claimed it and its attempt may still be running: wait for its lease to end,
    #: then claim again (its completion then replays; its death makes this ambiguous)
    held = "held"
    #: same key, different request
    mismatch = "mismatch"


def on_claim(
    entry: LedgerEntry | None, request_sha: str, holder: str, epoch: int, now: float
) -> ClaimOutcome:
    """What a claim by activity execution ``holder`` at attempt ``epoch`` meets at ``now``
    (the ledger's clock).

    A later attempt of the holder itself takes an open claim over at once: Temporal
    starts it only once the earlier attempt failed or timed out. Another execution must
    not: the holder may be applying the effect right now, and taking over would make
    the holder's completion fail (``fenced``) or, without the service's status query,
    apply the effect twice. It waits until the holder's lease ends."""
    if entry is None:
        return ClaimOutcome.new
    if entry.request_sha256 != request_sha:
        return ClaimOutcome.mismatch
    if entry.state is EntryState.completed:
        return ClaimOutcome.replay
    if holder == entry.holder:
        return ClaimOutcome.fenced if epoch <= entry.epoch else ClaimOutcome.ambiguous
    if now < entry.lease_until:
        return ClaimOutcome.held
    return ClaimOutcome.ambiguous


def completion_accepted(entry: LedgerEntry | None, claim_token: str) -> bool:
    """A completion counts only from the holder of the current claim token."""
    return (
        entry is not None and entry.state is EntryState.claimed and entry.claim_token == claim_token
    )
