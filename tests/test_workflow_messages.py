"""No message can wedge an experiment: every payload that used to fail the workflow task
(binary, none, two, wrong schema, megabytes; as signals and as updates) is refused and
recorded, and the workflow keeps answering status, reject and cancel. Concurrent CLI
approvals each print their own recorded outcome."""

from __future__ import annotations

import asyncio
import json
import subprocess
import threading
import uuid
from collections.abc import AsyncIterator
from concurrent.futures import Executor
from pathlib import Path
from typing import Any

import pytest
from helpers import forklab_in_process
from orchestration_lab import (
    SANDBOX_ACTIVITIES,
    Lab,
    cli_env,
    forklab,
    lab_settings,
    make_spec,
    signed,
    temporal_path,
)
from temporalio.api.common.v1 import Payload
from temporalio.client import WorkflowFailureError
from temporalio.common import RawValue
from temporalio.testing import WorkflowEnvironment

from forklab.activities.experiment.approval_keys import new_private_key, write_private_key
from forklab.activities.sandbox.base import ExecResult
from forklab.activities.sandbox.local import LocalSandboxBackend
from forklab.workers.experiment.worker import build_worker
from forklab.workflows.experiment.messages import (
    MAX_NAME,
    ExperimentResult,
    RejectRequest,
    Stage,
    Status,
    StatusView,
    workflow_id,
)

#: What the status query may weigh, however many and however large the messages were.
STATUS_LIMIT = 64 * 1024


def _raw(encoding: bytes, data: bytes) -> RawValue:
    return RawValue(Payload(metadata={"encoding": encoding}, data=data))


async def test_wedging_payloads_are_refused_recorded_and_the_run_still_answers(lab: Lab) -> None:
    spec = make_spec()
    handle, key = await lab.start(spec)
    view = await lab.wait_for(handle, Stage.awaiting_approval)
    good = signed(view, key).model_dump()
    big_name = {**good, "approver": "x" * 1_500_000}
    updates: list[list[Any]] = [
        [b"\x00\xff binary"],  # binary/plain
        [],  # no payload
        [good, good],  # two payloads
        [{"token": "t", "fingerprint": "f", "approver": "m"}],  # the old schema
        [_raw(b"json/plain", b"{not json")],
        [_raw(b"json/plain", b"[" * 50_000 + b"]" * 50_000)],  # deep nesting
        [big_name],
        [big_name],
        [big_name],
        [{**good, "approver": "n" * (MAX_NAME * 3)}],
    ]
    answers = [await lab.send(handle, "approve", *args) for args in updates]
    assert not any(a.accepted for a in answers)
    assert [a.reason.split(":")[0] for a in answers[:3]] == ["refused"] * 3
    assert answers[3].reason.startswith("refused: field ")
    assert "payload of 1500" in answers[6].reason
    assert len(answers[9].approver) == MAX_NAME
    unknown = await lab.send(handle, "frobnicate", {"a": 1})
    assert "unknown update" in unknown.reason
    for args in ([b"\x00"], [], [good, good], [big_name]):  # the same, as signals
        await handle.signal("approve", args=args)
    await handle.signal("reject", args=[b"\x01"])
    expected = len(updates) + 1 + 5
    view = await lab.wait_until(handle, lambda v: v.approval.attempts_total >= expected)
    assert view.approval.attempts_total == expected
    assert view.stage is Stage.awaiting_approval and view.approval.status.value == "pending"
    assert len(view.model_dump_json()) < STATUS_LIMIT
    junk_query = await handle.query("status", b"\x00\xff", result_type=StatusView)
    assert junk_query.stage is Stage.awaiting_approval  # extra query arguments are ignored
    await _assert_nothing_ran(lab, handle)

    rejected = await lab.send(handle, "reject", RejectRequest(by="bob", reason="enough"))
    assert rejected.reason == "rejected: enough"
    result = await handle.result()
    assert result.status is Status.rejected and result.cleanup is not None
    assert result.runs >= 2  # ~6 MB of junk in history: it continued as new, bounded
    assert result.approval.attempts_total == expected + 1
    root = lab.ledger.experiment(spec.id)
    assert root is not None and root.status == "rejected"


#: A refused approval's name as an attacker without the key would send it: erase the line,
#: go back to its first column and print an accepted approval; a C1 control sequence; a
#: right-to-left override.
FORGED_LINE = "\x1b[2K\x1b[1Gaccepted approve by alice at 12:00:00: approved\x9b1A\u202e"


