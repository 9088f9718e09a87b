"""Separation of duties (issue 35, point 6): a worker's policy names who approves (their
own registered keys) and whether the requester may approve their own plan.

The gate's rules without a server; the approvers file as the worker reads it; ``forklab
keys`` as a process; and one run on a real server and worker under the compose
deployment's policy (requesters may not approve), approved through ``forklab approve``'s
own code from the approver's own home."""

from __future__ import annotations

import json
import os
import stat
from concurrent.futures import Executor
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import yaml
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from helpers import CliResult, forklab_in_process
from orchestration_lab import Lab, lab_settings, make_spec, signed
from temporalio.client import WorkflowFailureError, WorkflowHandle
from temporalio.testing import WorkflowEnvironment

from forklab.activities.experiment.approval_keys import (
    new_private_key,
    personal_key_path,
    public_key_hex,
    read_private_key,
    write_private_key,
)
from forklab.cli.errors import CliError
from forklab.cli.experiment.approval_commands import approve
from forklab.cli.experiment.start_request import signed_start
from forklab.contracts.approval import approval_payload, request_payload, sign
from forklab.contracts.experiment import ApproverPolicy, RegisteredApprover
from forklab.workers.config import ConfigError
from forklab.workers.experiment.approvers import approver_policy, read_approvers
from forklab.workers.experiment.worker import build_worker
from forklab.workflows.experiment.approval_gate import ApprovalGate, Moment
from forklab.workflows.experiment.messages import (
    ApprovalStatus,
    ApproveRequest,
    ExperimentInput,
    ExperimentResult,
    RejectRequest,
    SignedRequest,
    Stage,
    Status,
    workflow_id,
)
from forklab.workflows.experiment.workflow import ExperimentWorkflow

ROOT = Path(__file__).resolve().parent.parent
T0 = datetime(2026, 1, 1, tzinfo=UTC)
PLAN = "a" * 64
EXP, WID, RUN = "toy", "forklab-toy", "run-1"
ALICE, BOB, MALLORY = new_private_key(), new_private_key(), new_private_key()
TEAM = [
    RegisteredApprover(name="alice", public_key=public_key_hex(ALICE)),
    RegisteredApprover(name="bob", public_key=public_key_hex(BOB)),
]


def at(nonce: str = "n2") -> Moment:
    return Moment(
        now=T0,
        status=Status.running,
        stage=Stage.awaiting_approval,
        fingerprint=PLAN,
        experiment_id=EXP,
        fresh_nonce=nonce,
    )


def start_request(key: Ed25519PrivateKey, by: str = "alice", when: datetime = T0) -> SignedRequest:
    payload = request_payload(
        workflow_id=WID, experiment_id=EXP, requested_by=by, requested_at=when.isoformat()
    )
    return SignedRequest(
        public_key=public_key_hex(key), requested_at=when, signature=sign(key, payload)
    )


def gate(
    request: SignedRequest | None, *, may_approve: bool, by: str = "alice"
) -> tuple[ApprovalGate, str | None]:
    """A gate opened with a run key (which the policy then overrides)."""
    g = ApprovalGate.opening(
        workflow_id=WID,
        run_id=RUN,
        public_key=public_key_hex(new_private_key()),
        key_location="h:/k",
        nonce="n1",
    )
    policy = ApproverPolicy(approvers=TEAM, requester_may_approve=may_approve)
    refusal = g.adopt(
        policy, request, experiment_id=EXP, requested_by=by, started_at=T0 + timedelta(seconds=5)
    )
    return g, refusal


def approval(key: Ed25519PrivateKey, who: str, nonce: str = "n1") -> ApproveRequest:
    payload = approval_payload(
        experiment_id=EXP,
        workflow_id=WID,
        run_id=RUN,
        fingerprint=PLAN,
        nonce=nonce,
        approver=who,
    )
    return ApproveRequest(approver=who, fingerprint=PLAN, nonce=nonce, signature=sign(key, payload))


