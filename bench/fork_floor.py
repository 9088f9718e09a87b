"""The fork floor: the time from the fork call to the completion of the first new step,
for ForkLab, Temporal's Reset and DBOS ``fork_workflow``, at N = 10, 1,000 and 10,000
steps, measured in one run with the three taking turns in every round.

What each forks (each the way its users run long workflows):

- **ForkLab**: ``AgentLab.fork(ForkRequest(run=run, at_step=N))`` (the in-process API
  ``forklab fork`` calls) of ``bench/depth_workflow.py``'s chain of N + 1 steps that
  continues-as-new every 500 steps, so N = 1,000 and 10,000 end a run; also at N - 1, a
  fork *inside* a run (served 499 steps). Both parsed-run caches are emptied before
  every fork (``fork_depth.py`` shows the cached figures).
- **Temporal Reset**: ``ResetWorkflowExecution`` of the same workflow as one run of
  N + 1 steps (no continue-as-new, as a Temporal user forking a run with Reset has it),
  to the workflow task that scheduled step N + 1: the new run replays steps 1..N on the
  worker and schedules N + 1. Its workflow task timeout is 120 s (the default 10 s times
  out replaying 10,000 steps on this machine).
- **DBOS**: ``DBOS.fork_workflow(id, N + 1)`` of a DBOS workflow of N + 1 steps (its
  steps 1..N copied, N + 1 run), on PostgreSQL (``--dbos-url``; a database of its own is
  created) or SQLite.

Temporal's server times are used for ForkLab and Reset (the activity's completion
event), the step's own clock for DBOS (the step returns in this process).

    python bench/fork_floor.py [--depths 10 1000 10000] [--rounds 3] [--dbos-url URL]
                               [--no-dbos]

``--no-dbos`` leaves DBOS out (its column shows "—"), for an environment without the
``dbos`` package (it is not one of ForkLab's extras).
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
from datetime import timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from agent_bench import Bench, bench_env
from depth_workflow import DepthInput, DepthWorkflow, tick
from fork_depth import first_live_step_done
from temporalio.api.common.v1 import WorkflowExecution
from temporalio.api.enums.v1 import EventType
from temporalio.api.workflowservice.v1 import ResetWorkflowExecutionRequest
from temporalio.client import Client
from temporalio.worker import Worker

from forklab.activities.runfork.fork_activities import ForkActivities
from forklab.activities.runfork.history_events import ClosedRuns
from forklab.contracts.fork_request import ForkRequest
from forklab.contracts.runfork import fork_task_queue
from forklab.experiments.runfork.policy import ToolPolicy
from forklab.workflows.runfork.interceptor import ForkInterceptor

LIVE = {"*": ToolPolicy.live}
CAN_EVERY = 500


async def reset_point(client: Client, wid: str, run_id: str, n: int) -> int:
    """The workflow task that scheduled step ``n + 1`` (``tick(n + 1)``): its completed
    event, the one Reset re-decides from."""
    handle = client.get_workflow_handle(wid, run_id=run_id)
    last_completed = 0
    async for e in handle.fetch_history_events():
        if e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED:
            last_completed = e.event_id
        elif e.HasField("activity_task_scheduled_event_attributes"):
            arg = e.activity_task_scheduled_event_attributes.input.payloads[0].data
            if int(arg) == n + 1:
                return last_completed
    raise RuntimeError(f"{wid} never scheduled step {n + 1}")


async def first_step_after(client: Client, wid: str, run_id: str) -> float:
    """The server time the first activity of run ``run_id`` that was not copied from
    before its reset point completed."""
    handle = client.get_workflow_handle(wid, run_id=run_id)
    reset_at = None
    async for e in handle.fetch_history_events():
        if e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED and reset_at is None:
            reset_at = e.event_id  # the reset marks the re-decided task failed
        elif reset_at is not None and e.HasField("activity_task_completed_event_attributes"):
            return e.event_time.ToDatetime().timestamp()
    raise RuntimeError(f"reset run {run_id} ran no new step")


class DbosSide:
    """A DBOS workflow of n steps in this process, and the time each fork's first own
    step completed."""

    def __init__(self, url: str) -> None:
        from dbos import DBOS, SetWorkflowID

        self.dbos = DBOS
        self.with_id = SetWorkflowID
        self.done: dict[str, float] = {}
        done = self.done

        @DBOS.step()
        def dbos_tick(i: int) -> int:
            done.setdefault(DBOS.workflow_id or "", time.time())  # its first executed step
            return i

        @DBOS.workflow()
        def dbos_chain(n: int) -> int:
            for i in range(1, n + 1):
                dbos_tick(i)
            return n

        self.chain = dbos_chain
        DBOS(config={"name": "fork-floor", "system_database_url": url, "log_level": "WARNING"})
        DBOS.launch()

    def record(self, n: int) -> str:
        wid = f"dbos-{n}-{uuid.uuid4().hex[:6]}"
        with self.with_id(wid):
            self.chain(n)
        return wid

    def fork(self, wid: str, n: int) -> float:
        """Forks at step n (copies 1..n, runs n + 1 on); seconds to its first step."""
        started = time.time()
        handle = self.dbos.fork_workflow(wid, n + 1)
        handle.get_result()
        return self.done[handle.workflow_id] - started

    def close(self) -> None:
        self.dbos.destroy()


def dbos_url(arg: str | None, tmp: str) -> str:
    if arg:
        return arg
    return f"sqlite:///{tmp}/dbos.sqlite"


async def build(b: Bench, n: int, can_every: int, queue: str) -> str:
    wid = f"floor-{n}-{can_every}-{uuid.uuid4().hex[:6]}"
    t0 = time.perf_counter()
    await b.client.execute_workflow(
        DepthWorkflow.run,
        DepthInput(steps=n + 1, can_every=can_every),
        id=wid,
        task_queue=queue,
        task_timeout=timedelta(seconds=120),
    )
    print(f"  parent {wid}: {n + 1} steps in {time.perf_counter() - t0:.0f} s", flush=True)
    return wid


async def depth(
    b: Bench,
    forks: ForkActivities,
    dbos: DbosSide | None,
    n: int,
    rounds: int,
    times: dict[tuple[str, int], list[float]],
) -> None:
    """Builds the parents of N + 1 steps and measures ``rounds`` forks of each kind at N."""
    print(f"N = {n}", flush=True)
    queue = b.agent.agent_task_queue
    chain = await build(b, n, CAN_EVERY, queue)
    single = await build(b, n, 10**9, queue)
    single_run = (await b.client.get_workflow_handle(single).describe()).run_id
    point = await reset_point(b.client, single, single_run, n)
    dbos_wid = await asyncio.to_thread(dbos.record, n + 1) if dbos is not None else ""

    async def forklab(at: int) -> float:
        b.lab.runs = b.lab.starter.runs = ClosedRuns()
        forks.runs = ClosedRuns()
        started = time.time()
        fork = await b.lab.fork(ForkRequest(run=chain, at_step=at, tool_policies=LIVE))
        await fork.handle.result()
        return await first_live_step_done(b.client, fork.handle.id) - started

    async def reset() -> float:
        started = time.time()
        resp = await b.client.workflow_service.reset_workflow_execution(
            ResetWorkflowExecutionRequest(
                namespace=b.client.namespace,
                workflow_execution=WorkflowExecution(workflow_id=single, run_id=single_run),
                reason="fork floor bench",
                workflow_task_finish_event_id=point,
                request_id=str(uuid.uuid4()),
            )
        )
        await b.client.get_workflow_handle(single, run_id=resp.run_id).result()
        return await first_step_after(b.client, single, resp.run_id) - started

    async def dbos_fork() -> float:
        assert dbos is not None
        return await asyncio.to_thread(dbos.fork, dbos_wid, n)

    sides: list[tuple[str, Callable[[], Awaitable[float]]]] = [
        ("forklab", lambda: forklab(n)),
        ("reset", reset),
    ]
    if dbos is not None:
        sides.append(("dbos", dbos_fork))
    if n > 1:
        sides.insert(1, ("forklab inside", lambda: forklab(n - 1)))
    for r in range(rounds):
        turn = sides[r % len(sides) :] + sides[: r % len(sides)]
        for name, measure in turn:
            times[(name, n)].append(await measure())
        print(
            "  round",
            r + 1,
            {k: f"{v[-1] * 1000:.0f}" for k, v in times.items() if k[1] == n},
            flush=True,
        )


async def main(depths: list[int], rounds: int, url: str | None, with_dbos: bool) -> None:
    load0 = os.getloadavg()
    times: dict[tuple[str, int], list[float]] = defaultdict(list)
    async with bench_env() as b:
        forks = ForkActivities(b.client, b.agent.home)
        queue = b.agent.agent_task_queue
        wiring: dict[str, Any] = dict(
            workflows=[DepthWorkflow],
            activities=[tick, forks.verify_fork, forks.fetch_prefix, forks.step_decision],
            interceptors=[ForkInterceptor()],
            max_concurrent_activities=50,
        )
        dbos = DbosSide(dbos_url(url, str(b.home))) if with_dbos else None
        try:
            async with (
                Worker(b.client, task_queue=queue, **wiring),
                Worker(b.client, task_queue=fork_task_queue(queue), **wiring),
            ):
                for n in depths:
                    await depth(b, forks, dbos, n, rounds, times)
        finally:
            if dbos is not None:
                dbos.close()
    load1 = os.getloadavg()
    med = {k: statistics.median(v) for k, v in times.items()}
    print(
        f"\nfork call → first new step completed, median of {rounds} (ms); "
        f"load {load0[0]:.1f} → {load1[0]:.1f}"
    )
    head = ("N", "ForkLab", "inside", "Reset", "DBOS", "FL/Reset", "inside/end", "FL/FL@10")
    print("{:>6} {:>8} {:>8} {:>8} {:>8} {:>9} {:>10} {:>9}".format(*head))
    base = med[("forklab", depths[0])]
    for n in depths:
        fl, rs, db = med[("forklab", n)], med[("reset", n)], med.get(("dbos", n))
        inside = med.get(("forklab inside", n))
        shown_db = f"{db * 1000:.0f}" if db is not None else "—"
        print(
            f"{n:>6} {fl * 1000:>8.0f} {inside * 1000 if inside else 0:>8.0f} "
            f"{rs * 1000:>8.0f} {shown_db:>8} {fl / rs:>9.2f} "
            f"{(inside / fl) if inside else 0:>10.2f} {fl / base:>9.2f}"
        )
    for k, v in sorted(times.items()):
        print(f"  {k[0]:>15} N={k[1]:<6} " + " ".join(f"{x * 1000:.0f}" for x in v))


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--depths", type=int, nargs="+", default=[10, 1000, 10000])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--dbos-url", help="DBOS system database (default: SQLite in a temp dir)")
    p.add_argument("--no-dbos", action="store_true", help="leave DBOS out (not installed)")
    a = p.parse_args()
    asyncio.run(main(a.depths, a.rounds, a.dbos_url, not a.no_dbos))