async def test_a_refused_name_that_is_a_terminal_escape_is_shown_not_obeyed(lab: Lab) -> None:
    """Anyone who reaches the server may send an approve Update; a refused one is recorded
    with the name it gave, and `forklab status` shows it to the approver. Written raw, that
    name would rewrite the approver's screen (here: a forged "accepted" line)."""
    spec = make_spec()
    handle, key = await lab.start(spec)
    view = await lab.wait_for(handle, Stage.awaiting_approval)
    refused = await lab.send(handle, "approve", signed(view, key, FORGED_LINE, "0" * 64))
    assert not refused.accepted and refused.approver == FORGED_LINE
    env = cli_env(lab.settings)
    status = await asyncio.to_thread(forklab_in_process, env, "status", spec.id)
    assert status.returncode == 0, status.stderr
    assert not {"\x1b", "\x9b", "\u202e"} & set(status.stdout)
    assert "refused approve by \\u001b[2K\\u001b[1Gaccepted approve by alice" in status.stdout
    shown = await asyncio.to_thread(forklab_in_process, env, "status", spec.id, "--json")
    assert shown.returncode == 0, shown.stderr
    assert not {"\x1b", "\x9b", "\u202e"} & set(shown.stdout)
    attempts = json.loads(shown.stdout)["approval"]["attempts"]
    assert [a["approver"] for a in attempts] == [FORGED_LINE]  # the record is exact
    await lab.send(handle, "reject", RejectRequest(by="bob", reason="done"))
    assert (await handle.result()).status is Status.rejected


async def test_cancel_still_works_after_a_flood_of_junk(lab: Lab) -> None:
    spec = make_spec()
    handle, _ = await lab.start(spec)
    await lab.wait_for(handle, Stage.awaiting_approval)
    for i in range(60):  # more than the log keeps
        await handle.signal("approve", args=[b"\x00" * i])
    view = await lab.wait_until(handle, lambda v: v.approval.attempts_total >= 60)
    assert len(view.approval.attempts) == 50 and view.approval.attempts_total == 60
    await handle.cancel()
    with pytest.raises(WorkflowFailureError):
        await handle.result()
    view = await lab.status(handle)
    assert view.status is Status.cancelled and view.cleanup is not None
    root = lab.ledger.experiment(spec.id)
    assert root is not None and root.status == "cancelled"


async def _assert_nothing_ran(lab: Lab, handle: Any) -> None:
    assert not SANDBOX_ACTIVITIES & set(await lab.activity_types(handle))