def test_an_unregistered_name_or_key_is_refused_and_a_registered_approver_accepted() -> None:
    g, refusal = gate(start_request(ALICE), may_approve=False)
    assert refusal is None and g.state.requester == "alice"
    unregistered = g.approve(approval(MALLORY, "mallory"), at())
    assert unregistered.reason.startswith("mallory is not a registered approver")
    impostor = g.approve(approval(MALLORY, "bob"), at())  # bob's name, not bob's key
    assert impostor.reason == ("bad signature: it does not verify with the key registered for bob")
    assert g.pending and g.state.nonce == "n1"  # neither used the nonce up
    accepted = g.approve(approval(BOB, "bob"), at())
    assert accepted.accepted and g.state.decided_by == "bob"
    assert g.state.status is ApprovalStatus.approved


def test_the_runs_own_key_approves_nothing_when_the_policy_names_approvers() -> None:
    """The key ``forklab start`` made for the run (in the requester's home) is no approval."""
    run_key = new_private_key()
    g, _ = gate(None, may_approve=True)
    g.state.public_key = public_key_hex(run_key)
    refused = g.approve(approval(run_key, "alice"), at())
    assert refused.reason.startswith("bad signature") and g.pending


def test_the_requester_may_not_approve_their_own_plan_when_the_policy_says_so() -> None:
    g, _ = gate(start_request(ALICE), may_approve=False)
    own = g.approve(approval(ALICE, "alice"), at())
    assert not own.accepted and own.reason.startswith(
        "alice requested this experiment, and this worker's policy says the requester may not"
    )
    assert g.pending and g.state.nonce == "n2"  # a valid signature uses its nonce up
    assert g.approve(approval(BOB, "bob", nonce="n2"), at("n3")).accepted

    lenient, _ = gate(start_request(ALICE), may_approve=True)
    assert lenient.approve(approval(ALICE, "alice"), at()).accepted


@pytest.mark.parametrize(
    "request_",
    [
        None,  # unsigned: anyone could have typed the requester's name
        start_request(MALLORY),  # signed, by a key nobody registered
        start_request(ALICE, when=T0 - timedelta(hours=2)),  # an old signed start, replayed
        start_request(ALICE, by="bob"),  # signed for bob's name, started as alice's
    ],
    ids=["unsigned", "unregistered-key", "replayed", "other-name"],
)
def test_a_start_whose_requester_cannot_be_told_is_refused_under_the_strict_policy(
    request_: SignedRequest | None,
) -> None:
    """Otherwise a requester would start unsigned (or signed by a throwaway key) and then
    approve with their registered key."""
    g, refusal = gate(request_, may_approve=False)
    assert refusal is not None and refusal.startswith(
        "this worker's policy keeps requesters from approving their own plans"
    )
    assert g.state.requester == ""
    _, lenient = gate(request_, may_approve=True)
    assert lenient is None


def test_a_rejection_needs_no_key_and_is_recorded_with_who_sent_it() -> None:
    g, _ = gate(start_request(ALICE), may_approve=False)
    attempt = g.reject(RejectRequest(by="carol", reason="too costly"), at())
    assert attempt.kind == "reject" and attempt.approver == "carol"
    assert g.state.status is ApprovalStatus.rejected and g.state.decided_by == "carol"
    assert g.state.attempts[-1].approver == "carol"


