"""Team-fork latency: the time from asking for a team fork to every member's fork
started and released (``TeamForkStarter.start`` to the coordinator's result), for a relay
team of 3 and of 30 members (``relay_workflow.py``) forked at member 0's step 0, where
the cut forks every member. Beside it, in the same run and alternating with it: the same team
fork with the members named (``--members``: the team read in one round, where found from
member 0 a relay is read ring by ring), forking the members one by one
(``ForkStarter.fork`` each, one after another) and one single fork. Goal: a 3-member
team fork within 1.5x a single fork.

Each measurement starts on a settled worker: the forks the one before it started have
closed or sit idle, waiting (outside the time measured; the idle ones are then
terminated), so no figure carries the tail of another's work on the same two cores.

Beside the times, the CPU each measurement used, from its start to its end, of this process
(the bench, its worker, the SDK's threads) and of the dev server, every thread: what a team
fork needs of the machine's cores. On ``os.cpu_count()`` cores a team fork cannot take less
than its CPU over the cores, whatever its design; the "floor" columns are that, against the
single fork's time, for the team fork measured and for n single forks' CPU (one for each
member, with nothing to coordinate them).

Each figure is measured **cold** (every cache of closed runs emptied before each fork:
the bench's starter's, and the worker's, which the coordinator's member forks and the
forks' prefixes use) and **warm** (the caches hold the team's runs, as for every team fork
of a team after its first), the two alternating round by round.

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
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from agent_bench import bench_env
from relay_workflow import RelayInput, RelayWorkflow, relay_step
from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.worker import Worker

from forklab.activities.runfork.fork_activities import ForkActivities
from forklab.activities.runfork.fork_start import ForkStarter
from forklab.activities.runfork.history_events import ClosedRuns
from forklab.activities.runfork.team_fork_start import TeamForkRequest, TeamForkStarter
from forklab.activities.runfork.team_forks import TeamForkActivities
from forklab.activities.stores.fork_registry import ForkRegistry
from forklab.activities.stores.team_registry import TeamRegistry
from forklab.contracts.fork_request import ForkRequest
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


class Cpu:
    """CPU time of this process and its children (the dev server), every thread, in
    seconds: the sum of the threads' schedstat (nanoseconds on a CPU)."""

    def __init__(self) -> None:
        me = os.getpid()
        self.pids = [me, *(p for p in _pids() if _parent(p) == me)]

    def __call__(self) -> float:
        return sum(_threads_ns(pid) for pid in self.pids) / 1e9


def _pids() -> list[int]:
    return [int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit()]


def _parent(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat[stat.rindex(")") + 2 :].split()[1])


def _threads_ns(pid: int) -> int:
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            total += int((task / "schedstat").read_text().split()[0])
        except (OSError, ValueError, IndexError):  # a thread that has just ended
            continue
    return total


def measured(cpu: Cpu, began_cpu: float, began: float) -> tuple[float, float]:
    """The time and the CPU since ``began`` and ``began_cpu``."""
    took = time.perf_counter() - began
    return took, cpu() - began_cpu


async def settle(client: Client, fork_ids: list[str]) -> None:
    """Until the forks a measurement started are idle — closed, or waiting with no
    workflow task or activity pending (a member forked alone waits for a signal no one
    sends) — then the waiting ones terminated; outside the time measured."""

    async def idle(fork_id: str) -> None:
        handle = client.get_workflow_handle(fork_id)
        for _ in range(500):
            desc = await handle.describe()
            if desc.status is not WorkflowExecutionStatus.RUNNING:
                return
            raw = desc.raw_description
            if not raw.HasField("pending_workflow_task") and not raw.pending_activities:
                await handle.terminate("team-fork bench: measured")
                return
            await asyncio.sleep(0.02)

    await asyncio.gather(*(idle(f) for f in fork_ids))


async def team_fork(
    cpu: Cpu, client: Client, teams: TeamRegistry, member: str, members: list[str] | None = None
) -> tuple[float, float, float]:
    """The whole team fork, its first part (reading the team, the cut, the plan and
    starting the coordinator; the rest is the coordinator's: starts, record, release) and
    its CPU. With ``members`` the team is named (``--members``) and read in one round;
    without, it is found from ``member`` by its message edges, a round of reads for each
    ring of neighbours: a relay of n members is n rounds."""
    began_cpu = cpu()
    began = time.perf_counter()
    started = await TeamForkStarter(client, teams).start(
        TeamForkRequest(
            member=member, at_step=0, members=members, name=f"tf-{uuid.uuid4().hex[:8]}"
        )
    )
    planned = time.perf_counter() - began
    record = await started.result()
    took, used = measured(cpu, began_cpu, began)
    assert record.status is TeamForkStatus.forked, record.reason
    await settle(client, sorted(record.receipt.addresses.values()))
    return took, planned, used


async def one_by_one(starter: ForkStarter, ids: list[str], before: Callable[[], None]) -> float:
    """Each member forked after the other, the caches emptied (or not) before each fork."""
    took = 0.0
    forks = []
    for wid in ids:
        before()
        began = time.perf_counter()
        forks.append(await starter.fork(ForkRequest(run=wid, at_step=0)))
        took += time.perf_counter() - began
    await settle(starter.client, [f.handle.id for f in forks])
    return took


