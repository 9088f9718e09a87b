"""Fork fidelity at a temperature above 0: fork-at-N-then-continue against
re-run-from-scratch, each compared with the canonical run.

The research pipeline runs once with model ``slow`` at ``--temperature`` (the canonical
run). Then ``--runs`` forks at step N (tail live: ``*=live``) and as many re-runs of the
same input from scratch. For each we record whether the prefix state (the sections the
first N steps wrote) equals the canonical one, and the distance of the final state (the
number of JSON paths that differ, invoice excluded: it names a payment, not model output).

    python bench/fork_fidelity.py [--runs 20] [--temperature 1.0] [--at-step 3]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from agent_bench import bench_env

from forklab.agents.research import ResearchInput, ResearchPipelineWorkflow
from forklab.agents.research_score import PIPELINE
from forklab.contracts.fork_request import ForkRequest
from forklab.experiments.runfork.diff import diff_states
from forklab.experiments.runfork.policy import ToolPolicy
from forklab.workers.config import Settings
from forklab.workers.runfork.agent_worker import build_agent_worker, connect_agents


def _distance(a: dict[str, Any], b: dict[str, Any]) -> int:
    strip = lambda s: {k: v for k, v in s.items() if k != "invoice"}  # noqa: E731
    return len(diff_states(strip(a), strip(b)).paths)


def _prefix(state: dict[str, Any], n_sections: int) -> list[str]:
    return [state["sections"].get(name, "") for name in PIPELINE[:n_sections]]


async def main(runs: int, temperature: float, at_step: int) -> None:
    async with bench_env(model_seed=11) as b:
        address = b.env.client.service_client.config.target_host
        client = await connect_agents(Settings.load({"address": address}, env={}), b.agent)
        async with build_agent_worker(client, b.agent):
            inp = ResearchInput(
                topic="durable execution",
                model="slow",
                temperature=temperature,
                fail_on_low_score=False,
            )
            queue = b.agent.agent_task_queue
            canonical_id = f"canonical-{uuid.uuid4().hex[:6]}"
            canonical = await client.execute_workflow(
                ResearchPipelineWorkflow.run, inp, id=canonical_id, task_queue=queue
            )
            sections = at_step  # steps 1..3 are the first three sections' model calls
            results: dict[str, list[tuple[bool, int]]] = {"fork": [], "rerun": []}
            for i in range(runs):
                fork = await b.lab.fork(
                    ForkRequest(
                        run=canonical_id, at_step=at_step, tool_policies={"*": ToolPolicy.live}
                    )
                )
                state = await fork.handle.result()
                results["fork"].append(
                    (
                        _prefix(state, sections) == _prefix(canonical, sections),
                        _distance(canonical, state),
                    )
                )
                rerun = await client.execute_workflow(
                    ResearchPipelineWorkflow.run,
                    inp,
                    id=f"rerun-{i}-{uuid.uuid4().hex[:6]}",
                    task_queue=queue,
                )
                results["rerun"].append(
                    (
                        _prefix(rerun, sections) == _prefix(canonical, sections),
                        _distance(canonical, rerun),
                    )
                )
        print(f"temperature {temperature}, fork at step {at_step}, {runs} runs each")
        head = ("path", "prefix = canonical", "mean dist", "median")
        print("{:<7} {:>19} {:>10} {:>7}  distance histogram".format(*head))
        for name, rows in results.items():
            same = sum(1 for ok, _ in rows if ok)
            dists = [d for _, d in rows]
            hist = dict(sorted(Counter(dists).items()))
            print(
                f"{name:<7} {same:>12}/{len(rows):<6} {statistics.mean(dists):>10.2f} "
                f"{statistics.median(dists):>7.1f}  {hist}"
            )


if __name__ == "__main__":
    p = argparse.ArgumentParser(description="fork fidelity at temperature > 0")
    p.add_argument("--runs", type=int, default=20)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--at-step", type=int, default=3)
    a = p.parse_args()
    asyncio.run(main(a.runs, a.temperature, a.at_step))
