"""The ForkLab worker: builds the backend, stores and activity classes, then runs."""

from __future__ import annotations

import asyncio
import ctypes
import os
import signal
import threading
import time
from collections.abc import Callable
from concurrent.futures import Executor, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from multiprocessing import get_context
from typing import Any

from temporalio.client import Client
from temporalio.common import WorkerDeploymentVersion
from temporalio.worker import Worker
from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner, SandboxRestrictions

from forklab.activities.experiment.approval import ApprovalActivities
from forklab.activities.experiment.evidence_log import EvidenceActivities
from forklab.activities.experiment.planning import PlanningActivities
from forklab.activities.experiment.readout import ReadoutActivities
from forklab.activities.experiment.records import RecordActivities
from forklab.activities.experiment.workload_bundles import WorkloadBundles
from forklab.activities.experiment.world_batches import SandboxActivities
from forklab.activities.runfork.cohort_code import CohortCode
from forklab.activities.runfork.cohort_forks import CohortActivities
from forklab.activities.runfork.cohort_plans import CohortPlans
from forklab.activities.sandbox.base import SandboxBackend
from forklab.activities.sandbox.cohort_code_calls import CohortCodeCalls
from forklab.activities.sandbox.shared_snapshots import SharedSnapshots
from forklab.activities.sandbox.workload_calls import WorkloadCalls
from forklab.activities.stores.fork_registry import ForkRegistry
from forklab.experiments.experiment.report.charts import load_renderer
from forklab.workers.client import connect, ensure_search_attributes
from forklab.workers.config import Settings
from forklab.workers.converter import strict_data_converter
from forklab.workers.experiment.approvers import approver_policy
from forklab.workers.experiment.providers import braintrust_config, readout_config, sandbox_backend
from forklab.workers.housekeeping import collect_until
from forklab.workers.runfork.agent_config import AgentSettings
from forklab.workers.stores import artifact_store, check_stores, ledger
from forklab.workers.versioning import announce, deployment_config, worker_version
from forklab.workflows.experiment.cohort_workflow import CohortExperimentWorkflow
from forklab.workflows.experiment.timeouts import HEARTBEAT_THROTTLE
from forklab.workflows.experiment.workflow import ExperimentWorkflow

WORKFLOWS: list[type] = [ExperimentWorkflow, CohortExperimentWorkflow]
#: Activities beyond the sandboxes themselves (planning, records, cleanup) a worker runs.
_SPARE_ACTIVITY_SLOTS = 4
#: Processes for analyses (each uses one core while it runs).
CPU_PROCESSES = 2
#: prctl option: the signal a process gets when its parent dies.
PR_SET_PDEATHSIG = 1


def _die_with_worker(worker: int) -> None:
    """Pool processes end when the worker dies (even by ``kill -9``): no orphan keeps a
    core and its memory after a crash. ``PR_SET_PDEATHSIG`` does it at once, but only once
    set (a worker killed while the process starts up is missed) and only for the thread
    that started the process; a watchdog checks that ``worker`` is still the parent."""
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)

    def watch() -> None:
        while os.getppid() == worker:
            time.sleep(0.5)
        os._exit(1)

    threading.Thread(target=watch, name="die-with-worker", daemon=True).start()


def _start_pool_process(worker: int) -> None:
    """Each pool process, as it starts: tied to ``worker``'s life, and ready to render a
    report (``load_renderer``: matplotlib and its fonts, ~0.3 s, otherwise paid in the
    first analysis)."""
    _die_with_worker(worker)
    load_renderer()


def cpu_pool() -> ProcessPoolExecutor:
    """Processes for the CPU-bound analysis: in a thread it would hold the GIL long enough
    to stall the worker's workflow tasks. Spawned, not forked: the worker process runs
    threads of its own."""
    return ProcessPoolExecutor(
        max_workers=CPU_PROCESSES,
        mp_context=get_context("spawn"),
        initializer=_start_pool_process,
        initargs=(os.getpid(),),
    )


class AnalysisPoolError(Exception):
    """The analysis pool's processes could not start (not a ``RuntimeError``, which the
    CLI reads as Temporal being out of reach)."""


async def start_pool(cpu: Executor) -> None:
    """Start the pool's processes now rather than at the first analysis, which otherwise
    waits ~1.5 s for a process to spawn, import the analysis stack and load matplotlib;
    and a pool that cannot start (a broken install) stops the worker before it takes
    work. One job per process makes each spawn; returns once one of them has run (the
    others finish starting in the background)."""
    loop = asyncio.get_running_loop()
    jobs = [loop.run_in_executor(cpu, os.getpid) for _ in range(CPU_PROCESSES)]
    done, _ = await asyncio.wait(jobs, return_when=asyncio.FIRST_COMPLETED)
    try:
        done.pop().result()
    except BrokenProcessPool:
        await asyncio.gather(*jobs, return_exceptions=True)  # every job failed with it
        raise AnalysisPoolError(
            "the worker's analysis processes could not start (their error is printed "
            "above); check that this environment imports ForkLab's dependencies, e.g. "
            "`python -c 'import matplotlib, scipy'`, or reinstall it"
        ) from None