async def single(cpu: Cpu, starter: ForkStarter, wid: str) -> tuple[float, float]:
    """The single fork's time and CPU."""
    began_cpu = cpu()
    began = time.perf_counter()
    fork = await starter.fork(ForkRequest(run=wid, at_step=0))
    took, used = measured(cpu, began_cpu, began)
    await settle(starter.client, [fork.handle.id])
    return took, used


def cache_emptier(worker: Worker, starter: ForkStarter) -> Callable[[], None]:
    """Empties every cache of closed runs the forks measured here read through: the
    bench's starter's and those of the worker's fork and team-fork activities."""
    owners = [
        getattr(fn, "__self__", None) for fn in worker.config(active_config=True)["activities"]
    ]

    def empty() -> None:
        starter.runs = ClosedRuns()
        for owner in owners:
            if isinstance(owner, ForkActivities):
                owner.runs = ClosedRuns()
            elif isinstance(owner, TeamForkActivities):
                owner.starter.runs = ClosedRuns()

    return empty


def cpu_row(size: int, caches: str, times: dict[str, list[float]]) -> str:
    """The CPU of each measurement (means: CPU adds up) and the floors it sets on the
    machine's cores, against the single fork's median time."""
    cores = os.cpu_count() or 1
    s = statistics.median(times["single"])
    sc, tc, nc = (statistics.mean(times[k]) for k in ("single cpu", "team cpu", "named cpu"))
    return (
        f"{size:>7} {caches:>6} {sc * 1000:>9.0f}ms {sc / s:>8.2f} "
        f"{tc * 1000:>9.0f}ms {tc / statistics.median(times['team']):>8.2f} "
        f"{nc * 1000:>9.0f}ms {tc / cores / s:>13.2f}x {nc / cores / s:>13.2f}x "
        f"{size * sc / cores / s:>15.2f}x"
    )


CPU_HEADER = (
    f"{'members':>7} {'caches':>6} {'single CPU':>11} {'cores':>8} {'team CPU':>11} "
    f"{'cores':>8} {'named CPU':>11} {'team floor':>14} {'named floor':>14} "
    f"{'singles floor':>16}"
)


def row(size: int, caches: str, times: dict[str, list[float]]) -> str:
    s, t, p, n, e = (
        statistics.median(times[k]) for k in ("single", "team", "plan", "named", "each")
    )
    per_round = [tt / ss for tt, ss in zip(times["team"], times["single"], strict=True)]
    return (
        f"{size:>7} {caches:>6} {s * 1000:>10.0f}ms {t * 1000:>8.0f}ms {p * 1000:>10.0f}ms "
        f"{n * 1000:>9.0f}ms {e * 1000:>9.0f}ms {t / s:>11.2f}x "
        f"{min(per_round):>6.2f}-{max(per_round):<5.2f} {n / s:>11.2f}x {t / e:>11.2f}x "
        f"{os.getloadavg()[0]:>5.2f}"
    )


async def main(sizes: list[int], rounds: int) -> None:
    async with bench_env() as bench:
        cpu = Cpu()  # the dev server is a child of this process by now
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
        empty = cache_emptier(worker, starter)
        print(f"load before: {os.getloadavg()[0]:.2f} (1-min average, {os.cpu_count()} cores)")
        print(
            f"{'members':>7} {'caches':>6} {'single fork':>12} {'team fork':>10} "
            f"{'of it: plan':>12} {'named':>11} {'one by one':>11} {'team/single':>12} "
            f"{'per round':>12} {'named/single':>12} {'team/1-by-1':>12} {'load':>5}"
        )
        cpu_rows: list[str] = []
        async with worker:
            for size in sizes:
                ids = await record_relay(client, queue, size)
                await team_fork(cpu, client, teams, ids[0])  # warm the paths once
                keys = ("single", "team", "plan", "named", "each", "single cpu", "team cpu")
                times: dict[str, dict[str, list[float]]] = {
                    c: {k: [] for k in (*keys, "named cpu")} for c in ("cold", "warm")
                }
                for _ in range(rounds):  # alternating, in one run
                    for caches, before in (("cold", empty), ("warm", lambda: None)):
                        t = times[caches]
                        before()
                        took, used = await single(cpu, starter, ids[0])
                        t["single"].append(took)
                        t["single cpu"].append(used)
                        before()
                        whole, planned, used = await team_fork(cpu, client, teams, ids[0])
                        t["team"].append(whole)
                        t["plan"].append(planned)
                        t["team cpu"].append(used)
                        before()
                        whole, _, used = await team_fork(cpu, client, teams, ids[0], ids[1:])
                        t["named"].append(whole)
                        t["named cpu"].append(used)
                        before()
                        t["each"].append(await one_by_one(starter, ids, before))
                for caches in ("cold", "warm"):
                    print(row(size, caches, times[caches]), flush=True)
                    cpu_rows.append(cpu_row(size, caches, times[caches]))
        print(f"\nCPU of this process and the dev server, over {os.cpu_count()} cores")
        print(CPU_HEADER)
        print("\n".join(cpu_rows))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[3, 30])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    asyncio.run(main(args.sizes, args.rounds))
