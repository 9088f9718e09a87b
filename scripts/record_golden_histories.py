"""Record the golden histories that ``tests/test_golden_replay.py`` replays offline.

Why: a replay test that replays a history recorded in the same run cannot see a
determinism break between versions (the code that records is the code that replays).
These histories are recorded once by this script and committed; every ``make test-fast``
replays them against the workflow code as it is now, so a change that would break the
runs already in flight on a server fails there.

Run ``make golden`` (this script) when a workflow changes on purpose — and then say in
the change that runs started before it cannot continue on the new worker (or version the
change with ``workflow.patched``, which keeps the old histories replaying). It starts its
own dev server, workers and agent services on free ports, like the tests, and writes
``tests/golden/<name>.json`` (``WorkflowHistory.to_json``) and ``tests/golden/index.json``
(which workflow each history belongs to and how it was made).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TESTS = ROOT / "tests"
GOLDEN = TESTS / "golden"
for folder in (ROOT, TESTS):
    if str(folder) not in sys.path:
        sys.path.insert(0, str(folder))

from agent_fixtures import running_agent_lab, running_services  # noqa: E402
from orchestration_lab import Lab, lab_settings, make_spec, start_dev_server  # noqa: E402
from temporalio.client import WorkflowHandle  # noqa: E402

from forklab.contracts.fork_request import ForkRequest  # noqa: E402
from forklab.workers.experiment.worker import build_worker, cpu_pool  # noqa: E402
from forklab.workflows.experiment.messages import Status  # noqa: E402


async def _save(
    name: str,
    handle: WorkflowHandle[object, object],
    index: dict[str, object],
    workflow: str,
    what: str,
) -> None:
    history = await handle.fetch_history()
    (GOLDEN / f"{name}.json").write_text(history.to_json() + "\n", encoding="utf-8")
    index[name] = {"workflow_id": handle.id, "workflow": workflow, "what": what}
    print(f"{name}: {len(history.events)} events ({handle.id})")


#: The kinds of history, in the order they are recorded.
KINDS = ("experiment", "sequential_experiment", "agent_run", "fork", "fork_of_fork")


async def record(home: Path, only: set[str]) -> dict[str, object]:
    """Record the kinds in ``only``; the three agent kinds are recorded together (each
    fork needs the run before it)."""
    index: dict[str, object] = {}
    env = await start_dev_server()
    try:
        # an experiment run: approval, prefixes, world batches, the analysis
        settings = lab_settings(env, home / "experiment")
        with cpu_pool() as cpu:
            async with build_worker(env.client, settings, cpu):
                lab = Lab(client=env.client, settings=settings)
                if "experiment" in only:
                    spec = make_spec(id="golden-experiment", episodes=12)
                    handle, key = await lab.start(spec, batch_episodes=6)
                    await lab.approve(handle, key)
                    result = await handle.result()
                    assert result.status is Status.completed, result.error
                    await _save(
                        "experiment",
                        handle,
                        index,
                        "ExperimentWorkflow",
                        "the Toy experiment of make_spec, 12 episodes in batches of 6, approved",
                    )
                if "sequential_experiment" in only:
                    spec = make_spec(
                        id="golden-sequential", episodes=120, analysis={"sequential": {"looks": 4}}
                    )
                    handle, key = await lab.start(spec, batch_episodes=15)
                    await lab.approve(handle, key)
                    result = await handle.result()
                    assert result.status is Status.completed, result.error
                    await _save(
                        "sequential_experiment",
                        handle,
                        index,
                        "ExperimentWorkflow",
                        "the Toy experiment of make_spec under a 4-look sequential design, 120 "
                        "episodes in waves of two chunks of 15: boost stops at look 1, the "
                        "placebo runs every wave",
                    )
        if not only & {"agent_run", "fork", "fork_of_fork"}:
            return index
        # an agent run, a fork of it and a fork of that fork
        with running_services() as services:
            async with running_agent_lab(env, services, home / "agents") as agents:
                parent = await agents.start_research(
                    run_id="golden-research", model="fast", fail_on_low_score=False
                )
                await parent.result()
                await _save(
                    "agent_run",
                    parent,
                    index,
                    "ResearchPipelineWorkflow",
                    "the research pipeline on the fast model (its report not failed)",
                )
                fork = await agents.lab.fork(
                    ForkRequest(run=parent.id, at_step=3, name="golden-research/slow", model="slow")
                )
                await fork.handle.result()
                await _save(
                    "fork",
                    fork.handle,
                    index,
                    "ResearchPipelineWorkflow",
                    "a fork of agent_run at step 3 on the slow model",
                )
                again = await agents.lab.fork(
                    ForkRequest(run=fork.handle.id, at_step=4, name="golden-research/slow/again")
                )
                await again.handle.result()
                await _save(
                    "fork_of_fork",
                    again.handle,
                    index,
                    "ResearchPipelineWorkflow",
                    "a fork of fork at step 4 (inheriting steps of both runs)",
                )
    finally:
        await env.shutdown()
    return index


def main() -> None:
    """``--only KIND ...`` records those kinds and keeps the others' histories: a new kind
    of history is added without recording the old ones anew (which would lose what they
    prove: that runs recorded by earlier code still replay)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="+", choices=KINDS, default=list(KINDS))
    only = set(parser.parse_args().only)
    GOLDEN.mkdir(exist_ok=True)
    path = GOLDEN / "index.json"
    kept = json.loads(path.read_text()) if path.is_file() else {}
    with tempfile.TemporaryDirectory() as home:
        index = kept | asyncio.run(record(Path(home), only))
    ordered = {k: index[k] for k in KINDS if k in index}
    path.write_text(json.dumps(ordered, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