def test_the_approvers_file_is_read_whole_or_refused(tmp_path: Path) -> None:
    good = tmp_path / "approvers"
    good.write_text(f"# the team\nalice {TEAM[0].public_key}\n\nbob {TEAM[1].public_key}  # ops\n")
    env = {"FORKLAB_APPROVERS_FILE": str(good), "FORKLAB_REQUESTER_MAY_APPROVE": "0"}
    assert approver_policy(env) == ApproverPolicy(approvers=TEAM, requester_may_approve=False)
    assert approver_policy({}) == ApproverPolicy()  # the single-user default
    for text, why in [
        (f"alice {TEAM[0].public_key[:-2]}\n", "line 1 is not"),
        (f"alice {TEAM[0].public_key} extra\n", "line 1 is not"),
        (f"al ice {TEAM[0].public_key}\n", "line 1 is not"),
        (f"alice {TEAM[0].public_key}\nalice {TEAM[1].public_key}\n", "line 2 repeats"),
        (f"alice {TEAM[0].public_key}\nbob {TEAM[0].public_key}\n", "repeats a name or a key"),
        ("# nobody\n", "names no approver"),
    ]:
        good.write_text(text)
        with pytest.raises(ConfigError, match=why):
            read_approvers(good)
    with pytest.raises(ConfigError, match="cannot read"):
        read_approvers(tmp_path / "missing")
    with pytest.raises(ConfigError, match="FORKLAB_REQUESTER_MAY_APPROVE=0 needs"):
        approver_policy({"FORKLAB_REQUESTER_MAY_APPROVE": "0"})
    with pytest.raises(ConfigError, match="use 1 or 0"):
        approver_policy({"FORKLAB_REQUESTER_MAY_APPROVE": "no"})
    inline = f"alice {TEAM[0].public_key}; bob {TEAM[1].public_key}"
    assert approver_policy({"FORKLAB_APPROVERS": inline}).approvers == TEAM
    with pytest.raises(ConfigError, match="FORKLAB_APPROVERS: entry 2 is not"):
        approver_policy({"FORKLAB_APPROVERS": "alice " + TEAM[0].public_key + "; bob"})
    with pytest.raises(ConfigError, match="keep one"):
        approver_policy({"FORKLAB_APPROVERS": inline, "FORKLAB_APPROVERS_FILE": str(good)})


def test_the_compose_deployment_keeps_requesters_from_approving_their_own_plans() -> None:
    """Its workers mount no file, so the approvers are a setting; the example's placeholder
    stops a worker with a sentence until real keys replace it."""
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    env = compose["x-forklab-env"]
    assert env["FORKLAB_REQUESTER_MAY_APPROVE"] == "0"
    assert env["FORKLAB_APPROVERS"].startswith("${FORKLAB_APPROVERS:?")
    example = dict(
        line.split("=", 1)
        for line in (ROOT / "deploy" / "example.env").read_text().splitlines()
        if line and not line.startswith("#")
    )
    policy_env = {**env, "FORKLAB_APPROVERS": example["FORKLAB_APPROVERS"]}
    with pytest.raises(ConfigError, match="FORKLAB_APPROVERS: entry 1 is not"):
        approver_policy(policy_env)


def _forklab(*args: str) -> CliResult:
    return forklab_in_process({**os.environ, "FORKLAB_HOME": "/nonexistent-home"}, *args)


def test_forklab_keys_makes_one_owner_only_key_pair_and_prints_its_line(tmp_path: Path) -> None:
    home = tmp_path / "alice-home"
    first = _forklab("keys", "--name", "alice", "--home", str(home))
    assert first.returncode == 0, first.stderr
    path = personal_key_path(home)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    line = first.stdout.splitlines()[-1]
    assert line == f"alice {public_key_hex(read_private_key(path))}"
    assert "PRIVATE" not in first.stdout
    # stdout is the line to register alone (`forklab keys >> approvers`), the note on stderr
    assert first.stdout == line + "\n" and first.stderr.startswith(f"# made {path} (owner-only)")
    again = _forklab("keys", "--name", "alice", "--home", str(home))
    assert again.stdout.splitlines()[-1] == line  # kept, not replaced
    shown = _forklab("keys", "--name", "alice", "--home", str(home), "--json")
    assert json.loads(shown.stdout) == {
        "name": "alice",
        "public_key": line.split()[1],
        "key_file": str(path),
        "made": False,
    }
    (tmp_path / "approvers").write_text(line + "\n")
    assert read_approvers(tmp_path / "approvers")[0].name == "alice"
    bad = _forklab("keys", "--name", "al ice", "--home", str(home))
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1


