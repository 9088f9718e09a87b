"""Throughput of an experiment over a cohort, and its overhead per fork over bare forks.

On one dev server with the local stand-in model and payments service: ``--runs`` research
pipeline runs are recorded (model ``fast``, temperature 1), then the same number of forks
(runs × 3 worlds × k = 3: baseline, a model swap, a placebo prompt patch; forked at the
charge, charge blocked) is made twice, with the same concurrency (``--concurrency``):

- **bare**: ``AgentLab.fork`` (what ``forklab fork`` calls) and the fork's result, in
  this process, as a script over the run-fork API would;
- **experiment**: ``CohortExperimentWorkflow`` from the signed approval to its result,
  which also covers the per-fork activities, scoring, the ledger rows, cleanup, the
  analysis and the report.

The two alternate over ``--repeats`` rounds (bare first in odd rounds, the experiment
first in even ones), each round printed with the machine's load average beside it. It
prints forks per minute for both and the ratio experiment / bare per round and their
median (goal: at most 1.3).

    python bench/cohort_throughput.py [--runs 12] [--concurrency 8] [--repeats 4]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import platform
import statistics
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat
from temporalio.client import Client, WorkflowFailureError
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from forklab.activities.experiment.approval import ApprovalActivities
from forklab.activities.runfork.cohort_forks import CohortActivities
from forklab.activities.runfork.cohort_plans import CohortPlans
from forklab.activities.stores.artifacts import LocalArtifactStore
from forklab.activities.stores.fork_registry import ForkRegistry
from forklab.activities.stores.ledger import SqliteLedger
from forklab.agents.research import ResearchInput, ResearchPipelineWorkflow
from forklab.cli.runfork.agent_lab import AgentLab
from forklab.contracts.approval import approval_payload, sign
from forklab.contracts.fork_request import ForkRequest
from forklab.contracts.search_attributes import EXPERIMENT, RUN_FORK_KEYS, STAGE
from forklab.experiments.cohort.plan import CohortPlan, fork_policies
from forklab.experiments.cohort.spec import CohortExperimentSpec, ForkWorld
from forklab.experiments.runfork.policy import DEFAULT_KEY
from forklab.workers.config import Settings
from forklab.workers.experiment.worker import workflow_runner
from forklab.workers.runfork.agent_config import AgentSettings
from forklab.workers.runfork.agent_worker import build_agent_worker, connect_agents
from forklab.workers.runfork.effects_service import EffectsService
from forklab.workers.runfork.model_server import ModelServer
from forklab.workers.server import temporal_binary
from forklab.workflows.experiment.cohort_messages import (
    CohortInput,
    CohortResult,
    CohortStatusView,
)
from forklab.workflows.experiment.cohort_workflow import CohortExperimentWorkflow
from forklab.workflows.experiment.messages import Stage

K = 3
#: What a bare fork of a research run may name (``AgentLab.fork`` refuses a policy for a
#: tool the run never called): the experiment's policies for the default, the charge and
#: the model calls the pipeline makes.
RESEARCH_TOOLS = frozenset({DEFAULT_KEY, "charge_customer", "chat_model"})


def _spec(ids: list[str], concurrency: int) -> CohortExperimentSpec:
    return CohortExperimentSpec.model_validate(
        {
            "id": f"bench-{uuid.uuid4().hex[:8]}",
            "hypothesis": {"text": "throughput"},
            "seed": 1,
            "cohort": {
                "workflow_ids": ids,
                "limit": len(ids),
                "fork_at": "tool:charge_customer#1",
                "forks_per_world": K,
                "outcome": "forklab.experiments.cohort.scorers:final_score",
                "success_threshold": 1.0,
            },
            "worlds": [
                {"name": "baseline", "role": "baseline"},
                {"name": "slow", "role": "treatment", "model": "slow"},
                {"name": "noop", "role": "placebo", "prompt_patch": {"text": "Be yourself."}},
            ],
            "budget": {"max_forks": len(ids) * 3 * K, "max_concurrent_forks": concurrency},
        }
    )


async def _bare(lab: AgentLab, spec: CohortExperimentSpec, at: dict[str, int], n: int) -> float:
    """Every fork of the experiment made with ``AgentLab.fork``, ``n`` at a time."""
    gate = asyncio.Semaphore(n)
    plan_tools = {"charge_customer": "block"}

    plan = CohortPlan.model_validate({"runs": [], "excluded": [], "tools": plan_tools})

    async def one(run: str, world: ForkWorld, fork: int) -> None:
        async with gate:
            made = await lab.fork(
                ForkRequest(
                    run=run,
                    at_step=at[run],
                    name=f"bare-{uuid.uuid4().hex[:10]}",
                    model=world.model,
                    tool_policies={
                        t: p for t, p in fork_policies(plan, world).items() if t in RESEARCH_TOOLS
                    },
                )
            )
            with contextlib.suppress(WorkflowFailureError):
                await made.handle.result()

    began = time.perf_counter()
    await asyncio.gather(*(one(run, w, f) for run in at for w in spec.worlds for f in range(K)))
    return time.perf_counter() - began


def experiment_worker(
    client: Client,
    queue: str,
    cohort: CohortActivities,
    approval: ApprovalActivities,
    concurrency: int,
) -> Worker:
    """The experiment's worker: the cohort workflow and its activities, room for
    ``concurrency`` forks and the rest."""
    return Worker(
        client,
        task_queue=queue,
        workflows=[CohortExperimentWorkflow],
        activities=[
            *cohort.activities(),
            approval.approval_policy,
            approval.approver_policy,
            approval.issue_approval_key,
        ],
        workflow_runner=workflow_runner(),
        max_concurrent_activities=concurrency + 8,
    )


async def run_approved(
    client: Client, queue: str, spec: CohortExperimentSpec, **fields: Any
) -> tuple[float, CohortResult]:
    """Start ``spec``'s experiment, approve the plan it shows, wait for its result; the
    seconds from the approval to the result, and the result."""
    key = Ed25519PrivateKey.generate()
    public = key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw).hex()
    handle = await client.start_workflow(
        CohortExperimentWorkflow.run,
        CohortInput(spec=spec, approver_public_key=public, **fields),
        id=f"forklab-{spec.id}",
        task_queue=queue,
        result_type=CohortResult,
    )
    while True:
        view = await handle.query("status", result_type=CohortStatusView)
        if view.stage is Stage.awaiting_approval:
            break
        if view.stage is Stage.done:
            raise RuntimeError(f"the experiment ended before approval: {view.error}")
        await asyncio.sleep(0.05)
    assert view.fingerprint is not None
    payload = approval_payload(
        experiment_id=spec.id,
        workflow_id=handle.id,
        run_id=view.approval.run_id,
        fingerprint=view.fingerprint,
        nonce=view.approval.nonce,
        approver="bench",
    )
    began = time.perf_counter()
    await handle.execute_update(
        "approve",
        {
            "approver": "bench",
            "fingerprint": view.fingerprint,
            "nonce": view.approval.nonce,
            "signature": sign(key, payload),
        },
    )
    result = await handle.result()
    return time.perf_counter() - began, result


async def _experiment(client: Client, queue: str, spec: CohortExperimentSpec) -> float:
    elapsed, result = await run_approved(client, queue, spec)
    assert result.forks_done == len(spec.cohort.workflow_ids or []) * 3 * K, result
    return elapsed


async def main(runs: int, concurrency: int, repeats: int) -> None:
    with tempfile.TemporaryDirectory(prefix="forklab-bench-") as tmp:
        home = Path(tmp)
        env = await WorkflowEnvironment.start_local(
            dev_server_existing_path=str(temporal_binary()),
            data_converter=pydantic_data_converter,
            search_attributes=[EXPERIMENT, STAGE, *RUN_FORK_KEYS],
            ui=False,
        )
        model = ModelServer(("127.0.0.1", 0), seed=3)
        effects = EffectsService(("127.0.0.1", 0))
        for server in (model, effects):
            threading.Thread(target=server.serve_forever, daemon=True).start()
        agent = AgentSettings(
            model_base_url=f"http://127.0.0.1:{model.server_port}/v1",
            effects_url=f"http://127.0.0.1:{effects.server_port}",
            agent_task_queue=f"bench-{uuid.uuid4().hex[:8]}",
            home=home,
        )
        target = env.client.service_client.config.target_host
        settings = Settings.load({"address": target, "home": home}, env={})
        agents_client = await connect_agents(settings, agent)
        registry = ForkRegistry(agent.forks_path)
        cohort = CohortActivities(
            env.client,
            registry,
            home,
            SqliteLedger(home / "ledger.sqlite"),
            CohortPlans(LocalArtifactStore(home / "artifacts")),
            home / "reports",
        )
        approval = ApprovalActivities(home / "keys", allow_unapproved=False)
        queue = f"bench-cohort-{uuid.uuid4().hex[:8]}"
        try:
            async with (
                build_agent_worker(agents_client, agent),
                experiment_worker(env.client, queue, cohort, approval, concurrency),
            ):
                handles = [
                    await env.client.start_workflow(
                        ResearchPipelineWorkflow.run,
                        ResearchInput(topic=f"topic {i}", model="fast", temperature=1.0),
                        id=f"bench-run-{uuid.uuid4().hex[:8]}",
                        task_queue=agent.agent_task_queue,
                    )
                    for i in range(runs)
                ]
                for h in handles:
                    with contextlib.suppress(WorkflowFailureError):
                        await h.result()
                ids = [h.id for h in handles]
                lab = AgentLab(env.client, agent)
                at = {}
                for run in ids:
                    steps = await lab.steps(run)
                    at[run] = (
                        next(s.index for s in steps if s.activity_type == "charge_customer") - 1
                    )
                forks = runs * 3 * K
                rounds: list[tuple[float, float, float]] = []
                for i in range(repeats):
                    spec = _spec(ids, concurrency)
                    if i % 2 == 0:
                        bare = await _bare(lab, spec, at, concurrency)
                        experiment = await _experiment(env.client, queue, spec)
                    else:
                        experiment = await _experiment(env.client, queue, spec)
                        bare = await _bare(lab, spec, at, concurrency)
                    rounds.append((bare, experiment, os.getloadavg()[0]))
                    print(
                        f"round {i + 1}: bare {bare:.1f} s, experiment {experiment:.1f} s, "
                        f"ratio {experiment / bare:.2f}, load {rounds[-1][2]:.1f}",
                        flush=True,
                    )
        finally:
            model.shutdown()
            effects.shutdown()
            await env.shutdown()
    print(
        f"# cohort throughput: {runs} runs x 3 worlds x k={K} = {forks} forks, "
        f"{concurrency} at a time"
    )
    print(
        f"machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}"
    )
    print()
    print(
        "| round | first | load (1 min) | bare s (forks/min) | experiment s (forks/min) | ratio |"
    )
    print("|---:|---|---:|---:|---:|---:|")
    for i, (bare, experiment, load) in enumerate(rounds):
        print(
            f"| {i + 1} | {'bare' if i % 2 == 0 else 'experiment'} | {load:.1f} "
            f"| {bare:.1f} ({forks / bare * 60:.0f}) "
            f"| {experiment:.1f} ({forks / experiment * 60:.0f}) | {experiment / bare:.2f} |"
        )
    ratios = sorted(e / b for b, e, _ in rounds)
    print()
    print(f"median ratio {statistics.median(ratios):.2f} (spread {ratios[0]:.2f}-{ratios[-1]:.2f})")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=12)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=4)
    args = parser.parse_args()
    asyncio.run(main(args.runs, args.concurrency, args.repeats))
