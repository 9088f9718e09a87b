"""Team-fork latency: the time from asking for a team fork to every member's fork
started and released (``TeamForkStarter.start`` to the coordinator's result), for a relay
team of 3 and of 30 members (``relay_workflow.py``) forked at member 0's step 0, where
the cut forks every member. Beside it, in the same run and alternating with it: forking
the members one by one (``ForkStarter.fork`` each, one after another) and one single
fork. Goal: a 3-member team fork within 1.5x a single fork.

    python bench/team_fork.py [--sizes 3 30] [--rounds 5]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from agent_bench import bench_env
from relay_workflow import RelayInput, RelayWorkflow, relay_step
from temporalio.client import Client
from temporalio.worker import Worker

from forklab.activities.runfork.fork_start import ForkStarter
from forklab.activities.runfork.team_fork_start import TeamForkRequest, TeamForkStarter
from forklab.activities.stores.fork_registry import ForkRegistry
from forklab.activities.stores.team_registry import TeamRegistry
from forklab.contracts.team_fork import TeamForkStatus
from forklab.workers.runfork.plugin import ForkLabPlugin


async def record_relay(client: Client, queue: str, size: int) -> list[str]:
    base = f"relay-{uuid.uuid4().hex[:6]}"
    ids = [f"{base}-{i}" for i in range(size)]
    handles = []
    for i in reversed(range(size)):  # the receivers first
        nxt = ids[i + 1] if i + 1 < size else None
        handles.append(
            await client.start_workflow(
                RelayWorkflow.run, RelayInput(index=i, next_member=nxt), id=ids[i], task_queue=queue
            )
        )
    for h in handles:
        await h.result()
    return ids


async def team_fork(client: Client, teams: TeamRegistry, member: str) -> tuple[float, float]:
    """The whole team fork, and its first part: reading the team, the cut, the plan and
    starting the coordinator (the rest is the coordinator's: starts, record, release)."""
    began = time.perf_counter()
    started = await TeamForkStarter(client, teams).start(
        TeamForkRequest(member=member, at_step=0, name=f"tf-{uuid.uuid4().hex[:8]}")
    )
    planned = time.perf_counter() - began
    record = await started.result()
    assert record.status is TeamForkStatus.forked, record.reason
    return time.perf_counter() - began, planned


async def one_by_one(starter: ForkStarter, ids: list[str]) -> float:
    began = time.perf_counter()
    for wid in ids:
        await starter.fork(wid, 0)
    return time.perf_counter() - began


async def single(starter: ForkStarter, wid: str) -> float:
    began = time.perf_counter()
    await starter.fork(wid, 0)
    return time.perf_counter() - began


async def main(sizes: list[int], rounds: int) -> None:
    async with bench_env() as bench:
        client, home = bench.client, bench.home
        queue = f"relay-{uuid.uuid4().hex[:6]}"
        worker = Worker(
            client,
            task_queue=queue,
            workflows=[RelayWorkflow],
            activities=[relay_step],
            plugins=[ForkLabPlugin(home / "runlog.sqlite", home=home)],
        )
        starter = ForkStarter(client, ForkRegistry(home / "forks.sqlite"), home)
        teams = TeamRegistry(home / "forks.sqlite")
        print(f"load before: {os.getloadavg()[0]:.2f} (1-min average, {os.cpu_count()} cores)")
        print(
            f"{'members':>7} {'single fork':>12} {'team fork':>10} {'of it: plan':>12} "
            f"{'one by one':>11} {'team/single':>12} {'team/1-by-1':>12} {'load':>5}"
        )
        async with worker:
            for size in sizes:
                ids = await record_relay(client, queue, size)
                await team_fork(client, teams, ids[0])  # warm the paths once
                t_single, t_team, t_plan, t_each = [], [], [], []
                for _ in range(rounds):  # alternating, in one run
                    t_single.append(await single(starter, ids[0]))
                    whole, planned = await team_fork(client, teams, ids[0])
                    t_team.append(whole)
                    t_plan.append(planned)
                    t_each.append(await one_by_one(starter, ids))
                s, t, p, e = (statistics.median(x) for x in (t_single, t_team, t_plan, t_each))
                print(
                    f"{size:>7} {s * 1000:>10.0f}ms {t * 1000:>8.0f}ms {p * 1000:>10.0f}ms "
                    f"{e * 1000:>9.0f}ms "
                    f"{t / s:>11.2f}x {t / e:>11.2f}x {os.getloadavg()[0]:>5.2f}"
                )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[3, 30])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    asyncio.run(main(args.sizes, args.rounds))
