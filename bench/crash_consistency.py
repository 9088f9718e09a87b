"""Crash consistency: duplicate effects when the worker dies mid-call.

The 6-step run charges a customer once per step. Its worker is killed with
``os._exit(137)`` once, at step 1, at each crash point — before the call, after the
service applied the charge but before the ledger recorded it, after the completion was
recorded — then a fresh worker finishes the run (the lost attempt times out and is
retried). Three modes: ``naive`` (no ledger, no idempotency key), ``ledger`` (claims,
epochs, recorded results; no key downstream), ``ledger_query`` (the ledger plus the
service's status query per key in the ambiguous window). The payments service logs every
charge applied; duplicates = charges applied - 6.

    python bench/crash_consistency.py
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

MODES = ("naive", "ledger", "ledger_query")
POINTS = ("before_call", "after_apply", "after_complete")
WORKER_START_SECONDS = 120


async def worker(args: argparse.Namespace) -> None:
    from effects_workflow import EffectsWorkflow
    from temporalio.client import Client
    from temporalio.contrib.pydantic import pydantic_data_converter
    from temporalio.worker import Worker

    from forklab.activities.runfork.run_context import RunContextInterceptor
    from forklab.activities.stores.effect_ledger import SqliteEffectLedger
    from forklab.activities.stores.run_log import RunLog
    from forklab.agents.tools import EffectTools, LedgerMode
    from forklab.workflows.runfork.interceptor import ForkInterceptor

    client = await Client.connect(args.address, data_converter=pydantic_data_converter)
    home = Path(args.home)
    tools = EffectTools(
        args.effects,
        SqliteEffectLedger(home / "effects.sqlite"),
        LedgerMode(args.mode),
        crash_point=args.point,
        crash_flag=home / "crashed",
    )
    async with Worker(
        client,
        task_queue=args.queue,
        workflows=[EffectsWorkflow],
        activities=[tools.charge_customer],
        interceptors=[ForkInterceptor(), RunContextInterceptor(RunLog(home / "runlog.sqlite"))],
    ):
        (home / "ready").touch()
        await asyncio.Event().wait()


def _spawn(
    address: str, queue: str, effects: str, home: Path, mode: str, point: str
) -> subprocess.Popen[bytes]:
    (home / "ready").unlink(missing_ok=True)
    argv = [sys.executable, __file__, "--worker", "--address", address, "--queue", queue]
    argv += ["--effects", effects, "--home", str(home), "--mode", mode, "--point", point]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + WORKER_START_SECONDS
    while not (home / "ready").exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"the bench worker did not start (exit {proc.poll()})")
        time.sleep(0.1)
    return proc


def _charges(effects: str, customer: str) -> int:
    with urllib.request.urlopen(effects + "/effects/log", timeout=10) as r:
        log = json.loads(r.read())["effects"]
    return sum(1 for e in log if e["kind"] == "charge" and e["params"]["customer"] == customer)


async def main() -> None:
    from agent_bench import bench_env
    from effects_workflow import STEPS, EffectsInput, EffectsWorkflow

    async with bench_env() as b:
        address = b.env.client.service_client.config.target_host
        effects = b.agent.resolved_effects_url
        table: dict[tuple[str, str], int] = {}
        for mode in MODES:
            for point in POINTS:
                with tempfile.TemporaryDirectory(prefix="forklab-crash-") as tmp:
                    home = Path(tmp)
                    queue = f"crash-{uuid.uuid4().hex[:8]}"
                    customer = f"{mode}-{point}-{uuid.uuid4().hex[:6]}"
                    first = _spawn(address, queue, effects, home, mode, point)
                    handle = await b.client.start_workflow(
                        EffectsWorkflow.run,
                        EffectsInput(customer=customer),
                        id=customer,
                        task_queue=queue,
                    )
                    try:
                        code = await asyncio.to_thread(first.wait, 120)
                    except subprocess.TimeoutExpired:
                        first.kill()  # it never reached its crash point: leave nothing behind
                        raise
                    assert code == 137, f"the worker was to die with 137, got {code}"
                    second = _spawn(address, queue, effects, home, mode, point)
                    try:
                        await asyncio.wait_for(handle.result(), 300)
                    finally:
                        second.terminate()
                        second.wait(30)
                    table[(mode, point)] = _charges(effects, customer) - STEPS
                    print(f"  {mode:<13} {point:<15} duplicates {table[(mode, point)]}", flush=True)
        print()
        print(f"duplicate charges in a {STEPS}-step run, worker killed once (os._exit(137))")
        print(f"{'mode':<13} " + " ".join(f"{p:>15}" for p in POINTS))
        for mode in MODES:
            print(f"{mode:<13} " + " ".join(f"{table[(mode, p)]:>15}" for p in POINTS))


if __name__ == "__main__":
    p = argparse.ArgumentParser(description="crash consistency of side effects")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    for flag in ("--address", "--queue", "--effects", "--home", "--mode", "--point"):
        p.add_argument(flag, help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.worker:
        os.environ.setdefault("PYTHONUNBUFFERED", "1")
        asyncio.run(worker(a))
    else:
        asyncio.run(main())