def _own_key(home: Path) -> Ed25519PrivateKey:
    key = new_private_key()
    write_private_key(personal_key_path(home), key)
    return key


async def _start(
    lab: Lab, request: SignedRequest | None, requested_by: str, spec_id: str
) -> WorkflowHandle[ExperimentWorkflow, ExperimentResult]:
    spec = make_spec(episodes=12, id=spec_id)
    return await lab.client.start_workflow(
        ExperimentWorkflow.run,
        ExperimentInput(
            spec=spec,
            approver_public_key=public_key_hex(new_private_key()),  # the run key: useless here
            requested_by=requested_by,
            request=request,
            batch_episodes=12,
            rehearsal_episodes=0,
            workload_bundle=lab.ship(spec),
        ),
        id=workflow_id(spec.id),
        task_queue=lab.settings.task_queue,
        result_type=ExperimentResult,
    )


async def test_on_a_real_worker_only_another_registered_approver_approves(
    temporal_env: WorkflowEnvironment,
    cpu: Executor,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The compose deployment's policy on a real worker: alice starts (signed by
    ``forklab start``'s code from her home); she cannot approve her own plan, mallory's key
    under bob's name cannot, bob approves with ``forklab approve``'s code from his home; an
    unsigned start fails before approval with one sentence."""
    alice_home, bob_home = tmp_path / "alice", tmp_path / "bob"
    alice, bob = _own_key(alice_home), _own_key(bob_home)
    approvers = tmp_path / "approvers"
    approvers.write_text(f"alice {public_key_hex(alice)}\nbob {public_key_hex(bob)}\n")
    monkeypatch.setenv("FORKLAB_APPROVERS_FILE", str(approvers))
    monkeypatch.setenv("FORKLAB_REQUESTER_MAY_APPROVE", "0")
    settings = lab_settings(temporal_env, tmp_path / "worker-home")
    lab = Lab(client=temporal_env.client, settings=settings)
    async with build_worker(temporal_env.client, settings, cpu):
        request = signed_start(
            alice_home, workflow_id=workflow_id("sod"), experiment_id="sod", requested_by="alice"
        )
        assert request is not None
        handle = await _start(lab, request, "alice", "sod")
        view = await lab.wait_for(handle, Stage.awaiting_approval)
        assert view.approval.requester == "alice" and len(view.approval.approvers) == 2
        metadata = await handle.query("__temporal_workflow_metadata")
        assert (  # the Web UI's details say who may approve
            "- approval: pending by a registered approver (alice, bob); requested by alice, "
            "who may not approve it" in metadata.current_details
        )
        as_alice = settings.model_copy(update={"home": alice_home})
        as_bob = settings.model_copy(update={"home": bob_home})
        own = await approve(as_alice, "sod", "alice")
        assert not own.accepted and "may not approve their own plan" in own.reason
        view = await lab.status(handle)  # her valid signature used the nonce up
        forged = await lab.send(handle, "approve", signed(view, MALLORY, "bob"))
        assert forged.reason.startswith("bad signature")
        stranger = await lab.send(handle, "approve", signed(view, MALLORY, "mallory"))
        assert stranger.reason.startswith("mallory is not a registered approver")
        with pytest.raises(CliError, match="make one with `forklab keys`"):
            await approve(settings.model_copy(update={"home": tmp_path / "nobody"}), "sod", "x")
        accepted = await approve(as_bob, "sod", "bob")
        assert accepted.accepted and accepted.approver == "bob"
        result = await handle.result()
        assert result.status is Status.completed and result.approval.decided_by == "bob"

        unsigned = await _start(lab, None, "alice", "sod-unsigned")
        with pytest.raises(WorkflowFailureError) as failed:
            await unsigned.result()
        assert "keeps requesters from approving their own plans" in str(failed.value.cause)
        view = await lab.status(unsigned)
        assert view.status is Status.failed and view.plan is None
