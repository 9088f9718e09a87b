"""The approval gate's rules and the inbox, without a server: signatures, nonces, the
bounded attempt log, and payloads of every shape."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from forklab.activities.experiment.approval_keys import new_private_key, public_key_hex
from forklab.contracts.approval import approval_payload, sign
from forklab.workflows.experiment import inbox
from forklab.workflows.experiment.approval_gate import ApprovalGate, Moment
from forklab.workflows.experiment.messages import (
    MAX_ATTEMPTS,
    MAX_NAME,
    ApprovalStatus,
    ApproveRequest,
    RejectRequest,
    Stage,
    Status,
)

T0 = datetime(2026, 1, 1, tzinfo=UTC)
PLAN = "a" * 64
EXP, WID, RUN = "toy", "forklab-toy", "run-1"


def at(
    minutes: float = 0.0,
    status: Status = Status.running,
    stage: Stage = Stage.awaiting_approval,
    nonce: str = "n2",
) -> Moment:
    return Moment(
        now=T0 + timedelta(minutes=minutes),
        status=status,
        stage=stage,
        fingerprint=PLAN,
        experiment_id=EXP,
        fresh_nonce=nonce,
    )


def gate(key: Ed25519PrivateKey) -> ApprovalGate:
    g = ApprovalGate.opening(
        workflow_id=WID, run_id=RUN, public_key=public_key_hex(key), key_location="h:/k", nonce="n1"
    )
    g.state.expires_at = T0 + timedelta(minutes=30)
    return g


def request(
    key: Ed25519PrivateKey,
    who: str = "ann",
    nonce: str = "n1",
    fingerprint: str = PLAN,
    run_id: str = RUN,
) -> ApproveRequest:
    payload = approval_payload(
        experiment_id=EXP,
        workflow_id=WID,
        run_id=run_id,
        fingerprint=fingerprint,
        nonce=nonce,
        approver=who,
    )
    return ApproveRequest(
        approver=who, fingerprint=fingerprint, nonce=nonce, signature=sign(key, payload)
    )


def test_only_the_run_keys_signature_over_this_plan_and_nonce_approves_once() -> None:
    key = new_private_key()
    g = gate(key)
    refusals = [
        g.approve(request(new_private_key()), at()),  # another key
        g.approve(request(key, run_id="run-0"), at()),  # signed for another run
        g.approve(request(key).model_copy(update={"approver": "eve"}), at()),  # renamed
        g.approve(request(key, fingerprint="b" * 64), at()),  # another plan
        g.approve(request(key, nonce="n0"), at()),  # an old nonce
        g.approve(request(key), at(stage=Stage.rehearsing)),  # too early
    ]
    assert [a.reason.split(":")[0].split(" (")[0] for a in refusals] == [
        "bad signature",
        "bad signature",
        "bad signature",
        "wrong plan fingerprint bbbbbbbbbbbbbbbb",
        "stale nonce",
        "the plan is not ready yet",
    ]
    assert not any(a.accepted for a in refusals) and g.pending and g.state.nonce == "n1"
    ok = g.approve(request(key), at(1))
    assert ok.accepted and g.state.status is ApprovalStatus.approved
    assert g.state.nonce == "n2"  # the nonce is used up
    again = g.approve(request(key), at(2))
    assert not again.accepted and again.reason.startswith("already approved")
    assert g.state.decided_by == "ann" and g.state.attempts_total == 8


def test_a_valid_signature_refused_after_expiry_uses_up_its_nonce() -> None:
    key = new_private_key()
    g = gate(key)
    late = g.approve(request(key), at(31))
    assert late.reason.startswith("the approval window has expired")
    assert g.state.nonce == "n2" and g.pending  # the signature can never count later
    assert g.approve(request(key), at(1)).reason.startswith("stale nonce")


def test_reject_decides_once_and_later_attempts_change_nothing() -> None:
    key = new_private_key()
    g = gate(key)
    first = g.reject(RejectRequest(by="carol", reason="not today"), at())
    assert first.reason == "rejected: not today" and g.state.status is ApprovalStatus.rejected
    late = g.approve(request(key, "dave"), at())
    assert late.reason.startswith("the experiment was rejected")
    again = g.reject(RejectRequest(by="erin"), at())
    assert again.reason == "reject ignored: approval is already rejected"
    assert g.state.decided_by == "carol"


def test_the_log_keeps_the_latest_attempts_truncated_and_counts_them_all() -> None:
    g = gate(new_private_key())
    for i in range(MAX_ATTEMPTS + 25):
        g.refuse("approve", f"{i}-" + "x" * 5000, "r" * 10_000 + "\n" * 10, at())
    state = g.state
    assert len(state.attempts) == MAX_ATTEMPTS and state.attempts_total == MAX_ATTEMPTS + 25
    assert state.attempts[0].approver.startswith("25-")
    assert all(len(a.approver) <= MAX_NAME and len(a.reason) <= 500 for a in state.attempts)
    assert all("\n" not in a.reason for a in state.attempts)
    assert len(state.model_dump_json()) < 64 * 1024


def _json(value: object) -> inbox.Payload:
    return inbox.Payload(encoding=b"json/plain", data=json.dumps(value).encode())


def test_the_inbox_refuses_every_malformed_payload_and_records_it() -> None:
    key = new_private_key()
    g = gate(key)
    good = request(key).model_dump()
    cases = {
        "no argument": [],
        "two arguments": [_json(good), _json(good)],
        "binary": [inbox.Payload(encoding=b"binary/plain", data=b"\x00\xff" * 100)],
        "no encoding": [inbox.Payload(encoding=b"", data=b"{}")],
        "not JSON": [inbox.Payload(encoding=b"json/plain", data=b"{not json")],
        "deep JSON": [inbox.Payload(encoding=b"json/plain", data=b"[" * 8000 + b"]" * 8000)],
        "huge number": [inbox.Payload(encoding=b"json/plain", data=b"9" * 9000)],
        "a list": [_json([1, 2])],
        "wrong schema": [_json({"token": "t", "approver": "m"})],
        "extra field": [_json({**good, "extra": 1})],
        "long name": [_json({**good, "approver": "n" * (MAX_NAME + 1)})],
        "megabytes": [_json({**good, "approver": "x" * 1_500_000})],
    }
    reasons = {}
    for case, args in cases.items():
        attempt = inbox.deliver(g, "approve", args, at())
        assert not attempt.accepted, case
        reasons[case] = attempt.reason
    assert reasons["no argument"].endswith("got 0 arguments")
    assert reasons["two arguments"].endswith("got 2 arguments")
    assert reasons["binary"] == "refused: payload encoding binary/plain is not json/plain"
    assert reasons["not JSON"] == reasons["deep JSON"] == "refused: payload is not valid JSON"
    assert reasons["a list"] == "refused: payload is a JSON list, not an object"
    assert reasons["wrong schema"].startswith("refused: field ")
    assert reasons["long name"].startswith("refused: field approver: String should have at most")
    assert reasons["megabytes"].startswith("refused: payload of 1500")
    recorded = [a for a in g.state.attempts if a.approver.startswith("n")]
    assert recorded and len(recorded[0].approver) == MAX_NAME  # the claimed name, truncated
    unknown = inbox.deliver(g, "frobnicate", [_json({})], at())
    assert unknown.kind == "frobnicate" and "unknown update" in unknown.reason
    stray = inbox.refuse_signal(g, "approve", at())
    assert "signals are not accepted" in stray.reason
    assert g.pending and g.state.attempts_total == len(cases) + 2
    assert inbox.deliver(g, "approve", [_json(good)], at()).accepted
