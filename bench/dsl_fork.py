"""A third-party workflow forked: the DSL interpreter of Temporal's samples-python
(``bench/dsl_workflow.py``) running N = 5, 50 and 500 activities of 50 ms in a row, on a
worker that differs from the sample's only by ``plugins=[ForkLabPlugin()]``.

Each round, taking turns: the workflow re-run from scratch (start → result), a fork at
step N - 1 through the in-process API (``AgentLab.fork``, fork call → the fork's result:
it inherits N - 1 steps and runs the last live), the same through the CLI
(``forklab fork --at-step N-1`` as a process, its start included, → the fork's result),
and an API fork at N/2 (half the steps run live). Goal: the fork at N - 1 at most 0.5x
the re-run at N = 50.

    python bench/dsl_fork.py [--sizes 5 50 500] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
import uuid
from collections import defaultdict
from collections.abc import Awaitable, Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from agent_bench import Bench, bench_env
from dsl_workflow import BenchDSLWorkflow, DSLActivities, sequence
from temporalio.worker import Worker

from forklab.contracts.fork_request import ForkRequest
from forklab.experiments.runfork.policy import ToolPolicy
from forklab.temporal import ForkLabPlugin
from forklab.workers.config import ENV

LIVE = {"*": ToolPolicy.live}
FORKLAB = Path(sys.executable).parent / "forklab"


async def size(
    b: Bench,
    queue: str,
    env: dict[str, str],
    n: int,
    rounds: int,
    times: dict[tuple[str, int], list[float]],
) -> None:
    """Records the parent of n activities and measures ``rounds`` of each kind."""
    inp = sequence(n)
    parent = f"dsl-{n}-{uuid.uuid4().hex[:6]}"
    expected = await b.client.execute_workflow(
        BenchDSLWorkflow.run, inp, id=parent, task_queue=queue
    )

    async def rerun() -> float:
        t0 = time.perf_counter()
        got = await b.client.execute_workflow(
            BenchDSLWorkflow.run,
            sequence(n),
            id=f"dsl-re-{uuid.uuid4().hex[:8]}",
            task_queue=queue,
        )
        assert got == expected
        return time.perf_counter() - t0

    async def api(at: int) -> float:
        t0 = time.perf_counter()
        fork = await b.lab.fork(ForkRequest(run=parent, at_step=at, tool_policies=LIVE))
        assert await fork.handle.result() == expected
        return time.perf_counter() - t0

    async def cli(at: int) -> float:
        name = f"{parent}--cli-{uuid.uuid4().hex[:6]}"
        t0 = time.perf_counter()
        proc = await asyncio.create_subprocess_exec(
            str(FORKLAB),
            "fork",
            parent,
            "--at-step",
            str(at),
            "--name",
            name,
            "--tool-policy",
            "*=live",
            env=env,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE,
        )
        _, err = await proc.communicate()
        assert proc.returncode == 0, err.decode()
        assert await b.client.get_workflow_handle(name).result() == expected
        return time.perf_counter() - t0

    sides: list[tuple[str, Callable[[], Awaitable[float]]]] = [
        ("re-run", rerun),
        ("api N-1", lambda: api(n - 1)),
        ("cli N-1", lambda: cli(n - 1)),
        ("api N/2", lambda: api(n // 2)),
    ]
    for r in range(rounds):
        for name, measure in sides[r % 4 :] + sides[: r % 4]:
            times[(name, n)].append(await measure())
    print(
        f"N = {n}: "
        + ", ".join(
            f"{k[0]} {statistics.median(v) * 1000:.0f} ms" for k, v in times.items() if k[1] == n
        ),
        flush=True,
    )


async def main(sizes: list[int], rounds: int) -> None:
    load0 = os.getloadavg()
    times: dict[tuple[str, int], list[float]] = defaultdict(list)
    async with bench_env() as b:
        acts = DSLActivities()
        queue = b.agent.agent_task_queue
        env = {
            **os.environ,
            ENV["address"]: b.client.service_client.config.target_host,
            ENV["home"]: str(b.home),
            "FORKLAB_AGENT_TASK_QUEUE": queue,
        }
        async with Worker(
            b.client,
            task_queue=queue,
            workflows=[BenchDSLWorkflow],
            activities=[acts.activity1, acts.activity2],
            plugins=[ForkLabPlugin(b.agent.run_log_path)],
        ):
            for n in sizes:
                await size(b, queue, env, n, rounds, times)
    load1 = os.getloadavg()
    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"\nmedian of {rounds}, ms (ratio to the re-run); load {load0[0]:.1f} → {load1[0]:.1f}")
    print("{:>5} {:>8} {:>14} {:>14} {:>14}".format("N", "re-run", "api N-1", "cli N-1", "api N/2"))
    for n in sizes:
        re = med[("re-run", n)]
        cells = [
            f"{med[(k, n)] * 1000:>6.0f} ({med[(k, n)] / re:.2f})"
            for k in ("api N-1", "cli N-1", "api N/2")
        ]
        print(f"{n:>5} {re * 1000:>8.0f} " + " ".join(f"{c:>14}" for c in cells))
    for k, v in sorted(times.items()):
        print(f"  {k[0]:>8} N={k[1]:<4} " + " ".join(f"{x * 1000:.0f}" for x in v))


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", type=int, nargs="+", default=[5, 50, 500])
    p.add_argument("--rounds", type=int, default=3)
    a = p.parse_args()
    asyncio.run(main(a.sizes, a.rounds))
