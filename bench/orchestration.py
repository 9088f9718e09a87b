"""The durable path's overhead: the same large experiment on the local twin and on Temporal.

Twin: ``forklab.cli.experiment.rehearsal.rehearse`` with both cores (every world in-process, then
the analysis). Durable: the ``ExperimentWorkflow`` from start to report on an embedded dev
server (SQLite file), approved as soon as its plan is ready, worlds in local sandboxes
two at a time — rehearsal sample, snapshot, capacity check, prefixes, world batches,
cleanup, analysis and ledger included. Both must give the same outcomes digest; the
figure is the ratio of their wall-clock times (target: at most 1.25).

    python bench/orchestration.py [--episodes 6000] [--batch-episodes 1000]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import WorkflowEnvironment

from forklab.activities.experiment.approval_keys import new_private_key, public_key_hex
from forklab.cli.experiment.experiment_commands import ship_spec_workload
from forklab.cli.experiment.rehearsal import rehearse
from forklab.cli.experiment.specfile import load_spec
from forklab.contracts.approval import approval_payload, sign
from forklab.experiments.experiment.spec import ExperimentSpec
from forklab.workers.config import Settings
from forklab.workers.experiment.worker import build_worker, cpu_pool, start_pool
from forklab.workers.server import temporal_binary
from forklab.workflows.experiment.messages import (
    DEFAULT_BATCH_EPISODES,
    DEFAULT_REHEARSAL_EPISODES,
    ApproveRequest,
    ExperimentInput,
    ExperimentResult,
    Stage,
    StatusView,
    workflow_id,
)
from forklab.workflows.experiment.search_attributes import EXPERIMENT, STAGE
from forklab.workflows.experiment.workflow import ExperimentWorkflow

ROOT = Path(__file__).resolve().parent.parent
TARGET = 1.25


def bench_spec(path: Path, episodes: int) -> ExperimentSpec:
    spec = load_spec(str(path))
    return ExperimentSpec.model_validate(
        {
            **spec.model_dump(mode="json"),
            "id": f"bench-{uuid.uuid4().hex[:8]}",
            "episodes": episodes,
            "budget": {"max_world_seconds": 1e6, "max_concurrent_sandboxes": 2},
        }
    )


async def durable(
    spec: ExperimentSpec, home: Path, batch_episodes: int, rehearsal_episodes: int
) -> tuple[ExperimentResult, dict[str, float]]:
    env = await WorkflowEnvironment.start_local(
        dev_server_existing_path=str(temporal_binary()),
        dev_server_database_filename=str(home / "temporal.db"),
        data_converter=pydantic_data_converter,
        search_attributes=[EXPERIMENT, STAGE],
    )
    settings = Settings.load(
        {"address": env.client.service_client.config.target_host, "home": home}, env={}
    )
    marks: dict[str, float] = {}
    try:
        with cpu_pool() as cpu:
            await start_pool(cpu)  # as ``forklab worker`` does before it polls
            async with build_worker(env.client, settings, cpu):
                key = new_private_key()
                start = time.perf_counter()
                shipped = ship_spec_workload(settings, spec)  # as forklab start does
                handle = await env.client.start_workflow(
                    ExperimentWorkflow.run,
                    ExperimentInput(
                        spec=spec,
                        approver_public_key=public_key_hex(key),
                        batch_episodes=batch_episodes,
                        rehearsal_episodes=rehearsal_episodes,
                        workload_bundle=shipped.digest if shipped else None,
                    ),
                    id=workflow_id(spec.id),
                    task_queue=settings.task_queue,
                )
                while True:
                    view: StatusView = await handle.query(ExperimentWorkflow.status)
                    if view.stage in (Stage.awaiting_approval, Stage.done):
                        break
                    await asyncio.sleep(0.05)
                assert view.plan is not None, view.error
                marks["planning (rehearsal sample, snapshot, capacity)"] = (
                    time.perf_counter() - start
                )
                gate, fingerprint = view.approval, view.plan.fingerprint
                payload = approval_payload(
                    experiment_id=spec.id,
                    workflow_id=gate.workflow_id,
                    run_id=gate.run_id,
                    fingerprint=fingerprint,
                    nonce=gate.nonce,
                    approver="bench",
                )
                request = ApproveRequest(
                    approver="bench",
                    fingerprint=fingerprint,
                    nonce=gate.nonce,
                    signature=sign(key, payload),
                )
                await handle.execute_update("approve", request)
                stage, since = Stage.awaiting_approval, time.perf_counter()
                result_task = asyncio.ensure_future(handle.result())
                while not result_task.done():  # wall-clock time per stage, from the status query
                    view = await handle.query(ExperimentWorkflow.status)
                    if view.stage is not stage:
                        now = time.perf_counter()
                        marks[f"stage {stage.value}"] = marks.get(f"stage {stage.value}", 0) + (
                            now - since
                        )
                        stage, since = view.stage, now
                    await asyncio.wait({result_task}, timeout=0.1)
                marks[f"stage {stage.value}"] = time.perf_counter() - since
                result = result_task.result()
                marks["total"] = time.perf_counter() - start
    finally:
        await env.shutdown()
    return result, marks


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--spec", type=Path, default=ROOT / "forklab" / "workloads" / "retry-cascade.yaml"
    )
    parser.add_argument("--episodes", type=int, default=6000)
    parser.add_argument("--batch-episodes", type=int, default=DEFAULT_BATCH_EPISODES)
    parser.add_argument("--rehearsal-episodes", type=int, default=DEFAULT_REHEARSAL_EPISODES)
    args = parser.parse_args()
    spec = bench_spec(args.spec, args.episodes)
    worlds = len(spec.worlds)
    print(f"{spec.workload.name}: {args.episodes} episodes x {worlds} worlds, 2 cores")

    start = time.perf_counter()
    twin = rehearse(spec, processes=2)
    twin_seconds = time.perf_counter() - start
    print(f"local twin (in-process, 2 processes, with analysis): {twin_seconds:8.2f} s")

    with tempfile.TemporaryDirectory(prefix="forklab-bench-") as tmp:
        result, marks = asyncio.run(
            durable(spec, Path(tmp), args.batch_episodes, args.rehearsal_episodes)
        )
    assert result.analysis is not None, result.error
    same = result.analysis.outcomes_digest == twin.outcomes_digest
    total = marks["total"]
    print(f"durable path (Temporal + sandboxes, start to report):  {total:8.2f} s")
    for name, seconds in marks.items():
        if name != "total":
            print(f"  of which {name}: {seconds:.2f} s")
    b = result.budget
    print(
        f"  {b.spent_world_seconds:.1f} world-seconds in sandboxes, peak "
        f"{b.peak_concurrent_sandboxes} at once, {result.runs} workflow run(s)"
    )
    print(f"outcomes digest identical: {'yes' if same else 'NO'}")
    ratio = total / twin_seconds
    verdict = "meets" if ratio <= TARGET else "misses"
    print(f"ratio durable / twin: {ratio:.2f}x ({verdict} the {TARGET}x target)")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