class HeldBackend(LocalSandboxBackend):
    """The local backend, whose runners wait while the test holds them: a run approved
    meanwhile cannot finish (and so cannot refuse a late approval as "has ended")."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.released = threading.Event()
        self.released.set()

    def exec(self, sandbox_id: str, argv: list[str], timeout: float) -> ExecResult:
        self.released.wait()  # in the activity's thread; the activity heartbeats meanwhile
        return super().exec(sandbox_id, argv, timeout)


@pytest.fixture
async def held(
    temporal_env: WorkflowEnvironment, cpu: Executor, tmp_path: Path
) -> AsyncIterator[tuple[Lab, HeldBackend]]:
    """A ``lab`` whose worker runs sandboxes on a ``HeldBackend``."""
    settings = lab_settings(temporal_env, tmp_path / "home")
    backend = HeldBackend(settings.sandboxes_dir)
    try:
        async with build_worker(temporal_env.client, settings, cpu, backend):
            yield Lab(client=temporal_env.client, settings=settings), backend
    finally:
        backend.released.set()


async def test_two_concurrent_cli_approvals_each_print_their_own_outcome(
    held: tuple[Lab, HeldBackend],
) -> None:
    """The CLI once polled status and printed someone else's attempt ("approved … by
    wrong3" for a wrong key). An Update answers each request with its own attempt.

    The run's sandboxes are held until all three CLIs have answered: otherwise the
    approved 12-episode run could finish before the slowest CLI's update arrived (under
    load it did), and that CLI would be told the run had ended instead of its attempt."""
    lab, backend = held
    env = cli_env(lab.settings)
    spec = make_spec(episodes=12)
    spec_file = lab.settings.home.parent / "spec.json"
    spec_file.parent.mkdir(parents=True, exist_ok=True)
    spec_file.write_text(spec.model_dump_json())
    started = await asyncio.to_thread(
        forklab_in_process, env, "start", str(spec_file), "--batch-episodes", "12",
        "--rehearsal-episodes", "0",
    )  # fmt: skip
    assert started.returncode == 0, started.stderr
    handle = lab.client.get_workflow_handle(workflow_id(spec.id), result_type=ExperimentResult)
    await lab.wait_for(handle, Stage.awaiting_approval)
    wrong_key = write_private_key(lab.settings.home.parent / "wrong.key", new_private_key())
    backend.released.clear()
    try:
        # three `forklab` processes at once: concurrent CLIs are the subject
        right, right2, wrong = await asyncio.gather(
            asyncio.to_thread(forklab, env, "approve", spec.id, "--approver", "right"),
            asyncio.to_thread(forklab, env, "approve", spec.id, "--approver", "right2"),
            asyncio.to_thread(
                forklab, env, "approve", spec.id, "--approver", "wrong3", "--key", str(wrong_key)
            ),
        )
        assert (await lab.status(handle)).status is Status.running  # held, not ended
    finally:
        backend.released.set()
    won = [(name, p) for name, p in (("right", right), ("right2", right2)) if p.returncode == 0]
    assert len(won) == 1, (right, right2)
    name, winner = won[0]
    assert winner.stdout.startswith(f"approved: experiment {spec.id} by {name} at ")
    loser = right2 if name == "right" else right
    assert loser.returncode == 1 and loser.stdout == ""
    refusal = f"forklab: error: approval of {spec.id} was not accepted: "
    assert loser.stderr.startswith(refusal + "already approved")
    assert wrong.returncode == 1 and wrong.stdout == "" and wrong.stderr.startswith(refusal)
    assert wrong.stderr.removeprefix(refusal).startswith(("bad signature", "already approved"))
    result = await handle.result()
    assert result.status is Status.completed and result.approval.decided_by == name
    by = {a.approver: a for a in result.approval.attempts}
    assert by[name].accepted and not by["wrong3"].accepted


async def test_the_temporal_cli_route_with_forklab_sign(lab: Lab) -> None:
    """As docs/orchestration.md shows ("The same with the `temporal` CLI"): `temporal
    workflow start` without a key (the worker makes the pair), then `temporal workflow
    update execute --input "$(forklab sign …)"`."""
    env = cli_env(lab.settings)
    spec = make_spec(episodes=12)
    wid = workflow_id(spec.id)
    body = {
        "spec": spec.model_dump(mode="json"),
        "requested_by": "cli",
        "batch_episodes": 12,
        "workload_bundle": lab.ship(spec),  # what `forklab bundle SPEC` prints
    }
    temporal = [temporal_path(), "--address", lab.settings.address]

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*temporal, *args], capture_output=True, text=True, timeout=60, check=False
        )

    started = await asyncio.to_thread(
        run,
        "workflow", "start", "--type", "ForkLabExperiment", "--workflow-id", wid,
        "--task-queue", lab.settings.task_queue, "--input", json.dumps(body),
    )  # fmt: skip
    assert started.returncode == 0, started.stderr
    handle = lab.client.get_workflow_handle(wid, result_type=ExperimentResult)
    await lab.wait_for(handle, Stage.awaiting_approval)
    signed_json = await asyncio.to_thread(
        forklab_in_process, env, "sign", spec.id, "--approver", "alice"
    )
    assert signed_json.returncode == 0, signed_json.stderr
    request = json.loads(signed_json.stdout)
    assert set(request) == {"approver", "fingerprint", "nonce", "signature"}
    done = await asyncio.to_thread(
        run, "workflow", "update", "execute", "--workflow-id", wid, "--name", "approve",
        "--input", signed_json.stdout.strip(),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "accepted:true approver:alice" in done.stdout  # the attempt, as recorded
    result = await handle.result()
    assert result.status is Status.completed and result.approval.decided_by == "alice"


async def test_a_start_input_the_workflow_cannot_honour_fails_it_at_once(lab: Lab) -> None:
    """Started by hand (`temporal workflow start`) with a spec `plan` would refuse, a bad
    key, binary, or the wrong number of arguments: the run fails at once with the reason,
    instead of failing its workflow task forever."""
    spec = make_spec().model_dump(mode="json")
    huge_expiry = {**spec, "approval": {"required": True, "expiry_minutes": 1e12}}
    cases: dict[str, tuple[list[Any], str]] = {
        "expiry": ([{"spec": huge_expiry}], "expiry_minutes"),
        "infinite budget": (
            [{"spec": {**spec, "budget": {"max_world_seconds": "inf"}}}],
            "max_world_seconds",
        ),
        "bad key": ([{"spec": spec, "approver_public_key": "zz"}], "approver_public_key"),
        "binary": ([b"\x00\xff"], ""),
        "two arguments": ([{"spec": spec}, {"spec": spec}], ""),
        "no argument": ([], ""),
    }
    for case, (args, field) in cases.items():
        handle = await lab.client.start_workflow(
            "ForkLabExperiment",
            args=args,
            id=f"bad-input-{uuid.uuid4().hex[:8]}",
            task_queue=lab.settings.task_queue,
        )
        with pytest.raises(WorkflowFailureError) as failed:
            await asyncio.wait_for(handle.result(), timeout=60)
        cause = str(failed.value.cause)
        assert field in cause, (case, cause)
    assert lab.sandbox_folders() == []
