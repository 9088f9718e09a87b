"""Fork cost against depth: the time from ``fork`` to the end of the first live step of a
fork at step N of a run with N + 1 steps, for N = 10, 1,000 and 10,000. The parent
continues-as-new every ``--can-every`` steps, so the fork starts from the run holding
step N and is served at most that many steps. Finding that run means counting the steps
of every earlier run: the first fork of a chain reads them all (cold); runs that
continued-as-new never change, so later forks take their counts from the fork registry
(warm). Both are printed. Goal: at most 1.5x from N = 10 to N = 10,000.

    python bench/fork_depth.py [--depths 10 1000 10000] [--can-every 500] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from agent_bench import bench_env
from depth_workflow import DepthInput, DepthWorkflow, tick
from temporalio.worker import Worker

from activities.run_history import ForkActivities, read_chain
from experiments.runfork.policy import ToolPolicy
from workflows.runfork.interceptor import ForkInterceptor


async def main(depths: list[int], can_every: int, rounds: int) -> None:
    async with bench_env() as b:
        forks = ForkActivities(b.client)
        async with Worker(
            b.client,
            task_queue=b.agent.agent_task_queue,
            workflows=[DepthWorkflow],
            activities=[tick, forks.fetch_prefix, forks.step_decision],
            interceptors=[ForkInterceptor()],
            max_concurrent_activities=50,
        ):
            rows = []
            for n in depths:
                wid = f"depth-{n}-{uuid.uuid4().hex[:6]}"
                t0 = time.perf_counter()
                await b.client.execute_workflow(
                    DepthWorkflow.run,
                    DepthInput(steps=n + 1, can_every=can_every),
                    id=wid,
                    task_queue=b.agent.agent_task_queue,
                )
                built = time.perf_counter() - t0
                chain = await read_chain(b.client, wid)
                source = next(r for r in chain if r.steps and r.steps[-1].index >= n)
                times = []
                for _ in range(rounds):  # the first fork reads every run (cold)
                    t2 = time.perf_counter()
                    fork = await b.lab.fork(wid, n, tool_policies={"*": ToolPolicy.live})
                    await fork.handle.result()
                    times.append(time.perf_counter() - t2)
                warm = statistics.median(times[1:]) if len(times) > 1 else times[0]
                rows.append((n, len(chain), n - source.base_step, times[0], warm, built))
            cold0, warm0 = rows[0][3], rows[0][4]
            print("fork → first live step done, in ms (ratio to N = the first depth)")
            head = ("N", "runs", "served", "cold", "ratio", "warm", "ratio")
            print("{:>6} {:>5} {:>6} {:>8} {:>6} {:>8} {:>6}".format(*head))
            for n, runs, served, cold, warm, built in rows:
                print(
                    f"{n:>6} {runs:>5} {served:>6} {cold * 1000:>8.0f} {cold / cold0:>6.2f} "
                    f"{warm * 1000:>8.0f} {warm / warm0:>6.2f}   (parent built in {built:.0f} s)"
                )


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--depths", type=int, nargs="+", default=[10, 1000, 10000])
    p.add_argument("--can-every", type=int, default=500)
    p.add_argument("--rounds", type=int, default=3)
    a = p.parse_args()
    asyncio.run(main(a.depths, a.can_every, a.rounds))
