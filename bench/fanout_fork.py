"""A fan-out forked at every level: 8 calls in parallel per level and a merge, 10 levels
(90 steps; ``bench/fanout_workflow.py``), recorded on a worker with ``ForkLabPlugin`` and
forked through the in-process API in every level, inside it (after 4 of its branches)
and at its end (its merge), every later call live. For each fork: exact or not, its
result against the parent's, the calls it executed against the steps after its boundary
(anything more is an inherited call executed again), and the time from the fork call to
its result, beside a re-run from scratch (measured before and after the forks).

    python bench/fanout_fork.py [--levels 10] [--width 8]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from agent_bench import bench_env
from fanout_workflow import FanActivities, FanInput, FanOutWorkflow
from temporalio.worker import Worker

from forklab.contracts.fork_request import ForkRequest
from forklab.experiments.runfork.policy import ToolPolicy
from forklab.temporal import ForkLabPlugin

LIVE = {"*": ToolPolicy.live}


async def main(levels: int, width: int) -> None:
    load0 = os.getloadavg()
    async with bench_env() as b:
        acts = FanActivities(width)
        queue = b.agent.agent_task_queue
        inp = FanInput(levels=levels, width=width)
        async with Worker(
            b.client,
            task_queue=queue,
            workflows=[FanOutWorkflow],
            activities=[acts.branch, acts.merge],
            plugins=[ForkLabPlugin(b.agent.run_log_path)],
        ):

            async def rerun() -> tuple[str, float]:
                t0 = time.perf_counter()
                wid = f"fan-{uuid.uuid4().hex[:8]}"
                await b.client.execute_workflow(FanOutWorkflow.run, inp, id=wid, task_queue=queue)
                return wid, time.perf_counter() - t0

            parent, before = await rerun()
            expected = await b.client.get_workflow_handle(parent).result()
            total = len(await b.lab.steps(parent))
            steps = await b.lab.steps(parent)
            out_of_order = sum(s.call != s.index for s in steps)
            print(f"parent: {total} steps, {out_of_order} completed out of scheduling order")
            print(
                f"{'level':>5} {'at':>4} {'exact':>5} {'same':>5} {'ran':>4} {'owed':>4} "
                f"{'again':>5} {'ms':>6}"
            )
            again_total = 0
            per = width + 1
            for level in range(1, levels + 1):
                for at in (per * level - (width - width // 2) - 1, per * level):
                    t0 = time.perf_counter()
                    fork = await b.lab.fork(ForkRequest(run=parent, at_step=at, tool_policies=LIVE))
                    result = await fork.handle.result()
                    ms = (time.perf_counter() - t0) * 1000
                    ran = acts.executed[fork.handle.id]
                    again = ran - (total - at)
                    again_total += max(again, 0)
                    print(
                        f"{level:>5} {at:>4} {fork.receipt.boundary.value == 'exact':>5} "
                        f"{result == expected:>5} {ran:>4} {total - at:>4} {again:>5} {ms:>6.0f}"
                    )
            _, after = await rerun()
    load1 = os.getloadavg()
    print(
        f"re-run from scratch: {before * 1000:.0f} ms before, {after * 1000:.0f} ms after; "
        f"inherited calls executed again: {again_total}; load {load0[0]:.1f} → {load1[0]:.1f}"
    )


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--levels", type=int, default=10)
    p.add_argument("--width", type=int, default=8)
    a = p.parse_args()
    asyncio.run(main(a.levels, a.width))
