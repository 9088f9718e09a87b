"""Scale of an experiment over a cohort: history per workflow run and worker memory.

On one dev server: ``--runs`` runs of a cheap agent (``bench/cheap_agent.py``: a lookup,
then an answer whose success each fork draws by its own id; no model server) are
recorded, then one ``CohortExperimentWorkflow`` forks every run at its answer into 5
worlds × k = 3 (baseline, a model swap, an intervention descriptor, a placebo prompt
patch, a schema-drift positive control), ``--concurrency`` forks at a time, from the
signed approval to the report. The goal at full size (2,000 runs, 30,000 forks): every
run of the experiment's continue-as-new chain stays under 4,096 history events, and the
worker's memory stays bounded.

It prints the seconds of the rehearsal and of the forks, forks per minute, the chain's
runs and the largest history among them, the activity input sizes that grow with the
cohort (none should), and this process's resident memory (it hosts the experiment's
worker, the agent's worker and the clients) sampled every half second: before the
experiment and its peak. The load average is printed beside the timings.

    python bench/cohort_scale.py [--runs 200] [--concurrency 12] [--stop-when-decided]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from cheap_agent import ACTIVITIES, CheapAgentWorkflow
from cohort_throughput import experiment_worker, run_approved
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from forklab.activities.experiment.approval import ApprovalActivities
from forklab.activities.runfork.cohort_forks import CohortActivities
from forklab.activities.runfork.cohort_plans import CohortPlans
from forklab.activities.stores.artifacts import LocalArtifactStore
from forklab.activities.stores.fork_registry import ForkRegistry
from forklab.activities.stores.ledger import SqliteLedger
from forklab.contracts.search_attributes import EXPERIMENT, RUN_FORK_KEYS, STAGE
from forklab.experiments.cohort.spec import CohortExperimentSpec
from forklab.temporal import ForkLabPlugin
from forklab.workers.runfork.agent_config import AgentSettings
from forklab.workers.server import temporal_binary

K = 3
WORLDS = [
    {"name": "baseline", "role": "baseline"},
    {"name": "slow", "role": "treatment", "model": "slow"},
    {"name": "retry", "role": "treatment", "intervention": {"name": "retry", "params": {}}},
    {"name": "noop", "role": "placebo", "prompt_patch": {"text": "Be yourself."}},
    {
        "name": "drift",
        "role": "positive_control",
        "faults": [{"kind": "schema_drift", "rate": 1.0, "tools": ["answer"], "field": "ok"}],
    },
]


def rss_mib() -> float:
    """This process's resident memory now (Linux ``/proc``), in MiB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def _spec(ids: list[str], concurrency: int, stop: bool) -> CohortExperimentSpec:
    forks = len(ids) * len(WORLDS) * K
    return CohortExperimentSpec.model_validate(
        {
            "id": f"scale-{uuid.uuid4().hex[:8]}",
            "hypothesis": {"text": "scale"},
            "seed": 1,
            "cohort": {
                "workflow_ids": ids,
                "limit": len(ids),
                "fork_at": "tool:answer#1",
                "forks_per_world": K,
                "stop_when_decided": stop,
                "outcome": "forklab.experiments.cohort.scorers:final_score",
                "success_threshold": 1.0,
            },
            "tools": {"lookup": "live", "answer": "live"},
            "worlds": WORLDS,
            # world-seconds a fork: a minute each, so on a loaded machine (a fork here took
            # 1.5 s of world time at load 15-24) the default 36,000 s does not stop the
            # forks the scale is about
            "budget": {
                "max_forks": forks,
                "max_concurrent_forks": concurrency,
                "max_world_seconds": 60.0 * forks,
            },
            "approval": {"required": True, "expiry_minutes": 600},
        }
    )


async def _record(env: WorkflowEnvironment, queue: str, runs: int) -> list[str]:
    """``runs`` runs of the cheap agent, 50 at a time; their workflow ids."""
    ids: list[str] = []
    for start in range(0, runs, 50):
        handles = [
            await env.client.start_workflow(
                CheapAgentWorkflow.run,
                f"task-{i}",
                id=f"cheap-{i}-{uuid.uuid4().hex[:6]}",
                task_queue=queue,
            )
            for i in range(start, min(runs, start + 50))
        ]
        for h in handles:
            await h.result()
        ids += [h.id for h in handles]
    return ids


def _tenths(samples: list[tuple[float, float]]) -> str:
    """The largest resident memory in each tenth of the sampled time (from the recording
    of the runs to the report), in MiB; "-" for a tenth without a sample."""
    if not samples:
        return "-"
    end = samples[-1][0] or 1.0
    tenths: list[float | None] = [None] * 10
    for t, mib in samples:
        i = min(int(10 * t / end), 9)
        tenths[i] = max(tenths[i] or 0.0, mib)
    return ", ".join("-" if m is None else f"{m:.0f}" for m in tenths)


