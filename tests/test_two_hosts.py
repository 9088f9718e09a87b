"""Two workers, two homes, one experiment: the state travels through PostgreSQL and an
S3-compatible store (moto), not through a shared folder.

Two real ``forklab worker`` processes with different FORKLAB_HOMEs share one task queue;
the operator starts and approves (signing with a key kept in its own home) from a
third home; one worker is killed with SIGKILL
mid-world; the object store and then PostgreSQL go down for a while during the run; and
``forklab report`` runs from a fourth home that has never seen any of it.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import time
import uuid
from pathlib import Path

import psycopg
from cryptography.hazmat.primitives import serialization
from helpers import forklab_in_process as forklab
from orchestration_lab import (
    Lab,
    WorkerProcesses,
    cli_env,
    lab_settings,
    make_spec,
    temporal_path,
)
from stores_lab import S3_ENV, Proxy, make_bucket, moto_server, postgres_database, s3_admin
from temporalio.testing import WorkflowEnvironment

from forklab.activities.experiment.approval_keys import key_path
from forklab.activities.sandbox.local import LocalSandboxBackend
from forklab.cli.experiment.rehearsal import rehearse
from forklab.workers.config import Settings
from forklab.workflows.experiment.messages import ExperimentResult, Stage, Status, workflow_id


def host_env(settings: Settings, home: Path, shared: dict[str, str]) -> dict[str, str]:
    return {**cli_env(settings), "FORKLAB_HOME": str(home), **S3_ENV, **shared}


def start_hosts(
    processes: WorkerProcesses, operator: Settings, shared: dict[str, str], folder: Path
) -> tuple[dict[str, Path], dict[str, subprocess.Popen[bytes]]]:
    """Workers on hosts ``a`` and ``b``: a home each under ``folder``, the shared stores."""
    homes = {name: folder / f"host-{name}" for name in ("a", "b")}
    workers = {
        name: processes.start(host_env(operator, home, shared), folder / f"worker-{name}.log")
        for name, home in homes.items()
    }
    return homes, workers


def private_key_bytes(path: Path) -> bytes:
    """The raw 32 secret bytes of the Ed25519 key in ``path``."""
    key = serialization.load_pem_private_key(path.read_bytes(), password=None)
    return key.private_bytes(
        serialization.Encoding.Raw, serialization.PrivateFormat.Raw, serialization.NoEncryption()
    )


def everything_stored(endpoint: str, bucket: str) -> bytes:
    client = s3_admin(endpoint)
    blobs = []
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket):
        for obj in page.get("Contents", []):
            blobs.append(client.get_object(Bucket=bucket, Key=obj["Key"])["Body"].read())
    return b"\n".join(blobs)


async def test_two_workers_with_two_homes_share_one_experiment(
    temporal_env: WorkflowEnvironment,
    tmp_path: Path,
    worker_processes: WorkerProcesses,
) -> None:
    bucket = f"forklab-{uuid.uuid4().hex[:8]}"
    with moto_server() as s3, postgres_database() as database:
        make_bucket(s3, bucket)
        s3_host, _, s3_port = s3.removeprefix("http://").partition(":")
        s3_proxy = Proxy(s3_host, int(s3_port))
        pg_proxy = Proxy("127.0.0.1", 5432)
        shared = {
            "FORKLAB_ARTIFACTS": f"s3://{bucket}/forklab",
            "FORKLAB_S3_ENDPOINT": f"http://{s3_proxy.address}",
            "FORKLAB_LEDGER": database.replace("127.0.0.1:5432", pg_proxy.address),
            "FORKLAB_STORE_RETRY_SECONDS": "60",
        }
        operator = lab_settings(temporal_env, tmp_path / "operator")
        homes, workers = start_hosts(worker_processes, operator, shared, tmp_path)
        lab = Lab(client=temporal_env.client, settings=operator)

        spec = make_spec(params={"sandbox_sleep": 0.15, "twin_sleep": 0.15})
        spec_file = tmp_path / "spec.json"
        spec_file.write_text(spec.model_dump_json())
        env = host_env(operator, operator.home, shared)
        started = await asyncio.to_thread(
            forklab, env, "start", str(spec_file), "--batch-episodes", "12",
            "--rehearsal-episodes", "4",
        )  # fmt: skip
        assert started.returncode == 0, started.stderr
        handle = temporal_env.client.get_workflow_handle(
            workflow_id(spec.id), result_type=ExperimentResult
        )
        view = await lab.wait_for(handle, Stage.awaiting_approval, timeout=120)
        # the approver key is on the operator's host; no worker ever holds it
        key_file = key_path(operator.home, handle.id, view.approval.run_id)
        secret = private_key_bytes(key_file)
        approved = await asyncio.to_thread(forklab, env, "approve", spec.id, "--approver", "kim")
        assert approved.returncode == 0, approved.stderr + approved.stdout

        # kill whichever worker is running a world group (two chunks fill the two slots:
        # each chunk's three worlds in one sandbox), mid-group
        backends = {n: LocalSandboxBackend(h / "sandboxes") for n, h in homes.items()}
        victim = None
        deadline = time.monotonic() + 120
        while victim is None:
            for name, backend in backends.items():
                group = {"forklab.experiment": spec.id, "forklab.world": "baseline+boost+placebo"}
                if backend.list(group):
                    victim = name
            assert time.monotonic() < deadline, "no world batch started"
            await asyncio.sleep(0.05)
        worker_processes.kill(workers[victim])
        survivor = "b" if victim == "a" else "a"

        # the object store goes away for a while: the surviving worker waits, then goes on
        s3_proxy.down()
        await asyncio.sleep(6)
        s3_proxy.up()

        # PostgreSQL goes away before the ledger is written; the experiment waits in
        # `recording` until it is back
        pg_proxy.down()
        view = await lab.wait_for(handle, Stage.recording, timeout=240)
        assert view.stage is Stage.recording
        await asyncio.sleep(5)
        assert (await lab.status(handle)).stage is Stage.recording  # still waiting
        pg_proxy.up()

        result = await asyncio.wait_for(handle.result(), timeout=240)
        assert result.status is Status.completed, result.error
        assert [(w.name, w.status, w.episodes) for w in result.worlds] == [
            (name, "completed", 24) for name in ("baseline", "boost", "placebo")
        ]  # every batch counted once
        history = await handle.fetch_history()
        batches = [
            e
            for e in history.events
            if e.HasField("activity_task_scheduled_event_attributes")
            and e.activity_task_scheduled_event_attributes.activity_type.name == "run_world_group"
        ]
        # 2 chunks, plus the killed group's new attempt (the workflow starts each attempt
        # as its own activity), which ran on the other worker
        assert len(batches) >= 3, len(batches)

        # a reader with a home of its own (no tokens, no artifacts, no ledger file)
        reader_home = tmp_path / "reader"
        reader = {**host_env(operator, reader_home, shared)}
        report = await asyncio.to_thread(forklab, reader, "report", spec.id, "--json")
        assert report.returncode == 0, report.stderr
        twin = rehearse(make_spec(id=spec.id, params={}))
        assert json.loads(report.stdout)["outcomes_digest"] == twin.outcomes_digest
        assert (reader_home / "reports" / spec.id / "report.html").is_file()

        # the ledger rows are in PostgreSQL
        with psycopg.connect(database) as conn:
            roots = conn.execute(
                "SELECT status, approval_json FROM ledger_experiments WHERE experiment_id = %s",
                (spec.id,),
            ).fetchall()
            worlds = conn.execute(
                "SELECT world, episodes, status FROM ledger_worlds WHERE experiment_id = %s "
                "ORDER BY world",
                (spec.id,),
            ).fetchall()
            every_row = conn.execute(
                "SELECT string_agg(e::text, ' ') FROM ledger_experiments e"
            ).fetchone()
        assert [r[0] for r in roots] == ["completed"]
        assert "kim" in roots[0][1]  # the approver is on record
        assert worlds == [(n, 24, "completed") for n in ("baseline", "boost", "placebo")]

        # no worker home holds an artifact, a ledger or a key; no shared store holds the key
        for home in homes.values():
            assert not (home / "artifacts").exists() and not (home / "ledger.sqlite").exists()
            assert not (home / "approval-keys").exists()
        stored = everything_stored(s3, bucket)
        assert secret not in stored and secret.hex().encode() not in stored
        assert key_file.read_bytes() not in stored
        assert every_row is not None and secret.hex() not in str(every_row[0])
        assert workers[survivor].poll() is None
        s3_proxy.down()
        pg_proxy.down()


async def test_a_key_issued_on_one_worker_approves_work_run_on_another(
    temporal_env: WorkflowEnvironment,
    tmp_path: Path,
    worker_processes: WorkerProcesses,
) -> None:
    """Started without a key (`temporal workflow start`), the run asks a worker to make the
    key pair: the private key lands in THAT worker's home. The issuing worker is then
    killed, the approver signs on its host, and the other worker, which never saw the key,
    takes the approval and runs everything after it."""
    bucket = f"forklab-{uuid.uuid4().hex[:8]}"
    with moto_server() as s3, postgres_database() as database:
        make_bucket(s3, bucket)
        shared = {
            "FORKLAB_ARTIFACTS": f"s3://{bucket}/forklab",
            "FORKLAB_S3_ENDPOINT": s3,
            "FORKLAB_LEDGER": database,
        }
        operator = lab_settings(temporal_env, tmp_path / "operator")
        homes, workers = start_hosts(worker_processes, operator, shared, tmp_path)
        lab = Lab(client=temporal_env.client, settings=operator)
        spec = make_spec(episodes=12)
        wid = workflow_id(spec.id)
        spec_file = tmp_path / "spec.json"
        spec_file.write_text(spec.model_dump_json())
        shipped = forklab(host_env(operator, operator.home, shared), "bundle", str(spec_file))
        assert shipped.returncode == 0, shipped.stderr
        body = {
            "spec": spec.model_dump(mode="json"),
            "requested_by": "cli",
            "batch_episodes": 6,
            "workload_bundle": shipped.stdout.strip(),
        }
        started = await asyncio.to_thread(
            subprocess.run,
            [temporal_path(), "--address", operator.address, "workflow", "start",
             "--type", "ForkLabExperiment", "--workflow-id", wid,
             "--task-queue", operator.task_queue, "--input", json.dumps(body)],
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        assert started.returncode == 0, started.stderr
        handle = temporal_env.client.get_workflow_handle(wid, result_type=ExperimentResult)
        view = await lab.wait_for(handle, Stage.awaiting_approval, timeout=120)
        holders = [
            name
            for name, home in homes.items()
            if key_path(home, wid, view.approval.run_id).is_file()
        ]
        assert len(holders) == 1, holders  # the key is on the issuing worker's host only
        issuer = holders[0]
        other = "b" if issuer == "a" else "a"
        worker_processes.kill(workers[issuer])  # gone before anything runs
        on_issuer = host_env(operator, homes[issuer], shared)  # the approver, on that host
        approved = await asyncio.to_thread(
            forklab, on_issuer, "approve", spec.id, "--approver", "kim"
        )
        assert approved.returncode == 0, approved.stderr + approved.stdout

        result = await asyncio.wait_for(handle.result(), timeout=240)
        assert result.status is Status.completed, result.error
        assert result.approval.decided_by == "kim"
        assert [(w.name, w.episodes) for w in result.worlds] == [
            (name, 12) for name in ("baseline", "boost", "placebo")
        ]
        assert not (homes[other] / "approval-keys").exists()
        assert workers[other].poll() is None
        reader = host_env(operator, tmp_path / "reader", shared)
        report = await asyncio.to_thread(forklab, reader, "report", spec.id, "--json")
        assert report.returncode == 0, report.stderr
        twin = rehearse(make_spec(id=spec.id, episodes=12))
        assert json.loads(report.stdout)["outcomes_digest"] == twin.outcomes_digest
