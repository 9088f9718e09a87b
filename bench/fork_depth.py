"""Fork cost against depth: the time from calling ``fork`` to the completion of the fork's
first live step (the server's event time of that activity's completion), for a fork at
step N of a parent with N + 1 steps, N = 10, 1,000 and 10,000. The parent continues-as-new
every ``--can-every`` steps, so N = 1,000 and 10,000 end a run; ``--mid`` adds forks at
steps that do not (``N - 1``: the most steps one fork is served, ``--can-every`` - 1).

Where the cost could grow with N, and what keeps it flat: the run holding step N is found
from the first events of the runs after it (each run's memo records the chain's steps
before it), so no earlier history is read or counted; only the run holding N is read;
a fork at the last step of a run starts from the next run's recorded input (a checkpoint
at the boundary) and is served nothing. One cache exists: parsed runs that have closed,
kept by the CLI's ``AgentLab`` and by the worker's ``forklab.fetch_prefix`` (a closed run's
history never changes); it only helps forks served from inside a run. Each row prints
the median of ``--rounds`` forks with both caches emptied before each fork (uncached)
next to the median of as many forks with them filled (cached).
Goal: at most 1.5x from N = 10 to N = 10,000.

    python bench/fork_depth.py [--depths 10 1000 10000] [--mid] [--can-every 500] [--rounds 5]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from agent_bench import bench_env
from depth_workflow import DepthInput, DepthWorkflow, tick
from temporalio.client import Client
from temporalio.worker import Worker

from forklab.activities.runfork.fork_activities import ForkActivities
from forklab.activities.runfork.history_events import ClosedRuns
from forklab.activities.runfork.history_reads import locate_step, read_chain
from forklab.contracts.fork_request import ForkRequest
from forklab.contracts.runfork import INTERNAL_PREFIX, fork_task_queue
from forklab.experiments.runfork.policy import ToolPolicy
from forklab.workflows.runfork.interceptor import ForkInterceptor


@dataclass
class Row:
    n: int
    runs: int
    served: int
    histories_read: int
    first_events_read: int
    uncached: float
    cached: float


async def first_live_step_done(client: Client, workflow_id: str) -> float:
    """The wall-clock time the fork's first own activity completed (its runs in order)."""
    for run in await read_chain(client, workflow_id):
        handle = client.get_workflow_handle(workflow_id, run_id=run.run_id)
        scheduled: dict[int, str] = {}
        for e in (await handle.fetch_history()).events:
            if e.HasField("activity_task_scheduled_event_attributes"):
                attrs = e.activity_task_scheduled_event_attributes
                scheduled[e.event_id] = attrs.activity_type.name
            elif e.HasField("activity_task_completed_event_attributes"):
                kind = scheduled[e.activity_task_completed_event_attributes.scheduled_event_id]
                if not kind.startswith(INTERNAL_PREFIX):
                    return e.event_time.ToDatetime().timestamp()
    raise RuntimeError(f"fork {workflow_id} ran no live step")


async def main(depths: list[int], mid: bool, can_every: int, rounds: int) -> None:
    async with bench_env() as b:
        forks = ForkActivities(b.client, b.agent.home)  # trusts the key AgentLab signs with
        queue = b.agent.agent_task_queue
        # wired by hand (what ForkLabPlugin adds), to reach the fork activities' cache of
        # closed runs: the cold rounds empty it
        wiring = dict(
            workflows=[DepthWorkflow],
            activities=[tick, forks.verify_fork, forks.fetch_prefix, forks.step_decision],
            interceptors=[ForkInterceptor()],
            max_concurrent_activities=50,
        )
        async with (
            Worker(b.client, task_queue=queue, **wiring),  # type: ignore[arg-type]
            Worker(b.client, task_queue=fork_task_queue(queue), **wiring),  # type: ignore[arg-type]
        ):
            rows: list[Row] = []
            for n in depths:
                wid = f"depth-{n}-{uuid.uuid4().hex[:6]}"
                t0 = time.perf_counter()
                await b.client.execute_workflow(
                    DepthWorkflow.run,
                    DepthInput(steps=n + 1, can_every=can_every),
                    id=wid,
                    task_queue=queue,
                )
                print(f"parent of {n + 1} steps built in {time.perf_counter() - t0:.0f} s")
                runs = len(await read_chain(b.client, wid))
                for at in [n, n - 1] if mid and n > 1 else [n]:
                    located = await locate_step(b.client, wid, at)
                    times: dict[bool, list[float]] = {False: [], True: []}
                    served = 0
                    for cached in [False] * rounds + [True] * rounds:
                        if not cached:
                            b.lab.runs = b.lab.starter.runs = ClosedRuns()
                            forks.runs = ClosedRuns()
                        started = time.time()
                        fork = await b.lab.fork(
                            ForkRequest(run=wid, at_step=at, tool_policies={"*": ToolPolicy.live})
                        )
                        await fork.handle.result()
                        done = await first_live_step_done(b.client, fork.handle.id)
                        times[cached].append(done - started)
                        served = at - fork.receipt.base_step
                    rows.append(
                        Row(
                            at,
                            runs,
                            served,
                            located.histories_read,
                            located.starts_read,
                            statistics.median(times[False]),
                            statistics.median(times[True]),
                        )
                    )
            base = rows[0]
            print(
                "\nfork → first live step completed, ms (ratio to the first row); "
                f"continue-as-new every {can_every} steps"
            )
            head = ("N", "runs", "served", "read", "firsts", "uncached", "ratio", "cached", "ratio")
            print("{:>6} {:>5} {:>6} {:>5} {:>6} {:>8} {:>6} {:>7} {:>6}".format(*head))
            for r in rows:
                print(
                    f"{r.n:>6} {r.runs:>5} {r.served:>6} {r.histories_read:>5} "
                    f"{r.first_events_read:>6} {r.uncached * 1000:>8.0f} "
                    f"{r.uncached / base.uncached:>6.2f} {r.cached * 1000:>7.0f} "
                    f"{r.cached / base.cached:>6.2f}"
                )
            print(
                "read: histories read in full to locate N; firsts: runs known from their "
                "first event alone; served: steps served from the record"
            )


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--depths", type=int, nargs="+", default=[10, 1000, 10000])
    p.add_argument("--mid", action="store_true", help="also fork at N - 1 (inside a run)")
    p.add_argument("--can-every", type=int, default=500)
    p.add_argument("--rounds", type=int, default=5, help="forks per row and cache state")
    a = p.parse_args()
    asyncio.run(main(a.depths, a.mid, a.can_every, a.rounds))