async def main(runs: int, concurrency: int, stop: bool) -> None:
    peak = [rss_mib()]
    #: (seconds since the start, MiB): whether memory levels off or keeps growing
    samples: list[tuple[float, float]] = []
    began = time.monotonic()
    sampling = True

    async def sample() -> None:
        while sampling:
            now = rss_mib()
            peak[0] = max(peak[0], now)
            samples.append((time.monotonic() - began, now))
            await asyncio.sleep(0.5)

    with tempfile.TemporaryDirectory(prefix="forklab-scale-") as tmp:
        home = Path(tmp)
        env = await WorkflowEnvironment.start_local(
            dev_server_existing_path=str(temporal_binary()),
            data_converter=pydantic_data_converter,
            search_attributes=[EXPERIMENT, STAGE, *RUN_FORK_KEYS],
            ui=False,
        )
        agent = AgentSettings(agent_task_queue=f"cheap-{uuid.uuid4().hex[:8]}", home=home)
        cohort = CohortActivities(
            env.client,
            ForkRegistry(agent.forks_path),
            home,
            SqliteLedger(home / "ledger.sqlite"),
            CohortPlans(LocalArtifactStore(home / "artifacts")),
            home / "reports",
        )
        approval = ApprovalActivities(home / "keys", allow_unapproved=False)
        queue = f"scale-cohort-{uuid.uuid4().hex[:8]}"
        sampler = asyncio.create_task(sample())
        try:
            async with (
                Worker(
                    env.client,
                    task_queue=agent.agent_task_queue,
                    workflows=[CheapAgentWorkflow],
                    activities=ACTIVITIES,
                    plugins=[ForkLabPlugin(agent.run_log_path)],
                ),
                experiment_worker(env.client, queue, cohort, approval, concurrency),
            ):
                began = time.perf_counter()
                ids = await _record(env, agent.agent_task_queue, runs)
                recorded_s = time.perf_counter() - began
                spec = _spec(ids, concurrency, stop)
                before_rss, load_before = rss_mib(), os.getloadavg()[0]
                began = time.perf_counter()
                elapsed, result = await run_approved(env.client, queue, spec)
                rehearsal_s = time.perf_counter() - began - elapsed
                load_after = os.getloadavg()[0]
                chain = [
                    e async for e in env.client.list_workflows(f"WorkflowId = 'forklab-{spec.id}'")
                ]
                histories: list[int] = []
                fork_inputs: list[int] = []
                carried: list[int] = []
                for e in chain:
                    history = await env.client.get_workflow_handle(
                        e.id, run_id=e.run_id
                    ).fetch_history()
                    histories.append(len(history.events))
                    fork_inputs += [
                        len(p.data)
                        for ev in history.events
                        if ev.activity_task_scheduled_event_attributes.activity_type.name
                        == "cohort_fork"
                        for p in ev.activity_task_scheduled_event_attributes.input.payloads
                    ]
                    for ev in history.events:
                        moved = ev.workflow_execution_continued_as_new_event_attributes
                        carried += [len(p.data) for p in moved.input.payloads]
        finally:
            sampling = False
            await sampler
            await env.shutdown()
    forks = runs * len(WORLDS) * K
    ran = result.forks_done
    print(f"# cohort scale: {runs} runs x {len(WORLDS)} worlds x k={K} = {forks} forks")
    print(
        f"machine: {platform.machine()}, {os.cpu_count()} cores, Python "
        f"{platform.python_version()}; load average {load_before:.1f} before the "
        f"experiment, {load_after:.1f} after"
    )
    print()
    print(f"- recorded {runs} runs in {recorded_s:.0f} s")
    print(f"- rehearsal (reading {runs} histories, planning): {rehearsal_s:.0f} s")
    print(
        f"- forks: {ran} run, {result.forks_saved} saved (majority decided), "
        f"{result.forks_missing} without an outcome, {elapsed:.0f} s from approval to report: "
        f"{ran / elapsed * 60:.0f} forks/min; status {result.status.value}"
    )
    print(
        f"- history: {len(histories)} runs in the continue-as-new chain, the largest "
        f"{max(histories)} events (goal < 4096)"
    )
    print(
        f"- inputs: a fork activity's input {min(fork_inputs)}-{max(fork_inputs)} bytes; "
        f"continue-as-new inputs {min(carried, default=0)}-{max(carried, default=0)} bytes"
    )
    print(
        f"- memory (this process): {before_rss:.0f} MiB before the experiment, "
        f"peak {peak[0]:.0f} MiB"
    )
    print(f"- memory by tenth of the run (the largest sample in each): {_tenths(samples)}")
    if result.report is not None:
        for line in result.report.worlds:
            print(f"  {line.world}: {line.verdict} ({line.rescues} rescued, {line.harms} harmed)")
    full = 2000 * len(WORLDS) * K
    print(
        f"- at this rate {full} forks would take {full / (ran / elapsed) / 60:.0f} min "
        f"(+ about {rehearsal_s / runs * 2000 / 60:.0f} min of rehearsal)"
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--concurrency", type=int, default=12)
    parser.add_argument("--stop-when-decided", action="store_true")
    args = parser.parse_args()
    asyncio.run(main(args.runs, args.concurrency, args.stop_when_decided))