def build_activities(
    settings: Settings, cpu: Executor, backend: SandboxBackend | None = None
) -> list[Callable[..., Any]]:
    """Every activity of the experiment workflow, bound to this worker's clients; the
    sandbox backend is the one ``FORKLAB_SANDBOX`` names unless one is given."""
    backend = backend or sandbox_backend(settings)
    store = artifact_store(settings)
    snapshots = SharedSnapshots(backend, store)
    calls = WorkloadCalls(settings.sandboxes_dir / "calls")
    bundles = WorkloadBundles(store, settings.home / "workload-bundles")
    planning = PlanningActivities(
        snapshots,
        settings.max_sandboxes,
        calls,
        bundles,
        store,
        allow_unconfined=settings.allow_unconfined_workloads,
    )
    approval = ApprovalActivities(settings.home, settings.allow_unapproved, approver_policy())
    sandboxes = SandboxActivities(backend, store, snapshots)
    records = RecordActivities(store, ledger(settings), cpu, calls, bundles)
    readout = ReadoutActivities(store, readout_config())
    evidence = EvidenceActivities(store, settings.home / "braintrust-outbox", braintrust_config())
    return [
        planning.rehearse,
        planning.resolve_snapshot,
        planning.check_capacity,
        planning.rehearsed_prefix,
        approval.issue_approval_key,
        approval.approval_policy,
        approval.approver_policy,
        sandboxes.run_prefixes,
        sandboxes.run_world_group,
        sandboxes.cleanup_sandboxes,
        records.save_progress,
        records.load_prefix_refs,
        records.analyse,
        records.decide_look,
        records.record_ledger,
        readout.write_readout,
        evidence.log_evidence,
    ]


def cohort_activities(client: Client, settings: Settings) -> list[Callable[..., Any]]:
    """The activities of experiments over cohorts: they read the cohort's histories and
    start forks through ``client``, record receipts in the agent home's registry, keep
    plans in the artifact store and rows in the shared ledger."""
    agent = AgentSettings.load(settings)
    code = CohortCode(
        WorkloadBundles(artifact_store(settings), settings.home / "workload-bundles"),
        CohortCodeCalls(settings.sandboxes_dir / "cohort-code"),
        allow_unconfined=settings.allow_unconfined_workloads,
    )
    cohort = CohortActivities(
        client,
        ForkRegistry(agent.forks_path),
        agent.home,
        ledger(settings),
        CohortPlans(artifact_store(settings)),
        settings.home / "cohort-reports",
        EvidenceActivities(
            artifact_store(settings), settings.home / "braintrust-outbox", braintrust_config()
        ),
        code,
    )
    return cohort.activities()


def workflow_runner() -> SandboxedWorkflowRunner:
    """Temporal's workflow sandbox, passing ``cryptography`` through: the approval gate
    verifies Ed25519 signatures in the workflow, and a Rust extension module cannot be
    imported a second time inside the sandbox (the process aborts). Verifying is pure and
    deterministic, so sharing the host's module is safe. ``numpy`` and ``scipy`` (the
    analysis, imported with the activities) are C extensions that cannot be loaded twice
    either; no workflow calls them."""
    restrictions = SandboxRestrictions.default.with_passthrough_modules(
        "cryptography", "numpy", "scipy"
    )
    return SandboxedWorkflowRunner(restrictions=restrictions)


def build_worker(
    client: Client,
    settings: Settings,
    cpu: Executor,
    backend: SandboxBackend | None = None,
    version: WorkerDeploymentVersion | None = None,
) -> Worker:
    """``version``: the worker deployment version it joins (``forklab.workers.versioning``).
    Whatever converter ``client`` has, the worker decodes with the strict one
    (``forklab.workers.converter``)."""
    config = client.config()
    config["data_converter"] = strict_data_converter
    client = Client(**config)
    return Worker(
        client,
        task_queue=settings.task_queue,
        deployment_config=deployment_config(version),
        workflows=WORKFLOWS,
        workflow_runner=workflow_runner(),
        activities=build_activities(settings, cpu, backend) + cohort_activities(client, settings),
        max_concurrent_activities=settings.max_sandboxes + _SPARE_ACTIVITY_SLOTS,
        # A dead attempt is charged up to its last recorded heartbeat plus this lag.
        max_heartbeat_throttle_interval=HEARTBEAT_THROTTLE,
        default_heartbeat_throttle_interval=HEARTBEAT_THROTTLE,
    )


async def run_worker(settings: Settings) -> None:
    """Run until SIGINT or SIGTERM, then finish gracefully. The stores and the providers'
    settings are checked and the analysis pool started first: a mistake there stops the
    worker before it takes work."""
    await asyncio.to_thread(check_stores, settings)
    readout_config()
    braintrust_config()
    version = worker_version(settings)
    backend = sandbox_backend(settings)
    with cpu_pool() as cpu:
        await start_pool(cpu)
        client = await connect(settings)
        await ensure_search_attributes(client, settings.namespace)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        async with build_worker(client, settings, cpu, backend, version):
            if version is not None:
                await announce(client, version, settings.promote)
            await collect_until(stop, settings, backend)
            await stop.wait()
